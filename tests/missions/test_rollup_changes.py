"""The milestone rollup after every kind of change that feeds it —
assertion create / update / delete, link / unlink, a run outcome, a feature delete, an
import — for each state it can reach. After every change the stored `validation_state`,
the state computed from the rows and the last `milestone:validation:updated` event agree."""

from __future__ import annotations

import pytest
from django.db import transaction

from missions.models import (
    AssertionScope,
    AssertionStatus,
    ContractAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
)
from missions.selectors import milestone_rollup
from missions.services import hierarchy
from missions.services.files import mission_import
from validation.models import RunScope, ValidatorRun
from validation.services.verdicts.complete import run_complete, run_error
from validation.verdict import AssertionVerdict, Verdict

pytestmark = pytest.mark.django_db


def assert_rollup(milestone: Milestone, expected: str) -> None:
    stored = Milestone.objects.get(pk=milestone.pk).validation_state
    computed = milestone_rollup(milestone_id=milestone.pk)["state"]
    last = (
        MissionEvent.objects.filter(type="milestone:validation:updated", payload__milestone=milestone.pk)
        .order_by("-seq")
        .first()
    )
    assert (stored, computed) == (expected, expected), f"{milestone.key}: stored {stored}, computed {computed}"
    assert last is not None and last.payload["state"] == expected, (
        f"{milestone.key}: last event {last and last.payload}"
    )


@pytest.fixture
def plan(owner):
    """Mission `roll`: m1 (slice s1: f1, f2) and m2 (slice s2: g1); no assertions yet."""
    mission = Mission.objects.create(key="roll", title="Roll", owner=owner, status="active", auto_fix=False)
    m1 = hierarchy.milestone_create(user=owner, mission=mission, key="m1", title="M1", order=1)
    m2 = hierarchy.milestone_create(user=owner, mission=mission, key="m2", title="M2", order=2)
    s1 = hierarchy.slice_create(user=owner, milestone=m1, key="s1", title="S1")
    s2 = hierarchy.slice_create(user=owner, milestone=m2, key="s2", title="S2")
    f1 = hierarchy.feature_create(user=owner, slice_=s1, key="f1", title="F1")
    f2 = hierarchy.feature_create(user=owner, slice_=s1, key="f2", title="F2")
    g1 = hierarchy.feature_create(user=owner, slice_=s2, key="g1", title="G1")
    return mission, m1, m2, f1, f2, g1


def create(owner, milestone, key, scope=AssertionScope.FEATURE) -> ContractAssertion:
    return hierarchy.assertion_create(
        user=owner, milestone=milestone, key=key, title=key, statement=f"{key} holds", scope=scope
    )


def set_status(status: str, *assertions: ContractAssertion) -> None:
    """Statuses are written by runs; tests that need a starting point set them directly
    and then let a real change trigger the recomputation."""
    ContractAssertion.objects.filter(pk__in=[a.pk for a in assertions]).update(status=status)
    for a in assertions:
        a.refresh_from_db()


# --- assertion create / update / delete --------------------------------------------------------


def test_assertion_create(owner, plan):
    mission, m1, m2, f1, f2, g1 = plan
    assert_rollup(m1, "not_started")
    a1 = create(owner, m1, "VAL-1")
    assert_rollup(m1, "needs_coverage")  # feature-scoped, linked to nothing
    hierarchy.assertion_link(user=owner, feature=f1, assertion=a1)
    assert_rollup(m1, "ready")
    create(owner, m1, "VAL-M", AssertionScope.MILESTONE)
    assert_rollup(m1, "ready")  # milestone-scoped: covered by the milestone run
    set_status(AssertionStatus.PASSED, *ContractAssertion.objects.filter(milestone=m1))
    create(owner, m1, "VAL-M2", AssertionScope.MILESTONE)
    assert_rollup(m1, "ready")  # a new pending assertion: no longer all passed
    set_status(AssertionStatus.FAILED, a1)
    create(owner, m1, "VAL-2")
    assert_rollup(m1, "failed")  # failed wins over needs_coverage
    assert_rollup(m2, "not_started")  # the other milestone is untouched


def test_assertion_update(owner, plan):
    mission, m1, m2, f1, f2, g1 = plan
    a1, a2 = create(owner, m1, "VAL-1"), create(owner, m1, "VAL-2")
    hierarchy.assertion_link(user=owner, feature=f1, assertion=a1)
    assert_rollup(m1, "needs_coverage")
    hierarchy.assertion_update(user=owner, assertion=a2, scope=AssertionScope.MILESTONE)
    assert_rollup(m1, "ready")
    hierarchy.assertion_update(user=owner, assertion=a2, statement="reworded")
    assert_rollup(m1, "ready")
    # moving an assertion recomputes both milestones
    hierarchy.assertion_update(user=owner, assertion=a2, milestone=m2)
    assert_rollup(m1, "ready")
    assert_rollup(m2, "ready")
    hierarchy.assertion_update(user=owner, assertion=a1, milestone=m2)
    assert_rollup(m1, "not_started")
    assert_rollup(m2, "ready")  # still linked to f1: covered wherever it lives
    set_status(AssertionStatus.BLOCKED, a1)
    hierarchy.assertion_update(user=owner, assertion=a1, title="renamed")
    assert_rollup(m2, "blocked")


def test_assertion_delete(owner, plan):
    mission, m1, m2, f1, f2, g1 = plan
    ok, bad, uncovered = create(owner, m1, "VAL-OK"), create(owner, m1, "VAL-BAD"), create(owner, m1, "VAL-U")
    for a in (ok, bad):
        hierarchy.assertion_link(user=owner, feature=f1, assertion=a)
    set_status(AssertionStatus.PASSED, ok)
    set_status(AssertionStatus.FAILED, bad)
    hierarchy.assertion_update(user=owner, assertion=ok, title="touch")
    assert_rollup(m1, "failed")
    hierarchy.assertion_delete(user=owner, assertion=bad)
    assert_rollup(m1, "needs_coverage")
    hierarchy.assertion_delete(user=owner, assertion=uncovered)
    assert_rollup(m1, "passed")
    hierarchy.assertion_delete(user=owner, assertion=ok)
    assert_rollup(m1, "not_started")


# --- link / unlink -----------------------------------------------------------------------------


def test_link_and_unlink(owner, plan):
    mission, m1, m2, f1, f2, g1 = plan
    a1, a2 = create(owner, m1, "VAL-1"), create(owner, m1, "VAL-2")
    assert_rollup(m1, "needs_coverage")
    hierarchy.assertion_link(user=owner, feature=f1, assertion=a1)
    assert_rollup(m1, "needs_coverage")  # VAL-2 still uncovered
    hierarchy.assertion_link(user=owner, feature=g1, assertion=a2)  # a feature of another milestone covers it
    assert_rollup(m1, "ready")
    set_status(AssertionStatus.PASSED, a1, a2)
    hierarchy.assertion_link(user=owner, feature=f2, assertion=a1)
    assert_rollup(m1, "passed")
    hierarchy.assertion_unlink(user=owner, feature=f2, assertion=a1)
    assert_rollup(m1, "passed")  # f1 still covers it
    hierarchy.assertion_unlink(user=owner, feature=f1, assertion=a1)
    assert_rollup(m1, "needs_coverage")  # passed once, but nothing covers it any more
    set_status(AssertionStatus.BLOCKED, a2)
    hierarchy.assertion_link(user=owner, feature=f1, assertion=a1)
    assert_rollup(m1, "blocked")


# --- a run outcome -----------------------------------------------------------------------------


def _run(feature: MissionFeature) -> ValidatorRun:
    from validation.services.run_input import feature_assertion_specs

    run = ValidatorRun.objects.create(
        mission=feature.mission,
        feature=feature,
        milestone=feature.slice.milestone,
        scope=RunScope.FEATURE,
        trigger="manual",
        revision="r1",
        validator="checks",
        assertions=feature_assertion_specs(feature),
    )  # frozen, as admission does
    MissionFeature.objects.filter(pk=feature.pk).update(loop_state="validating", last_run=run)
    return run


def _verdict(**by_key: str) -> Verdict:
    items = [
        AssertionVerdict(
            key=k, verdict=v, message=v, expected="x" if v == "fail" else "", actual="y" if v == "fail" else ""
        )
        for k, v in by_key.items()
    ]
    status = "blocked" if "blocked" in by_key.values() else "fail" if "fail" in by_key.values() else "pass"
    return Verdict(status=status, assertions=items, blocked_reason="no way to tell" if status == "blocked" else "")


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ({"VAL-1": "pass", "VAL-2": "pass"}, "passed"),
        ({"VAL-1": "pass", "VAL-2": "fail"}, "failed"),
        ({"VAL-1": "blocked", "VAL-2": "pass"}, "blocked"),
        ({"VAL-1": "blocked", "VAL-2": "fail"}, "failed"),
        ({"VAL-1": "pass"}, "ready"),  # VAL-2 not judged yet
    ],
)
def test_run_outcome(owner, plan, verdicts, expected):
    mission, m1, m2, f1, f2, g1 = plan
    for key in ("VAL-1", "VAL-2"):
        hierarchy.assertion_link(user=owner, feature=f1, assertion=create(owner, m1, key))
    assert_rollup(m1, "ready")
    assert run_complete(run_id=_run(f1).pk, verdict=_verdict(**verdicts))
    assert_rollup(m1, expected)


def test_run_outcomes_in_sequence_and_errors(owner, plan):
    mission, m1, m2, f1, f2, g1 = plan
    hierarchy.assertion_link(user=owner, feature=f1, assertion=create(owner, m1, "VAL-1"))
    hierarchy.assertion_link(user=owner, feature=g1, assertion=create(owner, m1, "VAL-2"))  # judged by a feature of m2
    run_complete(run_id=_run(f1).pk, verdict=_verdict(**{"VAL-1": "fail"}))
    assert_rollup(m1, "failed")
    run_error(run_id=_run(f1).pk, message="crashed", retry=False)
    assert_rollup(m1, "failed")  # an error judges nothing
    run_complete(run_id=_run(f1).pk, verdict=_verdict(**{"VAL-1": "pass"}))
    assert_rollup(m1, "ready")
    run_complete(run_id=_run(g1).pk, verdict=_verdict(**{"VAL-2": "pass"}))
    assert_rollup(m1, "passed")  # a run of m2's feature recomputes m1
    assert_rollup(m2, "not_started")


def test_milestone_run_outcome(owner, plan):
    mission, m1, m2, f1, f2, g1 = plan
    hierarchy.assertion_link(user=owner, feature=f1, assertion=create(owner, m1, "VAL-1"))
    create(owner, m1, "VAL-M", AssertionScope.MILESTONE)
    set_status(AssertionStatus.PASSED, *ContractAssertion.objects.filter(milestone=m1))
    hierarchy.assertion_update(user=owner, assertion=ContractAssertion.objects.get(key="VAL-M"), title="touch")
    assert_rollup(m1, "passed")
    run = ValidatorRun.objects.create(
        mission=mission, milestone=m1, scope=RunScope.MILESTONE, trigger="milestone", revision="r2", validator="checks"
    )
    assert run_complete(run_id=run.pk, verdict=_verdict(**{"VAL-1": "pass", "VAL-M": "fail"}))
    assert_rollup(m1, "failed")


# --- feature delete ----------------------------------------------------------------------------


def test_feature_delete(owner, plan, api):
    mission, m1, m2, f1, f2, g1 = plan
    shared, own, other = create(owner, m1, "VAL-S"), create(owner, m1, "VAL-O"), create(owner, m2, "VAL-G")
    for f, a in ((f1, shared), (f2, shared), (f1, own), (g1, own), (g1, other)):
        hierarchy.assertion_link(user=owner, feature=f, assertion=a)
    assert_rollup(m1, "ready")
    assert_rollup(m2, "ready")
    hierarchy.feature_delete(user=owner, feature=f2)
    assert_rollup(m1, "ready")  # f1 still covers VAL-S
    assert api(owner).delete(f"/api/features/{g1.pk}/").status_code == 204
    assert_rollup(m1, "ready")  # f1 covers VAL-O
    assert_rollup(m2, "needs_coverage")  # g1 was VAL-G's only feature
    hierarchy.feature_delete(user=owner, feature=MissionFeature.objects.get(pk=f1.pk))
    assert_rollup(m1, "needs_coverage")


def test_slice_and_milestone_delete(owner, plan):
    mission, m1, m2, f1, f2, g1 = plan
    a1 = create(owner, m1, "VAL-1")
    hierarchy.assertion_link(user=owner, feature=g1, assertion=a1)  # covered from m2
    assert_rollup(m1, "ready")
    hierarchy.milestone_delete(user=owner, milestone=m2)
    assert_rollup(m1, "needs_coverage")
    hierarchy.assertion_link(user=owner, feature=f1, assertion=a1)
    assert_rollup(m1, "ready")
    hierarchy.slice_delete(user=owner, slice_=Slice.objects.get(key="s1", mission=mission))
    assert_rollup(m1, "needs_coverage")


# --- import ------------------------------------------------------------------------------------


def _document(links: dict[str, list[str]]) -> dict:
    return {
        "mission": {"key": "imported", "title": "Imported"},
        "milestones": [
            {
                "key": "m1",
                "title": "M1",
                "assertions": [
                    {"key": "VAL-1", "title": "one", "statement": "one holds"},
                    {"key": "VAL-2", "title": "two", "statement": "two holds"},
                ],
                "slices": [
                    {
                        "key": "s1",
                        "title": "S1",
                        "features": [
                            {"key": "f1", "title": "F1", "assertions": links.get("f1", [])},
                            {"key": "f2", "title": "F2", "assertions": links.get("f2", [])},
                        ],
                    }
                ],
            },
            {
                "key": "m2",
                "title": "M2",
                "assertions": [
                    {"key": "VAL-M", "title": "whole", "statement": "all holds", "scope": "milestone"},
                ],
            },
            {"key": "m3", "title": "M3"},
        ],
    }


def test_import(owner):
    mission, changed = mission_import(document=_document({"f1": ["VAL-1"]}), user=owner)
    m1, m2, m3 = (Milestone.objects.get(mission=mission, key=k) for k in ("m1", "m2", "m3"))
    assert_rollup(m1, "needs_coverage")
    assert_rollup(m2, "ready")
    assert_rollup(m3, "not_started")
    mission_import(document=_document({"f1": ["VAL-1"], "f2": ["VAL-2"]}), user=owner)
    assert_rollup(m1, "ready")
    set_status(AssertionStatus.PASSED, *ContractAssertion.objects.filter(milestone=m1))
    mission_import(document=_document({"f1": ["VAL-1", "VAL-2"]}), user=owner)  # f2 unlinked, f1 covers both
    assert_rollup(m1, "passed")
    mission_import(document=_document({"f2": ["VAL-2"]}), user=owner)
    assert_rollup(m1, "needs_coverage")
    events = MissionEvent.objects.filter(type="milestone:validation:updated").count()
    _, changed = mission_import(document=_document({"f2": ["VAL-2"]}), user=owner)
    assert not changed and MissionEvent.objects.filter(type="milestone:validation:updated").count() == events


def test_an_edit_does_not_overwrite_a_status_a_run_wrote_meanwhile(owner, plan):
    """An API edit loads the assertion, a run records its verdict, the edit saves: the
    verdict must survive (the edit changes the fields it was given, nothing else)."""
    mission, m1, m2, f1, f2, g1 = plan
    a1 = create(owner, m1, "VAL-1")
    hierarchy.assertion_link(user=owner, feature=f1, assertion=a1)
    loaded = ContractAssertion.objects.get(pk=a1.pk)  # the edit request loads the row...
    run_complete(run_id=_run(f1).pk, verdict=_verdict(**{"VAL-1": "fail"}))  # ...a worker judges it...
    assert_rollup(m1, "failed")
    hierarchy.assertion_update(user=owner, assertion=loaded, title="clearer title")  # ...the edit saves
    assert ContractAssertion.objects.get(pk=a1.pk).status == "failed"
    assert_rollup(m1, "failed")


def test_a_feature_edit_does_not_overwrite_a_loop_state_written_meanwhile(owner, plan):
    mission, m1, m2, f1, f2, g1 = plan
    hierarchy.assertion_link(user=owner, feature=f1, assertion=create(owner, m1, "VAL-1"))
    loaded = MissionFeature.objects.get(pk=f1.pk)  # the PATCH request loads the feature...
    run_complete(run_id=_run(f1).pk, verdict=_verdict(**{"VAL-1": "pass"}))  # ...its validation passes...
    assert MissionFeature.objects.get(pk=f1.pk).loop_state == "passed"
    hierarchy.feature_update(user=owner, feature=loaded, title="clearer title")  # ...the PATCH saves
    fresh = MissionFeature.objects.get(pk=f1.pk)
    assert (fresh.title, fresh.loop_state, fresh.status, fresh.last_run_id) == (
        "clearer title",
        "passed",
        "done",
        ValidatorRun.objects.get(feature=f1).pk,
    )


# --- the same transaction ----------------------------------------------------------------------


@pytest.mark.parametrize("change", ["create", "link", "unlink", "delete_assertion", "delete_feature", "run"])
def test_the_rollup_commits_and_rolls_back_with_its_change(owner, plan, change):
    mission, m1, m2, f1, f2, g1 = plan
    a1 = create(owner, m1, "VAL-1")
    if change in ("unlink", "delete_feature", "run"):
        hierarchy.assertion_link(user=owner, feature=f1, assertion=a1)
    before = Milestone.objects.get(pk=m1.pk).validation_state
    events = MissionEvent.objects.filter(type="milestone:validation:updated").count()
    expected = {
        "create": "needs_coverage",
        "link": "ready",
        "unlink": "needs_coverage",
        "delete_assertion": "not_started",
        "delete_feature": "needs_coverage",
        "run": "passed",
    }[change]

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        if change == "create":
            create(owner, m1, "VAL-2")
        elif change == "link":
            hierarchy.assertion_link(user=owner, feature=f1, assertion=a1)
        elif change == "unlink":
            hierarchy.assertion_unlink(user=owner, feature=f1, assertion=a1)
        elif change == "delete_assertion":
            hierarchy.assertion_delete(user=owner, assertion=a1)
        elif change == "delete_feature":
            hierarchy.feature_delete(user=owner, feature=f1)
        else:
            run_complete(run_id=_run(f1).pk, verdict=_verdict(**{"VAL-1": "pass"}))
        # inside the change's transaction, the rollup is already current
        assert_rollup(m1, expected)
        raise Rollback
    assert Milestone.objects.get(pk=m1.pk).validation_state == before
    assert MissionEvent.objects.filter(type="milestone:validation:updated").count() == events
