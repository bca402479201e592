"""The loop's tools: what an agent needs to drive implement -> validate -> fix alone.

Reads are the API's (`mission_tree`, `loop_snapshot`, the serializers); writes go through
the services the API's actions call (`task_complete`, `operator.feature_validate`), with
the API's body serializers in front, so a refusal carries the API's code.
"""

from __future__ import annotations

import re
import time
from types import SimpleNamespace
from typing import Any

import anyio
from django.conf import settings

from missions import selectors
from missions.api.serializers import FeatureSerializer
from missions.api.task_serializers import TaskCompleteSerializer, TaskSerializer
from missions.api.tree import mission_tree
from missions.errors import NotFound
from missions.models import LoopState, Milestone, MissionFeature, MissionStatus, Slice, Task, TaskStatus
from missions.services import tasks as task_services
from missions.transitions.loop import DONE_STATES
from validation.api import serializers as s
from validation.mcp import schemas
from validation.mcp.context import Principal, db, load_user, tool_mission
from validation.mcp.tooling import Call, Tool
from validation.models import RunStatus, ValidatorRun

OPEN = (TaskStatus.TODO, TaskStatus.IN_PROGRESS)
CAUSE = re.compile(r"^## Validation cause$.*", re.M | re.S)


def api_context(user) -> dict[str, Any]:
    # The API's serializers read the requesting user from the request (visibility, staff).
    return {"request": SimpleNamespace(user=user)}


def _visible_object(model, noun: str, *, user, principal: Principal, ref: int | str, mission_ref: int | str | None):
    """A feature or milestone the user may see, by id or by its key within the mission."""
    visible = model.objects.filter(mission__in=selectors.visible_missions(user=user).values("pk"))
    if isinstance(ref, int) or (isinstance(ref, str) and ref.isascii() and ref.isdigit()):
        found = visible.select_related("mission").filter(pk=int(ref)).first()
        if found is not None and principal.mission_id is not None and found.mission_id != principal.mission_id:
            found = None  # a mission endpoint answers for its own mission only
    else:
        mission = tool_mission(user=user, principal=principal, ref=mission_ref)
        found = visible.select_related("mission").filter(mission=mission, key=ref).first()
    if found is None:
        raise NotFound(f"no {noun} {ref!r}", code="not_found")
    return found


def feature_for(*, user, principal: Principal, ref: int | str, mission_ref: int | str | None) -> MissionFeature:
    return _visible_object(MissionFeature, "feature", user=user, principal=principal, ref=ref, mission_ref=mission_ref)


def milestone_for(*, user, principal: Principal, ref: int | str, mission_ref: int | str | None) -> Milestone:
    return _visible_object(Milestone, "milestone", user=user, principal=principal, ref=ref, mission_ref=mission_ref)


def slice_for(*, user, principal: Principal, ref: int | str, mission_ref: int | str | None) -> Slice:
    return _visible_object(Slice, "slice", user=user, principal=principal, ref=ref, mission_ref=mission_ref)


def _task_row(task: Task, user) -> dict[str, Any]:
    return dict(TaskSerializer(task, context=api_context(user)).data)


def _feature_row(feature: MissionFeature, user) -> dict[str, Any]:
    return dict(FeatureSerializer(feature, context=api_context(user)).data)


# ---------------------------------------------------------------- mission_status


def _status(principal: Principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    mission = tool_mission(user=user, principal=principal, ref=arguments.get("mission"))
    tree = mission_tree(mission=mission)
    features = [f for m in tree["milestones"] for sl in m["slices"] for f in sl["features"]]
    passed = sum(1 for f in features if f["loop_state"] in DONE_STATES)
    blocked = [
        {"id": f["id"], "key": f["key"], "title": f["title"], "loop_state": f["loop_state"], **why}
        for f in features
        if f["loop_state"] == LoopState.BLOCKED
        for why in [_blocked_why(f["id"])]
    ]
    open_tasks = list(
        Task.objects.filter(mission=mission, status__in=OPEN)
        .order_by("id")
        .values("id", "feature_id", "status", "title")
    )
    return {
        "mission": {
            "id": mission.pk,
            "key": mission.key,
            "title": mission.title,
            "status": mission.status,
            "status_reason": mission.status_reason,
            "autopilot": mission.autopilot,
            "executor": mission.executor,
            "retry_budget": mission.retry_budget,
        },
        "progress": {
            "features_total": len(features),
            "features_passed": passed,
            "percent": round(100 * passed / len(features)) if features else 0,
        },
        "milestones": tree["milestones"],
        "blocked": blocked,
        "open_tasks": open_tasks,
    }


def _blocked_why(feature_id: int) -> dict[str, Any]:
    feature = MissionFeature.objects.only("stop_reason", "stop_detail", "last_run_id").get(pk=feature_id)
    run = (
        ValidatorRun.objects.filter(pk=feature.last_run_id).only("status", "blocked_reason", "error").first()
        if feature.last_run_id is not None
        else None
    )
    return {
        "stop_reason": feature.stop_reason,
        "stop_detail": feature.stop_detail,
        "blocked_reason": (run.blocked_reason or run.error) if run else "",
    }


async def mission_status(call: Call) -> dict[str, Any]:
    return await db(_status)(call.principal, call.arguments)


# ---------------------------------------------------------------- next_task


def _cause(prompt: str) -> str | None:
    match = CAUSE.search(prompt or "")
    return match.group(0).strip() if match else None


def _next(principal: Principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    mission = tool_mission(user=user, principal=principal, ref=arguments.get("mission"))
    out: dict[str, Any] = {
        "mission": mission.pk,
        "task": None,
        "feature": None,
        "prompt": None,
        "validation_cause": None,
    }
    # An open task of a fix first (it carries the validation cause), then the oldest.
    open_tasks = Task.objects.filter(mission=mission, status__in=OPEN).select_related("feature")
    task = (
        open_tasks.filter(feature__generated_from__isnull=False).order_by("id").first()
        or open_tasks.order_by("id").first()
    )
    if task is not None:
        feature_row = _feature_row(task.feature, user) if task.feature is not None else None
        return {
            **out,
            "kind": "task",
            "reason": "an open task: implement it, commit, then call task_complete with the commit",
            "task": _task_row(task, user),
            "feature": feature_row,
            "prompt": task.prompt,
            "validation_cause": _cause(task.prompt),
        }
    return {**out, "kind": "nothing", "reason": _why_nothing(mission)}


def _why_nothing(mission) -> str:
    if mission.status == MissionStatus.COMPLETE:
        return "the mission is complete"
    if mission.status != MissionStatus.ACTIVE:
        reason = f": {mission.status_reason}" if mission.status_reason else ""
        return f"the mission is {mission.status}{reason}; activate or resume it first"
    states = dict.fromkeys(LoopState.values, 0)
    for state in MissionFeature.objects.filter(mission=mission).values_list("loop_state", flat=True):
        states[state] += 1
    if states[LoopState.VALIDATING] or ValidatorRun.objects.filter(mission=mission, status=RunStatus.RUNNING).exists():
        return f"waiting for validation ({states[LoopState.VALIDATING]} features validating): call wait_for_verdict"
    if states[LoopState.BLOCKED]:
        return f"{states[LoopState.BLOCKED]} features are blocked and need a person (see mission_status)"
    if mission.status_reason:
        return f"the autopilot stopped: {mission.status_reason}"
    if not mission.autopilot:
        return "no open task, and the autopilot is off: create a task for a feature"
    return "no open task yet: the autopilot creates the next ones as the mission advances"


async def next_task(call: Call) -> dict[str, Any]:
    return await db(_next)(call.principal, call.arguments)


# ---------------------------------------------------------------- task_complete


def _complete(principal: Principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    visible = Task.objects.filter(mission__in=selectors.visible_missions(user=user).values("pk"))
    if principal.mission_id is not None:
        visible = visible.filter(mission_id=principal.mission_id)
    task = visible.filter(pk=arguments["task"]).first()
    if task is None:
        raise NotFound(f"no task {arguments['task']!r}", code="not_found")
    body = TaskCompleteSerializer(data={k: arguments[k] for k in ("revision", "summary") if k in arguments})
    body.is_valid(raise_exception=True)
    task = task_services.task_complete(user=user, task=task, **body.validated_data)
    return {"task": _task_row(task, user), "feature_id": task.feature_id}


def _admitted(feature_id: int | None, since_run: int | None) -> dict[str, Any] | None:
    """The judgement a completion started, once the worker has admitted it."""
    if feature_id is None:
        return {"outcome": "not_judged", "detail": "the task has no feature: nothing is validated", "feature": None}
    feature = MissionFeature.objects.get(pk=feature_id)
    run = ValidatorRun.objects.filter(feature_id=feature_id).order_by("-id").first()
    new_run = run is not None and (since_run is None or run.pk > since_run)
    if feature.loop_state == LoopState.IMPLEMENTING and not new_run:
        return None
    outcome = (
        "started"
        if new_run and run is not None and run.status == RunStatus.RUNNING
        else "reused"
        if new_run and run is not None and run.reused_from_id
        else str(feature.loop_state)
    )
    return {
        "outcome": outcome,
        "detail": f"feature {feature.key} is {feature.loop_state}"
        + (f" (run {run.pk}: {run.status})" if new_run and run else ""),
        "run": s.RunSerializer(run).data if new_run else None,
        "loop_state": feature.loop_state,
    }


def _last_run_id(feature_id: int | None) -> int | None:
    if feature_id is None:
        return None
    return ValidatorRun.objects.filter(feature_id=feature_id).order_by("-id").values_list("pk", flat=True).first()


async def task_complete(call: Call) -> dict[str, Any]:
    feature_id = await db(_task_feature)(call.principal, call.arguments["task"])
    before = await db(_last_run_id)(feature_id)
    done = await db(_complete)(call.principal, call.arguments)
    wait = settings.FUSION_MCP_ADMISSION_WAIT
    deadline = time.monotonic() + wait
    admitted = None
    while admitted is None and time.monotonic() < deadline:
        # The outcome is judged by a worker after commit: a few short reads, none held.
        admitted = await db(_admitted)(done["feature_id"], before)
        if admitted is None:
            await _sleep(0.2)
    if admitted is None:
        admitted = {"outcome": "queued", "detail": "the completion is queued for judging: call wait_for_verdict"}
    feature = await db(_feature_by_id)(call.principal, done["feature_id"])
    return {"task": done["task"], "feature": feature, **admitted}


def _task_feature(principal: Principal, task_id: int) -> int | None:
    user = load_user(principal)
    visible = Task.objects.filter(mission__in=selectors.visible_missions(user=user).values("pk"))
    return visible.filter(pk=task_id).values_list("feature_id", flat=True).first()


def _feature_by_id(principal: Principal, feature_id: int | None) -> dict[str, Any] | None:
    if feature_id is None:
        return None
    user = load_user(principal)
    return _feature_row(MissionFeature.objects.get(pk=feature_id), user)


async def _sleep(seconds: float) -> None:
    await anyio.sleep(seconds)


MISSION_ONLY = schemas.closed({"mission": schemas.MISSION_ARG})

TOOLS = [
    Tool(
        name="mission_status",
        title="Mission status",
        description="The mission's state: milestones -> slices -> features with their loop states (idle, "
        "implementing, validating, needs_fix, passed, blocked, superseded), rollups, progress (features passed / "
        "total), the blocked features and why, and the open tasks.",
        input_schema=MISSION_ONLY,
        output_schema=schemas.MISSION_STATUS,
        handler=mission_status,
    ),
    Tool(
        name="next_task",
        title="Next task",
        description="The next thing to work on in the mission: the open task (a fix first) with its full prompt, "
        "including the 'Validation cause' section of a fix (what failed: expected, actual, evidence), or "
        "kind 'nothing' with the reason (waiting for validation, blocked features, mission paused or complete).",
        input_schema=MISSION_ONLY,
        output_schema=schemas.NEXT_TASK,
        handler=next_task,
    ),
    Tool(
        name="task_complete",
        title="Complete a task",
        description="Record a task as done at a revision (a commit id or a ref of the mission's repository, pinned "
        "to its commit id now; an unknown one is refused with unknown_revision) with a summary. Returns the "
        "admission outcome: started (a validator run is judging it), reused, blocked, or queued.",
        input_schema=schemas.closed(
            {
                "task": schemas.ID,
                "revision": {"type": "string", "minLength": 1, "maxLength": 200},
                "summary": {"type": "string", "maxLength": 20000},
            },
            ("task", "revision"),
        ),
        output_schema=schemas.TASK_COMPLETE,
        handler=task_complete,
        read_only=False,
    ),
]
