"""A scripted agent that drives a Fusion Missions mission to completion over MCP alone.

    python docs/examples/mcp_agent.py http://127.0.0.1:8000/mcp/missions/demo/ TOKEN REPOSITORY

It loops: `next_task` -> write the change and commit it to the mission's repository ->
`task_complete` -> `wait_for_verdict`; a failed verdict makes the next `next_task` the
fix, whose prompt carries the "Validation cause". It stops when `next_task` answers that
the mission is complete. The change it writes comes from `implement(task)`: here the demo
mission's prepared changes (missions/demo/implementer.py); a real agent writes code.
`tests/mcp/test_agent.py` runs this very loop against a live server.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def git(repository: str, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "Agent", "GIT_AUTHOR_EMAIL": "agent@localhost"}
    env |= {"GIT_COMMITTER_NAME": "Agent", "GIT_COMMITTER_EMAIL": "agent@localhost", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", repository, *args], check=True, capture_output=True, text=True, env=env).stdout


def commit(repository: str, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        path = Path(repository) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repository, "add", "-A")
    git(repository, "commit", "-q", "--allow-empty", "-m", message)
    return git(repository, "rev-parse", "HEAD").strip()


def demo_change(task: dict[str, Any]) -> dict[str, str]:
    """The demo implementer's prepared change for the task's feature (a fix gets the
    corrected one)."""
    from missions.demo.implementer import CHANGES

    key = task["feature"]["key"]
    if "-fix-" in key:
        key = key.split("-fix-")[0] + "-fix"
    return CHANGES[key]


async def call(client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    if result.is_error:
        raise RuntimeError(f"{name} refused: {result.structured_content}")
    return result.structured_content


async def drive(
    client,
    *,
    repository: str,
    implement: Callable[[dict[str, Any]], dict[str, str]] = demo_change,
    deadline: float = 600,
) -> list[dict[str, Any]]:
    """Run the loop until the mission is complete; returns what happened, step by step."""
    steps: list[dict[str, Any]] = []
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        work = await call(client, "next_task", {})
        if work["kind"] == "nothing":
            if work["reason"] == "the mission is complete":
                steps.append({"step": "complete"})
                return steps
            status = await call(client, "mission_status", {})
            judging = [
                f
                for m in status["milestones"]
                for s in m["slices"]
                for f in s["features"]
                if f["loop_state"] == "validating"
            ]
            for feature in judging:
                await call(client, "wait_for_verdict", {"feature": feature["id"], "timeout": 60})
            if not judging:
                await asyncio.sleep(0.3)  # the autopilot is creating the next tasks (a milestone run, say)
            continue
        task = {**work["task"], "feature": work["feature"]}
        revision = commit(repository, implement(task), f"{task['feature']['key']}: {task['title']}")
        outcome = await call(
            client,
            "task_complete",
            {"task": task["id"], "revision": revision, "summary": f"implemented {task['title']}"},
        )
        verdict = await call(client, "wait_for_verdict", {"feature": task["feature"]["id"], "timeout": 120})
        steps.append(
            {
                "step": "task",
                "feature": task["feature"]["key"],
                "cause": work["validation_cause"],
                "admission": outcome["outcome"],
                "verdict": verdict["run"]["status"] if verdict["run"] else None,
                "loop_state": verdict["loop_state"],
            }
        )
    raise TimeoutError(f"the mission did not complete in {deadline} s: {steps}")


async def main(url: str, token: str, repository: str) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=180) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        for step in await drive(client, repository=repository):
            print(step)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
