"""Plan and apply a mission file (`missions/services/files/planning.py`): a dry run says what
the import would create, change or refuse and writes nothing; an apply imports exactly the
file a plan answered, against the state it answered it for."""

from __future__ import annotations

import pytest
import yaml

from missions.errors import Conflict, Invalid, NotFound
from missions.models import (
    ContractAssertion,
    LoopState,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
)
from missions.services.files import mission_import
from missions.services.files.planning import mission_apply, mission_plan
from tests.missions.file_helpers import SAMPLE, mark_passed, sample, snapshot

pytestmark = pytest.mark.django_db


def _rows() -> dict[str, int]:
    return {
        m.__name__: m.objects.count()
        for m in (Mission, Milestone, Slice, MissionFeature, ContractAssertion, MissionEvent)
    }


def _no_checks(data: dict) -> dict:
    for m in data["milestones"]:
        for a in m["assertions"]:
            a.pop("check", None)
    return data


def _keys(items: list[dict]) -> list[tuple[str, str]]:
    return [(i["kind"], i["key"]) for i in items]


def test_a_dry_run_from_nothing_lists_what_it_would_create_and_writes_nothing(
    owner, django_capture_on_commit_callbacks
):
    before = _rows()
    with django_capture_on_commit_callbacks() as callbacks:
        plan = mission_plan(document=SAMPLE, user=None)
    assert _rows() == before and callbacks == []
    assert plan.applicable and plan.changed == [] and plan.unchanged == [] and plan.refused == []
    assert _keys(plan.created)[:4] == [
        ("mission", "shop"),
        ("milestone", "m1"),
        ("assertion", "VAL-CART-001"),
        ("assertion", "VAL-CART-002"),
    ]
    assert {"kind": "feature", "key": "cart-sum", "path": "milestones[0].slices[0].features[1]"} in plan.created
    assert len(plan.created) == 1 + 2 + 4 + 2 + 3
    assert plan.plan_hash.startswith(plan.state_version + ":")


def _plain() -> dict:
    return _no_checks(sample())


def test_apply_by_the_hash_creates_exactly_what_the_plan_listed(owner):
    data = _plain()
    plan = mission_plan(document=data, user=owner)
    applied = mission_apply(document=data, plan_hash=plan.plan_hash, user=owner)
    assert applied.result.created and applied.result.mission.owner_id == owner.pk
    assert _keys(applied.plan.created) == _keys(plan.created)
    assert sorted(MissionFeature.objects.values_list("key", flat=True)) == ["cart-sum", "cart-total", "charge"]
    assert MissionEvent.objects.filter(mission__key="shop", type="mission:imported").count() == 1
    # Planned again, the same file changes nothing; a changed title is a change of that one item.
    again = mission_plan(document=data, user=owner)
    assert again.created == [] and again.changed == [] and len(again.unchanged) == len(plan.created)
    data["milestones"][0]["slices"][0]["features"][1]["title"] = "Cart sum, renamed"
    stored, events = snapshot(), MissionEvent.objects.count()
    edit = mission_plan(document=data, user=owner)
    assert snapshot() == stored and MissionEvent.objects.count() == events
    assert edit.changed == [
        {"kind": "feature", "key": "cart-sum", "path": "milestones[0].slices[0].features[1]", "fields": ["title"]}
    ]
    assert MissionFeature.objects.get(key="cart-sum").title == "Cart sum"


def test_a_stale_or_mismatched_hash_is_refused_and_changes_nothing(owner):
    data = _plain()
    mission_import(document=yaml.safe_dump(data), user=owner)
    data["milestones"][0]["title"] = "Cart, renamed"
    plan = mission_plan(document=data, user=owner)
    other = {**data, "mission": {**data["mission"], "title": "Another title"}}
    before = _rows()
    with pytest.raises(Conflict) as mismatch:
        mission_apply(document=other, plan_hash=plan.plan_hash, user=owner)
    assert mismatch.value.code == "plan_mismatch" and mismatch.value.status == 409
    with pytest.raises(Conflict) as forged:
        mission_apply(document=data, plan_hash="0:" + "0" * 64, user=owner)
    assert forged.value.code == "plan_mismatch"
    # Someone changes the mission after the plan: the plan is stale.
    Milestone.objects.filter(key="m2").update(description="changed meanwhile")
    with pytest.raises(Conflict) as stale:
        mission_apply(document=data, plan_hash=plan.plan_hash, user=owner)
    assert stale.value.code == "plan_stale"
    assert _rows() == before and Milestone.objects.get(key="m1").title == "Cart"


def test_an_invalid_file_is_refused_by_path_as_the_import_refuses_it(owner):
    data = _plain()
    data["milestones"][0]["slices"][0]["features"][1]["key"] = "cart-total"
    data["milestones"][1]["dependencies"] = ["nowhere"]
    plan = mission_plan(document=data, user=owner)
    assert not plan.applicable and plan.plan_hash is None and plan.code == "invalid_mission_file"
    assert plan.errors == [
        "milestones[0].slices[0].features[1].key: duplicate key cart-total",
        "milestones[1].dependencies: unknown milestone nowhere",
    ]
    with pytest.raises(Invalid) as imported:
        mission_import(document=data, user=owner)
    assert plan.errors == imported.value.fields["errors"]
    assert [(r["kind"], r["path"]) for r in plan.refused][0] == ("feature", "milestones[0].slices[0].features[1].key")
    assert _rows()["Mission"] == 0
    # A check from a user who is not staff: refused under its path, with the import's code.
    checks = mission_plan(document=SAMPLE, user=owner)
    assert checks.code == "staff_only" and checks.refused[0]["path"] == "milestones[0].assertions[0].check"
    unreadable = mission_plan(document="mission: [", user=owner)
    assert not unreadable.applicable and unreadable.errors[0].startswith("document: invalid YAML")


def test_a_stranger_can_neither_plan_nor_apply_into_someone_elses_mission(owner, member, stranger):
    data = _plain()
    mission, _ = mission_import(document=data, user=owner)
    mission.members.add(member)
    data["mission"]["title"] = "Taken over"
    with pytest.raises(NotFound):
        mission_plan(document=data, user=stranger)
    with pytest.raises(NotFound):
        mission_apply(document=data, plan_hash="x:y", user=stranger)
    plan = mission_plan(document=data, user=member)  # a member edits the plan, as through the API
    assert [c["kind"] for c in plan.changed] == ["mission"]
    mission_apply(document=data, plan_hash=plan.plan_hash, user=member)
    assert Mission.objects.get(key="shop").title == "Taken over"


def test_applying_a_changed_contract_reopens_the_passed_feature_it_judged(owner):

    data = _plain()
    data["mission"]["status"] = "planning"
    mission, _ = mission_import(document=data, user=owner)
    feature = MissionFeature.objects.get(key="cart-total")
    mark_passed(feature)
    data["milestones"][0]["assertions"][0]["statement"] = "cart_total([]) == 0 and never negative"
    plan = mission_plan(document=data, user=owner)
    assert {
        "kind": "assertion",
        "key": "VAL-CART-001",
        "path": "milestones[0].assertions[0]",
        "fields": ["statement"],
    } in plan.changed
    reopened = {(r["kind"], r["key"]): (r["from"], r["to"]) for r in plan.reopened}
    assert reopened[("feature", "cart-total")] == ("passed", "idle")
    assert ("feature", "charge") not in reopened
    assert MissionFeature.objects.get(pk=feature.pk).loop_state == LoopState.PASSED  # the dry run wrote nothing
    applied = mission_apply(document=data, plan_hash=plan.plan_hash, user=owner)
    assert applied.plan.reopened == plan.reopened
    assert MissionFeature.objects.get(pk=feature.pk).loop_state == LoopState.IDLE
    assert MissionEvent.objects.filter(
        mission=mission, type="feature:updated", payload__cause="contract_changed"
    ).exists()
