"""Autopilot (docs/TRUTH.md): strictly serial — the first pending slice of the first
incomplete milestone is activated and triaged into tasks; the next one waits until every
feature of the slice has passed. Event-driven (outcomes notify it); the recovery sweep
re-drives it. A row lock on the mission makes duplicate triggers harmless. Every status it
changes goes through the machines of `missions.transitions` (docs/ARCHITECTURE.md, "State
machines"): a stop is `mission:halted` with its reason, going on again `mission:continued`."""

from __future__ import annotations

from django.db import transaction

from missions.locks import locked_mission
from missions.models import (
    LoopState,
    Milestone,
    MilestoneStatus,
    Mission,
    MissionFeature,
    MissionStatus,
    Slice,
    SliceStatus,
    TaskStatus,
)
from missions.services.tasks import task_create
from missions.transitions import mission_transition, slice_transition
from missions.transitions.loop import DONE_STATES
from missions.transitions.progress import mission_complete, slice_activate
from validation.models import ValidatorRun
from validation.services.milestones import milestone_ready, open_dependencies
from validation.services.queueing import autopilot_notify


def _stop(mission: Mission, reason: str) -> str:
    if mission.status_reason != reason:
        mission_transition(mission=mission, old=mission.status, new=mission.status, cause="halt", reason=reason)
    return "stopped"


def _clear_stop(mission: Mission) -> None:
    if mission.status_reason:
        mission_transition(mission=mission, old=mission.status, new=mission.status, cause="continue")


def _needs_task(feature: MissionFeature) -> bool:
    """Idle and never tasked; or implementing after a repair `clear`, when the last task
    is done and already judged (a failed task waits for a person, never a retry loop)."""
    last = feature.tasks.exclude(status=TaskStatus.CANCELLED).order_by("-id").first()
    if feature.loop_state == LoopState.IDLE:
        return last is None
    if feature.loop_state != LoopState.IMPLEMENTING or last is None or last.status != TaskStatus.DONE:
        return False
    open_fix = feature.generated_fixes.filter(
        loop_state__in=[LoopState.IDLE, LoopState.IMPLEMENTING, LoopState.VALIDATING, LoopState.NEEDS_FIX]
    ).exists()
    if open_fix:
        return False  # it waits for its fix, then is re-validated at the fix's revision
    return ValidatorRun.objects.filter(
        feature=feature, revision=last.revision, created_at__gte=last.finished_at
    ).exists()


def _triage(slice_: Slice) -> int:
    created = 0
    candidates = MissionFeature.objects.filter(slice=slice_, loop_state__in=[LoopState.IDLE, LoopState.IMPLEMENTING])
    for feature in candidates.order_by("order", "id"):
        if _needs_task(feature):
            task_create(user=None, feature=feature)
            created += 1
    return created


def _deps_complete(milestone: Milestone) -> bool:
    return not open_dependencies(milestone).exists()


def _advance_milestone(mission: Mission, milestone: Milestone) -> str:
    for slice_ in milestone.slices.exclude(status=SliceStatus.COMPLETE).order_by("order", "id"):
        if slice_.status == SliceStatus.PENDING:
            slice_activate(slice_=slice_)
            _triage(slice_)
            return "activated"
        features = MissionFeature.objects.filter(slice=slice_)
        blocked = features.filter(loop_state=LoopState.BLOCKED).order_by("id").first()
        if blocked is not None:
            return _stop(
                mission,
                f"feature {blocked.key} is blocked ({blocked.stop_reason or 'validator'}): repair it to continue",
            )
        if features.exclude(loop_state__in=DONE_STATES).exists():
            _triage(slice_)
            _clear_stop(mission)
            return "waiting"
        slice_transition(slice_=slice_, old=slice_.status, new=SliceStatus.COMPLETE, cause="complete")
    state = milestone_ready(milestone=milestone)
    return _stop(mission, state[len("stop:") :]) if state.startswith("stop:") else state


def autopilot_advance(*, mission_id: int) -> str:
    # Most notifications find the autopilot off (every pass sends one): answered without a
    # transaction or the mission's lock. Whoever switches it on or activates the mission
    # notifies it after that commit, so a change in flight now is never missed.
    if not Mission.objects.filter(pk=mission_id, autopilot=True, status=MissionStatus.ACTIVE).exists():
        return "idle"
    return _advance(mission_id=mission_id)


@transaction.atomic
def _advance(*, mission_id: int) -> str:
    mission = locked_mission(pk=mission_id)
    if mission is None or not mission.autopilot or mission.status != MissionStatus.ACTIVE:
        return "idle"
    while True:
        waiting: list[str] = []
        for milestone in mission.milestones.exclude(status=MilestoneStatus.COMPLETE).order_by("order", "id"):
            if not _deps_complete(milestone):
                waiting.append(milestone.key)  # the first milestone that can move goes next
                continue
            state = _advance_milestone(mission, milestone)
            if state != "complete":
                return state
            break  # a milestone completed: scan again from the top (it may unblock an earlier one)
        else:
            if waiting:
                return _stop(mission, f"milestones {', '.join(waiting)} wait for dependencies that cannot complete")
            break
    mission_complete(mission_id=mission.pk)
    return "complete"


def autopilot_redrive() -> list[int]:
    ids = list(Mission.objects.filter(status=MissionStatus.ACTIVE, autopilot=True).values_list("pk", flat=True))
    for pk in ids:
        autopilot_notify(pk)
    return ids
