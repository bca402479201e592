"""Judging tools: `feature_validate`, `milestone_validate`, `feature_loop` and `wait_for_verdict`.

`wait_for_verdict` holds no database connection while it waits: each look is a couple of
short queries in a pool thread that closes its connection afterwards, then the tool
sleeps (a progress notification per look) until the run ends or the time is up.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from django.conf import settings

from missions.models import LoopState, TaskStatus
from missions.selectors import latest_done_task
from validation.api import serializers as s
from validation.api.views import admission_body, loop_snapshot, milestone_after
from validation.mcp import schemas
from validation.mcp.context import db, load_user
from validation.mcp.loop_tools import api_context, feature_for, milestone_for
from validation.mcp.tooling import Call, Tool
from validation.models import RunStatus, ValidatorRun
from validation.services import operator

MAX_WAIT = 3600.0


def _verdict_rows(verdict: Any) -> list[dict[str, Any]]:
    """Per assertion of a run's verdict: verdict, message, expected, actual, evidence."""
    if not isinstance(verdict, dict):
        return []
    keep = ("key", "verdict", "message", "expected", "actual", "evidence")
    return [{k: a.get(k) for k in keep} for a in verdict.get("assertions", []) if isinstance(a, dict)]


def _validate(principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    feature = feature_for(
        user=user, principal=principal, ref=arguments["feature"], mission_ref=arguments.get("mission")
    )
    body = s.ValidateSerializer(data={k: arguments[k] for k in ("validator",) if k in arguments})
    body.is_valid(raise_exception=True)
    admission = operator.feature_validate(feature=feature, user=user, profile=body.validated_data.get("validator"))
    return admission_body(admission)


async def feature_validate(call: Call) -> dict[str, Any]:
    return await db(_validate)(call.principal, call.arguments)


def _validate_milestone(principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    milestone = milestone_for(
        user=user, principal=principal, ref=arguments["milestone"], mission_ref=arguments.get("mission")
    )
    step = operator.milestone_validate(milestone_id=milestone.pk, actor_id=user.pk)
    return admission_body(step, **milestone_after(milestone.pk, api_context(user)))


async def milestone_validate(call: Call) -> dict[str, Any]:
    return await db(_validate_milestone)(call.principal, call.arguments)


def _loop(principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    feature = feature_for(
        user=user, principal=principal, ref=arguments["feature"], mission_ref=arguments.get("mission")
    )
    snapshot = loop_snapshot(feature)
    # The snapshot's runs are the feature's, newest first: the last verdict is among them.
    last = next((run for run in snapshot["runs"] if run["status"] != RunStatus.RUNNING), None)
    return {
        **snapshot,
        "last_verdict": _verdict_rows(last["verdict"]) if last else [],
        "last_verdict_run": last["id"] if last else None,
    }


async def feature_loop(call: Call) -> dict[str, Any]:
    return await db(_loop)(call.principal, call.arguments)


def _look(principal, arguments: dict[str, Any]) -> dict[str, Any]:
    """Where the feature's judgement is: still to come (pending) or ended, with its run."""
    user = load_user(principal)
    feature = feature_for(
        user=user, principal=principal, ref=arguments["feature"], mission_ref=arguments.get("mission")
    )
    run = ValidatorRun.objects.filter(feature=feature).order_by("-id").first()
    landed = latest_done_task(features=feature)
    awaiting = (
        feature.loop_state == LoopState.IMPLEMENTING
        and landed is not None
        and landed.status == TaskStatus.DONE
        and (run is None or (landed.finished_at is not None and run.started_at < landed.finished_at))
    )
    pending = (
        feature.loop_state == LoopState.VALIDATING or (run is not None and run.status == RunStatus.RUNNING) or awaiting
    )
    return {
        "feature": feature.pk,
        "key": feature.key,
        "loop_state": feature.loop_state,
        "pending": pending,
        "run": s.RunSerializer(run).data if run is not None else None,
        "verdict": _verdict_rows(run.verdict) if run is not None and run.status != RunStatus.RUNNING else [],
    }


async def wait_for_verdict(call: Call) -> dict[str, Any]:
    timeout = min(float(call.arguments.get("timeout", 60)), MAX_WAIT)
    interval = settings.FUSION_MCP_POLL_SECONDS
    started = time.monotonic()
    while True:
        look = await db(_look)(call.principal, call.arguments)
        waited = time.monotonic() - started
        if not look["pending"] or waited >= timeout:
            break
        run = look["run"]
        where = f"run {run['id']} {run['status']}" if run else "waiting for the worker to admit the run"
        await call.progress(round(waited, 1), timeout, f"feature {look['key']}: {look['loop_state']} ({where})")
        await anyio.sleep(min(interval, max(timeout - waited, 0.01)))
    return {
        "feature": look["feature"],
        "finished": not look["pending"],
        "loop_state": look["loop_state"],
        "run": look["run"],
        "verdict": look["verdict"],
        "waited_seconds": round(time.monotonic() - started, 3),
    }


FEATURE_ONLY = {"feature": schemas.FEATURE_ARG, "mission": schemas.MISSION_ARG}

TOOLS = [
    Tool(
        name="feature_validate",
        title="Validate a feature",
        description="Start a validator run for the feature now (as the dashboard's Validate button). Returns the "
        "admission: started (with the run), reused (an identical input already passed), blocked, or the "
        "refusal validation_already_running when a run is in flight.",
        input_schema=schemas.closed(
            {**FEATURE_ONLY, "validator": {"type": "string", "minLength": 1, "description": "Profile override."}},
            ("feature",),
        ),
        output_schema=schemas.ADMISSION,
        handler=feature_validate,
        read_only=False,
    ),
    Tool(
        name="milestone_validate",
        title="Validate a milestone",
        description="Validate the milestone as a whole once every feature under it is done (passed or superseded); "
        "for missions whose autopilot is off (with it on, milestones are validated for you). Its slices are "
        "completed and a validator run judges the milestone's assertions at the newest passed revision of its "
        "features; when it passes, the milestone is complete, and the mission with its last milestone. Returns "
        "outcome started (with the run: wait for it, then look at mission_status), already_running, or complete; "
        "refused with features_open (each feature and its state), dependencies_open, mission_not_active or "
        "no_milestone_revision.",
        input_schema=schemas.closed(
            {"milestone": schemas.MILESTONE_ARG, "mission": schemas.MISSION_ARG}, ("milestone",)
        ),
        output_schema=schemas.MILESTONE_VALIDATION,
        handler=milestone_validate,
        read_only=False,
    ),
    Tool(
        name="feature_loop",
        title="Feature loop",
        description="The feature's loop: state, attempts, fix rounds and budget left, its runs (with failures), "
        "the last verdict per assertion (verdict, message, expected, actual, evidence) and the fix lineage.",
        input_schema=schemas.closed(FEATURE_ONLY, ("feature",)),
        output_schema=schemas.FEATURE_LOOP,
        handler=feature_loop,
    ),
    Tool(
        name="wait_for_verdict",
        title="Wait for a verdict",
        description="Wait until the feature's pending judgement ends (a completed task not yet admitted, or a "
        "running validator run), at most `timeout` seconds (default 60), sending progress notifications while it "
        "waits. Returns the run and its verdict per assertion, or finished=false when the timeout came first. "
        "Returns at once when nothing is pending.",
        input_schema=schemas.closed(
            {**FEATURE_ONLY, "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WAIT}},
            ("feature",),
        ),
        output_schema=schemas.VERDICT,
        handler=wait_for_verdict,
    ),
]
