"""The contract-writing tools over MCP (stdio, the SDK's client, the test database): an agent
plans a mission file, applies exactly that plan, adds an assertion and a feature; stale and
mismatched plans, bad input and a stranger are refused with the API's codes."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from tests.mcp.conftest import child_env, stdio_client, structured
from tests.missions.file_helpers import mark_passed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FILE = {
    "mission": {"key": "notes", "title": "Notes", "repository": "https://git.example.com/notes.git"},
    "milestones": [
        {
            "key": "m1",
            "title": "Writing",
            "assertions": [{"key": "VAL-NOTE-001", "title": "A note is saved", "statement": "save() stores it"}],
            "slices": [
                {
                    "key": "s1",
                    "title": "Saving",
                    "features": [{"key": "save", "title": "Save a note", "assertions": ["VAL-NOTE-001"]}],
                }
            ],
        }
    ],
}


def _counts() -> dict[str, int]:
    from missions.models import ContractAssertion, Mission, MissionEvent, MissionFeature

    return {m.__name__: m.objects.count() for m in (Mission, MissionFeature, ContractAssertion, MissionEvent)}


def test_an_agent_plans_applies_and_extends_a_mission(alice, bob, tmp_path):
    from missions.models import ContractAssertion, Mission, MissionFeature

    env = child_env(tmp_path)
    text = yaml.safe_dump(FILE)

    async def plan_and_apply():
        async with stdio_client("alice", env=env) as client:
            plan = await client.call_tool("mission_plan", {"document": text})
            counts = await asyncio.to_thread(_counts)
            mismatch = await client.call_tool(
                "mission_apply", {"document": {**FILE, "milestones": []}, "plan_hash": structured(plan)["plan_hash"]}
            )
            applied = await client.call_tool(
                "mission_apply", {"document": text, "plan_hash": structured(plan)["plan_hash"]}
            )
            stale = await client.call_tool(
                "mission_apply", {"document": text, "plan_hash": structured(plan)["plan_hash"]}
            )
            return plan, counts, mismatch, applied, stale

    plan, counts, mismatch, applied, stale = asyncio.run(plan_and_apply())
    assert not plan.is_error, structured(plan)
    assert counts == {"Mission": 0, "MissionFeature": 0, "ContractAssertion": 0, "MissionEvent": 0}
    assert [(i["kind"], i["key"], i["path"]) for i in structured(plan)["created"]] == [
        ("mission", "notes", "mission"),
        ("milestone", "m1", "milestones[0]"),
        ("assertion", "VAL-NOTE-001", "milestones[0].assertions[0]"),
        ("slice", "s1", "milestones[0].slices[0]"),
        ("feature", "save", "milestones[0].slices[0].features[0]"),
    ]
    assert mismatch.is_error and structured(mismatch)["code"] == "plan_mismatch"
    assert not applied.is_error, structured(applied)
    assert structured(applied)["created"] is True and structured(applied)["mission"]["key"] == "notes"
    assert stale.is_error and structured(stale)["code"] == "plan_stale"
    mission = Mission.objects.get(key="notes")
    assert mission.owner_id == alice.pk
    assert list(MissionFeature.objects.filter(mission=mission).values_list("key", flat=True)) == ["save"]

    async def extend():
        async with stdio_client("alice", mission="notes", env=env) as client:
            added = await client.call_tool(
                "assertion_add",
                {"milestone": "m1", "key": "VAL-NOTE-002", "title": "A note is listed", "statement": "list() shows it"},
            )
            feature = await client.call_tool(
                "feature_add",
                {"slice": "s1", "key": "list", "title": "List notes", "assertions": ["VAL-NOTE-002", "VAL-NOTE-001"]},
            )
            unknown = await client.call_tool(
                "feature_add", {"slice": "s1", "key": "find", "title": "Find", "assertions": ["VAL-NOPE"]}
            )
            duplicate = await client.call_tool(
                "assertion_add", {"milestone": "m1", "key": "VAL-NOTE-001", "title": "Again", "statement": "again"}
            )
            untitled = await client.call_tool("feature_add", {"slice": "s1", "key": "bare"})
            check = await client.call_tool(
                "assertion_add",
                {
                    "milestone": "m1",
                    "key": "VAL-NOTE-003",
                    "title": "Runs",
                    "statement": "it runs",
                    "check": {"run": "true"},
                },
            )
            elsewhere = await client.call_tool(
                "mission_plan", {"document": {**FILE, "mission": {"key": "other", "title": "Other"}}}
            )
            return added, feature, unknown, duplicate, untitled, check, elsewhere

    added, feature, unknown, duplicate, untitled, check, elsewhere = asyncio.run(extend())
    assert not added.is_error, structured(added)
    assert structured(added)["key"] == "VAL-NOTE-002"
    assert not feature.is_error, structured(feature)
    assert sorted(structured(feature)["assertion_keys"]) == ["VAL-NOTE-001", "VAL-NOTE-002"]
    assert structured(unknown)["code"] == "unknown_assertion"
    assert structured(duplicate)["code"] == "duplicate_key", structured(duplicate)
    assert structured(untitled)["code"] == "validation_error"
    assert structured(check)["code"] == "staff_only"
    assert structured(elsewhere)["code"] == "mission_mismatch"
    assert not MissionFeature.objects.filter(key__in=["find", "bare"]).exists()
    assert sorted(ContractAssertion.objects.filter(mission=mission).values_list("key", flat=True)) == [
        "VAL-NOTE-001",
        "VAL-NOTE-002",
    ]

    async def stranger():
        async with stdio_client("bob", env=env) as client:
            plan = await client.call_tool(
                "mission_plan", {"document": {**FILE, "mission": {**FILE["mission"], "title": "Mine"}}}
            )
            add = await client.call_tool(
                "assertion_add",
                {"mission": "notes", "milestone": "m1", "key": "VAL-BOB", "title": "Bob's", "statement": "b"},
            )
            feature = await client.call_tool(
                "feature_add", {"mission": "notes", "slice": "s1", "key": "bob", "title": "Bob"}
            )
            return plan, add, feature

    for refused in asyncio.run(stranger()):
        assert refused.is_error and structured(refused)["code"] == "not_found"
    assert Mission.objects.get(key="notes").title == "Notes"


def test_an_added_assertion_linked_to_a_passed_feature_reopens_it(alice, tmp_path):
    from missions.models import LoopState, MissionEvent, MissionFeature
    from missions.services.files import mission_import

    mission, _ = mission_import(document={**FILE, "mission": {**FILE["mission"], "status": "paused"}}, user=alice)
    feature = MissionFeature.objects.get(key="save")
    mark_passed(feature)

    async def scenario():
        async with stdio_client("alice", mission="notes", env=child_env(tmp_path)) as client:
            return await client.call_tool(
                "assertion_add",
                {
                    "milestone": "m1",
                    "key": "VAL-NOTE-009",
                    "title": "Saved twice is one",
                    "statement": "saving twice stores one note",
                    "features": ["save"],
                },
            )

    added = asyncio.run(scenario())
    assert not added.is_error, structured(added)
    assert structured(added)["features"] == [feature.pk]
    assert MissionFeature.objects.get(pk=feature.pk).loop_state == LoopState.IDLE
    moved = MissionEvent.objects.filter(mission=mission, type="feature:updated", payload__cause="contract_changed")
    assert [(e.payload["from"], e.payload["loop_state"]) for e in moved] == [("passed", "idle")]
