"""Fifty MCP sessions at once against a live `serve` (the SDK's client over streamable
HTTP), each calling `mission_status` over and over while the server's own in-process
workers judge the mission's features: no session sees an error, every answer matches the
tool's declared output schema (the SDK's client checks it; so does this test), and the
REST API keeps answering meanwhile.

Nothing here is timed: the load lasts until every feature has been judged (and every
session has called a few times), with generous deadlines for a busy machine.
"""

from __future__ import annotations

import asyncio
import json
import time

import anyio
import jsonschema  # type: ignore[import-untyped]  # ships no types; the SDK depends on it
import pytest

from tests.mcp.conftest import api, http_client, structured

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SESSIONS = 50
EXTRA_FEATURES = 5  # besides the shop's own `greet`
MIN_CALLS = 5  # per session, at the least: some before, some while and after the judging
DEADLINE = 420.0  # seconds for the whole scenario (sessions, completions, judging)
DONE = ("passed", "superseded")
STUCK = ("needs_fix", "blocked")
# A check that takes a moment: the runs are still going while the sessions read.
SLOW_CHECK = {"run": "python3 -c 'import time; time.sleep(1)'", "timeout": 60}


def busy_mission(shop, alice) -> tuple[list, str]:
    """The shop with more features, each with a file check and a slow `run` check, an open
    task for every feature, and a commit that satisfies them all (not completed yet)."""
    from missions.models import ContractAssertion, MissionFeature
    from missions.services.tasks import task_create

    slice_ = shop.feature.slice
    milestone = shop.assertion.milestone
    files = {"app.py": "def hello():\n    return 'hi'\n"}
    features = [shop.feature]
    for i in range(EXTRA_FEATURES):
        feature = MissionFeature(slice=slice_, key=f"part-{i}", title=f"Part {i}", description=f"Part {i}.")
        feature.save()
        checks = [
            ContractAssertion(
                milestone=milestone,
                key=f"VAL-PART-{i:03d}",
                title=f"part {i} exists",
                statement=f"part{i}.txt says done",
                check_spec={"file": f"part{i}.txt", "contains": f"part {i} done"},
            ),
            ContractAssertion(
                milestone=milestone,
                key=f"VAL-PART-{i:03d}-SLOW",
                title=f"part {i} takes its time",
                statement="a check that runs for a second",
                check_spec=SLOW_CHECK,
            ),
        ]
        for assertion in checks:
            assertion.save()
        feature.assertions.add(*checks)
        features.append(feature)
        files[f"part{i}.txt"] = f"part {i} done\n"
    tasks = [task_create(user=alice, feature=feature) for feature in features]
    revision = shop.repo.commit(files, "every part")
    return tasks, revision


def test_fifty_sessions_read_mission_status_while_the_mission_runs(serve, alice, shop):
    tasks, revision = busy_mission(shop, alice)
    mission_id = shop.mission.pk
    keys = {t.feature.key for t in tasks}
    server = serve()

    schema: dict = {}
    answers: list[list[dict]] = [[] for _ in range(SESSIONS)]
    errors: list[str] = []
    rest: list[tuple[str, int, bool]] = []  # (path, status, judging still going)
    completions: list[tuple[int, dict]] = []
    final_states: dict[str, str] = {}
    joined = 0
    everyone_in = anyio.Event()
    judged = anyio.Event()

    def states_of(tree: dict) -> dict[str, str]:
        return {
            f["key"]: f["loop_state"]
            for m in tree.get("milestones", [])
            for sl in m.get("slices", [])
            for f in sl.get("features", [])
        }

    async def session(index: int) -> None:
        nonlocal joined
        try:
            async with http_client(server.mcp("shop"), token=alice.token) as client:
                while True:
                    # The last call of a session starts after the judging is over: its
                    # answer shows the end state.
                    finishing = judged.is_set()
                    result = await client.call_tool("mission_status", {})
                    if result.is_error:
                        errors.append(f"session {index}: tool error {result.structured_content or result.content}")
                        return
                    answers[index].append(structured(result))
                    if len(answers[index]) == 1:
                        joined += 1
                        if joined == SESSIONS:
                            everyone_in.set()
                    if finishing and len(answers[index]) >= MIN_CALLS:
                        return
                    await anyio.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 — every session's failure is reported below
            errors.append(f"session {index}: {type(exc).__name__}: {exc}")
            everyone_in.set()  # do not keep the driver waiting for a session that is gone
            judged.set()

    async def get(path: str) -> tuple[int, dict]:
        return await anyio.to_thread.run_sync(lambda: api(server, "GET", path, token=alice.token))

    async def read_rest() -> tuple[dict[str, str], bool]:
        """The mission and its tree through the REST API: the features' states, and
        whether any is not judged yet (both reads recorded in `rest`)."""
        status, _mission = await get(f"/api/missions/{mission_id}/")
        tree_status, tree = await get(f"/api/missions/{mission_id}/tree/")
        states = states_of(tree) if tree_status == 200 else {}
        going = not states or any(state not in DONE for state in states.values())
        rest.append((f"/api/missions/{mission_id}/", status, going))
        rest.append((f"/api/missions/{mission_id}/tree/", tree_status, going))
        return states, going

    async def driver() -> None:
        try:
            with anyio.fail_after(120):
                await everyone_in.wait()
            if errors:
                return
            # The tasks are completed through the API while the fifty sessions read; the
            # serve's workers judge each feature as its task completes (a run takes a
            # second or more). The REST API is read after each completion too: then the
            # features still to complete are not passed, whatever the machine's speed.
            for task in tasks:
                completions.append(
                    await anyio.to_thread.run_sync(
                        lambda t=task: api(
                            server,
                            "POST",
                            f"/api/tasks/{t.pk}/complete/",
                            token=alice.token,
                            body={"revision": revision, "summary": "done"},
                        )
                    )
                )
                await read_rest()
            deadline = time.monotonic() + DEADLINE
            while time.monotonic() < deadline and not errors:
                states, going = await read_rest()
                if states and not going:
                    final_states.update(states)
                    return
                if any(state in STUCK for state in states.values()):
                    errors.append(f"a feature did not pass: {states}")
                    return
                await anyio.sleep(0.25)
            if not final_states and not errors:
                errors.append(f"the features were not all judged within {DEADLINE:.0f}s: {rest[-1:]}")
        finally:
            judged.set()

    async def scenario() -> None:
        nonlocal schema
        async with http_client(server.mcp("shop"), token=alice.token) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            schema = listed["mission_status"].output_schema or {}
        with anyio.fail_after(DEADLINE + 180):
            await asyncio.gather(driver(), *(session(i) for i in range(SESSIONS)))

    asyncio.run(scenario())

    assert not errors, (errors[:10], server.logs())
    # Every completion was admitted by the API.
    assert [status for status, _body in completions] == [200] * len(tasks), completions
    # The mission ran to the end under the load: every feature passed, each by a run.
    assert set(final_states) == keys and set(final_states.values()) <= set(DONE), final_states
    from validation.models import RunStatus, ValidatorRun

    assert ValidatorRun.objects.filter(mission_id=mission_id, status=RunStatus.PASSED).count() >= len(tasks)
    # The REST API kept answering, and did so while the features were being judged.
    assert rest and all(status == 200 for _path, status, _going in rest), rest
    assert any(going for _path, _status, going in rest), rest

    # Every session answered every call, each answer well-formed and about this mission.
    assert schema and schema.get("type") == "object"
    validator = jsonschema.Draft202012Validator(schema)
    seen_states: set[str] = set()
    for index, calls in enumerate(answers):
        assert len(calls) >= MIN_CALLS, (index, len(calls))
        for answer in calls:
            problems = [e.message for e in validator.iter_errors(answer)]
            assert not problems, (index, problems, json.dumps(answer)[:2000])
            assert answer["mission"]["id"] == mission_id and answer["mission"]["key"] == "shop"
            assert answer["progress"]["features_total"] == len(tasks)
            assert 0 <= answer["progress"]["features_passed"] <= len(tasks)
            assert answer["blocked"] == []
            seen_states |= set(states_of(answer).values())
    # The sessions read the mission while it ran: before, during and after the judging.
    assert "validating" in seen_states or "implementing" in seen_states, seen_states
    assert seen_states & set(DONE), seen_states
    last = [calls[-1] for calls in answers]
    assert all(a["progress"]["features_passed"] == len(tasks) for a in last), [a["progress"] for a in last]
