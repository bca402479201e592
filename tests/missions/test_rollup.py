"""Milestone rollup: the precedence rule, the stored `validation_state`, the
`validation` endpoint, and recomputation in the same request as every change that feeds it."""

from __future__ import annotations

import pytest

from missions.models import (
    AssertionScope,
    AssertionStatus,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionFeature,
    RollupState,
    Slice,
)
from missions.selectors import milestone_rollup, rollup_state
from missions.services.rollup import milestone_rollup_refresh

pytestmark = pytest.mark.django_db


def stored(milestone) -> str:
    return Milestone.objects.get(pk=milestone.pk).validation_state


def endpoint(client, milestone) -> dict:
    response = client.get(f"/api/milestones/{milestone.pk}/validation/")
    assert response.status_code == 200
    return response.json()


def set_status(status: str, *assertions) -> None:
    ContractAssertion.objects.filter(pk__in=[a.pk for a in assertions]).update(status=status)


def counts(**kw) -> dict:
    base = dict.fromkeys(("total", "passed", "failed", "blocked", "pending", "unlinked"), 0)
    base.update(kw)
    return base


@pytest.mark.parametrize(
    "c,expected",
    [
        (counts(), "not_started"),
        (counts(total=3, failed=1, blocked=1, unlinked=1, pending=1), "failed"),
        (counts(total=3, blocked=1, unlinked=1, pending=2), "blocked"),
        (counts(total=2, unlinked=1, pending=2), "needs_coverage"),
        (counts(total=2, passed=2, unlinked=1), "needs_coverage"),
        (counts(total=2, passed=2), "passed"),
        (counts(total=2, passed=1, pending=1), "ready"),
        (counts(total=1, pending=1), "ready"),
    ],
)
def test_precedence(c, expected):
    assert rollup_state(c) == expected


@pytest.fixture
def milestone(owner, member):
    mission = Mission.objects.create(key="roll", title="Rollup", owner=owner)
    mission.members.set([member])
    milestone = Milestone.objects.create(mission=mission, key="m1", title="M1")
    slice_ = Slice(milestone=milestone, key="s1", title="S1")
    slice_.save()
    for key in ("f1", "f2"):
        MissionFeature(slice=slice_, key=key, title=key).save()
    return milestone


def feature(key: str) -> MissionFeature:
    return MissionFeature.objects.get(key=key, mission__key="roll")


def test_states_through_the_api(api, member, milestone):
    client = api(member)
    assert endpoint(client, milestone) == {"milestone": milestone.pk, "state": "not_started", **counts()}
    milestone_rollup_refresh(milestone_ids=[milestone.pk])
    assert stored(milestone) == RollupState.NOT_STARTED

    # a feature-scoped assertion linked to nothing: needs coverage, stored by the create request itself
    response = client.post(
        "/api/assertions/", {"milestone": milestone.pk, "key": "VAL-1", "title": "one", "statement": "s"}, format="json"
    )
    assert response.status_code == 201
    assert stored(milestone) == RollupState.NEEDS_COVERAGE
    assert endpoint(client, milestone) == {
        "milestone": milestone.pk,
        "state": "needs_coverage",
        **counts(total=1, pending=1, unlinked=1),
    }

    # all linked, pending: ready
    assert (
        client.post(f"/api/features/{feature('f1').pk}/link/", {"assertion": "VAL-1"}, format="json").status_code == 201
    )
    assert stored(milestone) == RollupState.READY
    assert endpoint(client, milestone)["state"] == "ready"

    # a milestone-scoped assertion needs no feature to be covered
    response = client.post(
        "/api/assertions/",
        {"milestone": milestone.pk, "key": "VAL-M", "title": "m", "statement": "s", "scope": "milestone"},
        format="json",
    )
    assert response.status_code == 201
    assert stored(milestone) == RollupState.READY

    # all passed
    ContractAssertion.objects.filter(milestone=milestone).update(status=AssertionStatus.PASSED)
    assert stored(milestone) == RollupState.READY  # a bare update() does not recompute...
    milestone_rollup_refresh(milestone_ids=[milestone.pk])  # ...the services call this
    assert stored(milestone) == RollupState.PASSED
    assert endpoint(client, milestone) == {"milestone": milestone.pk, "state": "passed", **counts(total=2, passed=2)}

    # unlinking uncovers it again, in the same request
    assert (
        client.post(f"/api/features/{feature('f1').pk}/unlink/", {"assertion": "VAL-1"}, format="json").status_code
        == 200
    )
    assert stored(milestone) == RollupState.NEEDS_COVERAGE

    # deleting the uncovered assertion leaves the milestone-scoped one, passed
    a1 = ContractAssertion.objects.get(key="VAL-1", mission=milestone.mission)
    assert client.delete(f"/api/assertions/{a1.pk}/").status_code == 204
    assert stored(milestone) == RollupState.PASSED

    # and deleting the last one: not started
    am = ContractAssertion.objects.get(key="VAL-M", mission=milestone.mission)
    assert client.delete(f"/api/assertions/{am.pk}/").status_code == 204
    assert stored(milestone) == RollupState.NOT_STARTED


def test_failed_beats_blocked_beats_needs_coverage(api, member, milestone):
    make = lambda key: ContractAssertion.objects.create(milestone=milestone, key=key, title=key, statement="s")  # noqa: E731
    failing, blocking, uncovered, covered = make("A-F"), make("A-B"), make("A-U"), make("A-C")
    for a in (failing, blocking, covered):
        FeatureAssertion.objects.create(feature=feature("f1"), assertion=a)
    set_status(AssertionStatus.FAILED, failing)
    set_status(AssertionStatus.BLOCKED, blocking)
    set_status(AssertionStatus.PASSED, covered)
    milestone_rollup_refresh(milestone_ids=[milestone.pk])
    assert stored(milestone) == RollupState.FAILED
    assert milestone_rollup(milestone_id=milestone.pk) == {
        "milestone": milestone.pk,
        "state": "failed",
        **counts(total=4, failed=1, blocked=1, passed=1, pending=1, unlinked=1),
    }

    set_status(AssertionStatus.PASSED, failing)
    milestone_rollup_refresh(milestone_ids=[milestone.pk])
    assert stored(milestone) == RollupState.BLOCKED

    set_status(AssertionStatus.PENDING, blocking)
    milestone_rollup_refresh(milestone_ids=[milestone.pk])
    assert stored(milestone) == RollupState.NEEDS_COVERAGE

    # covering the last one through the API recomputes in the same request
    response = api(member).post(f"/api/features/{feature('f2').pk}/link/", {"assertion": "A-U"}, format="json")
    assert response.status_code == 201
    assert stored(milestone) == RollupState.READY
    set_status(AssertionStatus.PASSED, blocking, uncovered)
    milestone_rollup_refresh(milestone_ids=[milestone.pk])
    assert stored(milestone) == RollupState.PASSED


def test_an_assertion_linked_twice_counts_once(milestone):
    a = ContractAssertion.objects.create(milestone=milestone, key="A-1", title="a", statement="s")
    FeatureAssertion.objects.create(feature=feature("f1"), assertion=a)
    FeatureAssertion.objects.create(feature=feature("f2"), assertion=a)
    assert milestone_rollup(milestone_id=milestone.pk) == {
        "milestone": milestone.pk,
        "state": "ready",
        **counts(total=1, pending=1),
    }


def test_moving_an_assertion_recomputes_both_milestones(api, member, milestone):
    other = Milestone.objects.create(mission=milestone.mission, key="m2", title="M2")
    a = ContractAssertion.objects.create(milestone=milestone, key="A-1", title="a", statement="s")
    milestone_rollup_refresh(milestone_ids=[milestone.pk, other.pk])
    assert (stored(milestone), stored(other)) == ("needs_coverage", "not_started")
    response = api(member).patch(f"/api/assertions/{a.pk}/", {"milestone": other.pk}, format="json")
    assert response.status_code == 200
    assert (stored(milestone), stored(other)) == ("not_started", "needs_coverage")


def test_changing_scope_recomputes(api, member, milestone):
    a = ContractAssertion.objects.create(milestone=milestone, key="A-1", title="a", statement="s")
    milestone_rollup_refresh(milestone_ids=[milestone.pk])
    assert stored(milestone) == "needs_coverage"
    assert (
        api(member).patch(f"/api/assertions/{a.pk}/", {"scope": AssertionScope.MILESTONE}, format="json").status_code
        == 200
    )
    assert stored(milestone) == "ready"


@pytest.mark.parametrize("what", ["feature", "slice", "milestone"])
def test_deleting_what_covers_an_assertion_recomputes(api, member, milestone, what):
    # the assertion lives in m2 and is covered by f1, a feature of m1
    m2 = Milestone.objects.create(mission=milestone.mission, key="m2", title="M2")
    a = ContractAssertion.objects.create(milestone=m2, key="A-1", title="a", statement="s")
    FeatureAssertion.objects.create(feature=feature("f1"), assertion=a)
    milestone_rollup_refresh(milestone_ids=[milestone.pk, m2.pk])
    assert stored(m2) == "ready"
    url = {
        "feature": f"/api/features/{feature('f1').pk}/",
        "slice": f"/api/slices/{feature('f1').slice_id}/",
        "milestone": f"/api/milestones/{milestone.pk}/",
    }[what]
    assert api(member).delete(url).status_code == 204
    assert stored(m2) == "needs_coverage"
    assert milestone_rollup(milestone_id=m2.pk)["state"] == "needs_coverage"


def test_refresh_of_a_deleted_milestone_is_a_no_op(milestone):
    pk = milestone.pk
    milestone.delete()
    milestone_rollup_refresh(milestone_ids=[pk])  # no error, nothing stored
    assert not Milestone.objects.filter(pk=pk).exists()
