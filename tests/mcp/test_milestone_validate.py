"""`milestone_validate` over MCP (stdio, whose process runs its own workers embedded): an
agent on a mission without the autopilot lands its feature, validates the milestone and
sees the mission complete; a refusal carries the API's code; a stranger gets not_found."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from tests.mcp.conftest import child_env, stdio_client, structured

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_agent_validates_the_milestone_and_the_mission_completes(alice, bob, shop, tmp_path, stdio_judges):
    from missions.models import ContractAssertion, MissionEvent
    from missions.services.tasks import task_create

    ContractAssertion(
        milestone=shop.assertion.milestone,
        key="VAL-SHOP",
        title="the shop holds",
        statement="app.py is there",
        scope="milestone",
        check_spec={"file": "app.py", "exists": True},
    ).save()
    task = task_create(user=alice, feature=shop.feature)
    good = shop.repo.commit({"app.py": "def hello():\n    return 'hi'\n"}, "say hi")
    env = child_env(tmp_path)

    async def agent():
        async with stdio_client("alice", mission="shop", env=env) as client:
            early = await client.call_tool("milestone_validate", {"milestone": "m1"})
            await client.call_tool("task_complete", {"task": task.pk, "revision": good})
            verdict = structured(await client.call_tool("wait_for_verdict", {"feature": "greet", "timeout": 120}))
            started = structured(await client.call_tool("milestone_validate", {"milestone": "m1"}))
            deadline = time.monotonic() + 120
            status = structured(await client.call_tool("mission_status", {}))
            while status["mission"]["status"] != "complete" and time.monotonic() < deadline:
                await anyio.sleep(0.2)
                status = structured(await client.call_tool("mission_status", {}))
            return early, verdict, started, status

    async def stranger():
        async with stdio_client("bob", env=env) as client:
            return await client.call_tool("milestone_validate", {"milestone": "m1", "mission": "shop"})

    early, verdict, started, status = asyncio.run(agent())
    assert early.is_error and structured(early)["code"] == "features_open"
    assert structured(early)["features"] == [{"id": shop.feature.pk, "key": "greet", "loop_state": "implementing"}]
    assert verdict["run"]["status"] == "passed"
    assert started["outcome"] == "started" and started["run"]["scope"] == "milestone"
    assert started["milestone"]["key"] == "m1" and started["mission_status"] == "active"
    assert status["mission"]["status"] == "complete", status
    [milestone] = status["milestones"]
    assert milestone["status"] == "complete"
    run_started = MissionEvent.objects.get(
        mission=shop.mission, type="validator-run:started", payload__run=started["run"]["id"]
    )
    assert run_started.actor_id == alice.pk

    refused = asyncio.run(stranger())
    assert refused.is_error and structured(refused)["code"] == "not_found"
