"""Autopilot (DESIGN §4.6): strictly serial — the first pending slice of the first
incomplete milestone is activated and triaged into tasks; the next one waits until every
feature of the slice has passed. Event-driven (outcomes notify it); the recovery sweep
re-drives it. A row lock on the mission makes duplicate triggers harmless."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from missions.events import publish_on_commit
from missions.models import (
    Feature, LoopState, Milestone, MilestoneStatus, Mission, MissionStatus, Slice, SliceStatus, TaskStatus,
)


def _stop(mission: Mission, reason: str) -> str:
    if mission.status_reason != reason:
        Mission.objects.filter(pk=mission.pk).update(status_reason=reason, updated_at=timezone.now())
        publish_on_commit(mission, "mission:updated", {"mission": mission.pk, "status": mission.status,
                                                       "change": "autopilot_stopped", "reason": reason})
    return "stopped"


def _clear_stop(mission: Mission) -> None:
    if mission.status_reason:
        Mission.objects.filter(pk=mission.pk).update(status_reason="", updated_at=timezone.now())
        publish_on_commit(mission, "mission:updated", {"mission": mission.pk, "status": mission.status,
                                                       "change": "autopilot_continued"})


def _triage(slice_: Slice) -> int:
    from missions.services.tasks import task_create

    created = 0
    for feature in Feature.objects.filter(slice=slice_, loop_state=LoopState.IDLE).order_by("order", "id"):
        if not feature.tasks.exclude(status=TaskStatus.CANCELLED).exists():
            task_create(user=None, feature=feature)
            created += 1
    return created


def _activate_slice(mission: Mission, slice_: Slice) -> None:
    now = timezone.now()
    Slice.objects.filter(pk=slice_.pk).update(status=SliceStatus.ACTIVE, activated_at=now, updated_at=now)
    Milestone.objects.filter(pk=slice_.milestone_id, status=MilestoneStatus.PENDING).update(
        status=MilestoneStatus.ACTIVE, updated_at=now)
    publish_on_commit(mission, "slice:activated", {"slice": slice_.pk, "milestone": slice_.milestone_id, "key": slice_.key})
    _triage(slice_)


def _deps_complete(milestone: Milestone) -> bool:
    return not milestone.dependencies.exclude(status=MilestoneStatus.COMPLETE).exists()


@transaction.atomic
def autopilot_advance(*, mission_id: int) -> str:
    mission = Mission.objects.select_for_update().filter(pk=mission_id).first()
    if mission is None or not mission.autopilot or mission.status != MissionStatus.ACTIVE:
        return "idle"
    for milestone in mission.milestones.exclude(status=MilestoneStatus.COMPLETE).order_by("order", "id"):
        if not _deps_complete(milestone):
            return _stop(mission, f"milestone {milestone.key} waits for its dependencies")
        for slice_ in milestone.slices.exclude(status=SliceStatus.COMPLETE).order_by("order", "id"):
            if slice_.status == SliceStatus.PENDING:
                _activate_slice(mission, slice_)
                return "activated"
            features = Feature.objects.filter(slice=slice_)
            blocked = features.filter(loop_state=LoopState.BLOCKED).order_by("id").first()
            if blocked is not None:
                return _stop(mission, f"feature {blocked.key} is blocked ({blocked.stop_reason or 'validator'}): "
                                      f"repair it to continue")
            if features.exclude(loop_state=LoopState.PASSED).exists():
                _triage(slice_)
                _clear_stop(mission)
                return "waiting"
            Slice.objects.filter(pk=slice_.pk).update(status=SliceStatus.COMPLETE, updated_at=timezone.now())
            publish_on_commit(mission, "mission:updated", {"mission": mission.pk, "change": "slice_completed", "slice": slice_.pk})
        from missions.services.milestones import milestone_ready

        state = milestone_ready(milestone=milestone)
        if state.startswith("stop:"):
            return _stop(mission, state[len("stop:"):])
        if state != "complete":
            return state
    Mission.objects.filter(pk=mission.pk).update(status=MissionStatus.COMPLETE, status_reason="", updated_at=timezone.now())
    publish_on_commit(mission, "mission:updated", {"mission": mission.pk, "status": MissionStatus.COMPLETE, "change": "completed"})
    return "complete"


def autopilot_redrive() -> list[int]:
    from missions.tasks import autopilot_advance as actor

    ids = list(Mission.objects.filter(status=MissionStatus.ACTIVE, autopilot=True).values_list("pk", flat=True))
    for pk in ids:
        transaction.on_commit(lambda pk=pk: actor.send(pk))
    return ids
