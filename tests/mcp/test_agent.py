"""An agent drives the demo mission (manual executor) to completion using only MCP: the
loop of docs/examples/mcp_agent.py against a live `serve`, whose own workers judge."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
from pathlib import Path

import pytest

from tests.mcp.conftest import ROOT, api, http_client, stdio_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def example():
    spec = importlib.util.spec_from_file_location("mcp_agent_example", ROOT / "docs/examples/mcp_agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def manual_demo(tmp_path: Path, owner):
    """The demo mission over a fresh repository, with the manual executor: nobody but the
    agent implements anything. It is activated through the server (below), so that the
    autopilot's work goes to the server's workers."""
    from missions.demo.project import MISSION
    from missions.management.commands.demo import make_repository
    from missions.models import Mission
    from missions.services.files import mission_import

    repo = tmp_path / "demo-repo"
    base = make_repository(repo)
    document = copy.deepcopy(MISSION)
    document["mission"].update(repository=str(repo), base_revision=base, executor="manual", status="planning")
    mission, _ = mission_import(document=document, user=None)
    Mission.objects.filter(pk=mission.pk).update(owner=owner)
    return mission, str(repo)


def test_a_scripted_agent_completes_the_demo_mission_over_mcp(serve, alice, tmp_path):
    mission, repo = manual_demo(tmp_path, alice)
    server = serve()
    status, body = api(server, "POST", f"/api/missions/{mission.pk}/activate/", token=alice.token)
    assert status == 200, body
    agent = example()

    async def scenario():
        async with http_client(server.mcp("demo"), token=alice.token) as client:
            return await agent.drive(client, repository=repo, deadline=400)

    steps = asyncio.run(scenario())
    mission.refresh_from_db()
    assert mission.status == "complete", (steps, server.logs())
    tasks = [s for s in steps if s["step"] == "task"]
    assert {s["feature"] for s in tasks} >= {"cart-total", "cart-count", "discount", "receipt"}
    # The first discount is wrong on purpose: the verdict fails and the next task is the
    # fix, whose prompt carries the validation cause.
    first_discount = next(s for s in tasks if s["feature"] == "discount")
    # (The root waits in `implementing` while its generated fix is worked on.)
    assert first_discount["verdict"] == "failed" and first_discount["loop_state"] in ("needs_fix", "implementing")
    fix = next(s for s in tasks if s["feature"].startswith("discount-fix-"))
    assert fix["cause"].startswith("## Validation cause") and "VAL-DISC-001" in fix["cause"]
    assert fix["verdict"] == "passed"
    assert steps[-1] == {"step": "complete"}


def test_wait_for_verdict_progress_and_timeout(alice, shop, tmp_path, stdio_judges):
    """Over stdio (whose process runs its own workers, embedded): a completion, then the wait with
    progress notifications; a second wait with nothing pending returns at once; a wait
    whose run cannot end in time returns finished=false at the timeout."""
    from missions.models import ContractAssertion
    from missions.services.tasks import task_create
    from tests.mcp.conftest import child_env, structured

    # A check that takes a few seconds: long enough to be waited for, and to outlast a short timeout.
    slow = ContractAssertion(
        milestone=shop.assertion.milestone,
        key="VAL-GREET-002",
        title="slow",
        statement="takes its time",
        check_spec={"run": "python3 -c 'import time; time.sleep(4)'", "timeout": 60},
    )
    slow.save()
    shop.feature.assertions.add(slow)
    task = task_create(user=alice, feature=shop.feature)
    good = shop.repo.commit({"app.py": "def hello():\n    return 'hi'\n"}, "say hi")
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done, total, message):
        progress.append((done, total, message))

    async def scenario():
        async with stdio_client("alice", mission="shop", env=child_env(tmp_path)) as client:
            done = structured(
                await client.call_tool("task_complete", {"task": task.pk, "revision": "HEAD", "summary": "hi"})
            )
            early = structured(await client.call_tool("wait_for_verdict", {"feature": "greet", "timeout": 1}))
            verdict = structured(
                await client.call_tool(
                    "wait_for_verdict", {"feature": "greet", "timeout": 60}, progress_callback=on_progress
                )
            )
            again = structured(await client.call_tool("wait_for_verdict", {"feature": "greet", "timeout": 30}))
            loop = structured(await client.call_tool("feature_loop", {"feature": "greet"}))
            return done, early, verdict, again, loop

    done, early, verdict, again, loop = asyncio.run(scenario())
    assert done["task"]["revision"] == good and done["outcome"] == "started"
    assert early["finished"] is False and 1 <= early["waited_seconds"] < 5 and early["run"]["status"] == "running"
    assert progress and all(total == 60 for _done, total, _m in progress)
    assert "greet: validating" in progress[0][2] and progress[-1][0] >= progress[0][0]
    assert verdict["finished"] is True and verdict["run"]["status"] == "passed"
    assert [(a["key"], a["verdict"]) for a in verdict["verdict"]] == [
        ("VAL-GREET-001", "pass"),
        ("VAL-GREET-002", "pass"),
    ]
    assert again["finished"] is True and again["waited_seconds"] < 5
    assert loop["loop_state"] == "passed" and {a["verdict"] for a in loop["last_verdict"]} == {"pass"}
    assert loop["budget_left"] == loop["retry_budget"]
