"""An agent plans a mission from nothing, applies it and drives it to complete with the
forge's statuses green (issue 40, "Tests"), over MCP alone: the SDK's client talks to
`manage.py mcp` over stdio, whose workers (its own in the embedded shape, a `rundramatiq`
beside it with Redis) judge; the agent pushes each change to a real `git daemon`
repository, and the local forge receives the statuses over real HTTP."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import yaml

from forges.models import Forge, Outbox, OutboxState
from missions.models import Mission
from tests.mcp.conftest import child_env, stdio_client, stdio_judges, structured  # noqa: F401 — fixture
from validation.models import ValidatorRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WAIT = float(os.environ.get("FUSION_REPO_TEST_TIMEOUT", "240"))
CHANGES = {
    "hello": {"hello.py": "def hello():\n    return 'hi, please'\n"},
    "bye": {"bye.py": "def bye():\n    return 'bye'\n"},
}


def mission_file(repository: str, api_url: str) -> str:
    def assertion(key: str, check: dict[str, str]) -> dict[str, Any]:
        return {
            "key": key,
            "title": f"{key} holds",
            "statement": f"{check['file']} has {check['contains']}",
            "check": check,
        }

    return yaml.safe_dump(
        {
            "mission": {
                "key": "ship",
                "title": "Ship it",
                "status": "active",
                "repository": repository,
                "branch": "main",
                "executor": "manual",
                "autopilot": True,
                "auto_fix": True,
            },
            "forge": {"provider": "github", "api_url": api_url, "repository": "acme/shop"},
            "milestones": [
                {
                    "key": "m1",
                    "title": "Words",
                    "assertions": [
                        assertion("GREET", {"file": "hello.py", "contains": r"def hello\("}),
                        assertion("POLITE", {"file": "hello.py", "contains": "please"}),
                        assertion("BYE", {"file": "bye.py", "contains": r"def bye\("}),
                    ],
                    "slices": [
                        {
                            "key": "s1",
                            "title": "Greetings",
                            "features": [
                                {"key": "hello", "title": "Say hello", "assertions": ["GREET", "POLITE"]},
                                {"key": "bye", "title": "Say bye", "assertions": ["BYE"]},
                            ],
                        }
                    ],
                }
            ],
        }
    )


async def call(client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    assert not result.is_error, (name, structured(result))
    return structured(result)


def green(fake_forge) -> list[tuple[str, list[str]]] | None:
    """Every judged head's statuses once each is delivered and the last is `success`; None
    while anything is still on its way."""
    if Outbox.objects.exclude(state__in=[OutboxState.DELIVERED, OutboxState.SUPERSEDED]).exists():
        return None
    heads = ValidatorRun.objects.filter(feature__isnull=False).order_by("id").values_list("revision", flat=True)
    seen = [(head, [s["state"] for s in fake_forge.statuses_of(head)]) for head in dict.fromkeys(heads)]
    return seen if seen and all(states and states[-1] == "success" for _, states in seen) else None


def test_an_agent_plans_applies_and_ships_with_the_forge_green(staff, served, fake_forge, tmp_path, stdio_judges):
    document = mission_file(served.url, fake_forge.api_url("github"))
    steps: list[dict[str, Any]] = []

    async def work(client) -> None:
        deadline = time.monotonic() + WAIT
        offered: dict[str, Any] = {}
        while time.monotonic() < deadline:
            offered = await call(client, "next_task", {"mission": "ship"})
            if offered["kind"] == "nothing":
                if offered["reason"] == "the mission is complete":
                    return
                await asyncio.sleep(0.3)  # the autopilot is at work (the next task, the milestone run)
                continue
            task, feature = offered["task"], offered["feature"]
            head = await asyncio.to_thread(served.commit, CHANGES[feature["key"]], f"{feature['key']}: {task['title']}")
            done = await call(client, "task_complete", {"task": task["id"], "revision": head, "summary": "done"})
            verdict = await call(client, "wait_for_verdict", {"feature": feature["id"], "timeout": 120})
            steps.append(
                {
                    "feature": feature["key"],
                    "head": head,
                    "admission": done["outcome"],
                    "status": verdict["run"]["status"],
                }
            )
        raise AssertionError(f"the mission did not complete in {WAIT:g} s: {steps}; next_task: {offered}")

    async def scenario():
        async with stdio_client("staff", env=child_env(tmp_path)) as client:
            plan = await call(client, "mission_plan", {"document": document})
            applied = await call(client, "mission_apply", {"document": document, "plan_hash": plan["plan_hash"]})
            await work(client)
            # The statuses are sent by the server's workers: wait for them while it runs.
            deadline = time.monotonic() + WAIT
            while (statuses := await asyncio.to_thread(green, fake_forge)) is None:
                assert time.monotonic() < deadline, "the forge's statuses did not all turn green"
                await asyncio.sleep(0.2)
            return plan, applied, statuses

    plan, applied, statuses = asyncio.run(scenario())

    assert plan["applicable"] is True and [i["key"] for i in plan["created"] if i["kind"] == "feature"] == [
        "hello",
        "bye",
    ]
    assert applied["created"] is True
    mission = Mission.objects.get(key="ship")
    assert mission.status == "complete" and mission.owner_id == staff.pk
    forge = Forge.objects.get(mission=mission)
    assert (forge.provider, forge.api_url, forge.repository) == ("github", fake_forge.api_url("github"), "acme/shop")
    assert forge.secret  # made by the import, never in the file

    assert [(s["feature"], s["status"]) for s in steps] == [("hello", "passed"), ("bye", "passed")], steps
    # Every judged head: its last status on the forge is green, and no state was posted twice.
    assert [head for head, _ in statuses] == [s["head"] for s in steps]
    for head, states in statuses:
        assert states in (["pending", "success"], ["success"]), (head, states)
        [success] = [s for s in fake_forge.statuses_of(head) if s["state"] == "success"]
        assert success["context"] == "fusion-missions" and success["target_url"].endswith("/")
