"""Mission lifecycle (docs/ARCHITECTURE.md, "State machines"): activate, pause, resume
(all-or-nothing), autopilot. Status moves are the mission machine's
(`missions.transitions.MISSION`); switching the autopilot is `mission:autopilot`."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from missions import hooks
from missions.errors import Conflict
from missions.hooks import announce_on_commit
from missions.locks import lock_mission, locked_mission
from missions.models import LoopState, Mission, MissionFeature, MissionStatus, StopReason
from missions.outbox import publish_on_commit
from missions.transitions import MISSION, feature_transition, mission_transition

# A resume cannot clear these: they need a repair (clear / re-run) of the feature itself.
HARD_BLOCKS = (StopReason.BUDGET_EXHAUSTED, StopReason.VALIDATOR_UNAVAILABLE, StopReason.FINGERPRINT)


def _set_status(mission: Mission, new: str, *, user, cause: str, change: str) -> Mission:
    with transaction.atomic():
        lock_mission(mission.pk)
        old = Mission.objects.filter(pk=mission.pk).values_list("status", flat=True).get()
        if not MISSION.names(old, new, cause) or not mission_transition(
            mission=mission.pk, old=old, new=new, cause=cause, actor_id=getattr(user, "pk", None)
        ):
            mission.refresh_from_db()
            raise Conflict(
                f"a {mission.status} mission cannot be {change}",
                code="illegal_mission_state",
                extra={"status": mission.status},
            )
        mission.refresh_from_db()
        _kick_autopilot(mission)
    return mission


def _kick_autopilot(mission: Mission) -> None:
    if mission.autopilot and mission.status == MissionStatus.ACTIVE:
        announce_on_commit(hooks.mission_may_advance, mission_id=mission.pk)


def mission_activate(*, mission: Mission, user) -> Mission:
    return _set_status(
        mission,
        MissionStatus.ACTIVE,
        user=user,
        cause="activate",
        change="activated",
    )


def mission_pause(*, mission: Mission, user) -> Mission:
    return _set_status(
        mission,
        MissionStatus.PAUSED,
        user=user,
        cause="pause",
        change="paused",
    )


def resume_blockers(mission: Mission) -> list[dict]:
    blocked = MissionFeature.objects.filter(mission=mission, loop_state=LoopState.BLOCKED, stop_reason__in=HARD_BLOCKS)
    return [
        {
            "feature": f.pk,
            "key": f.key,
            "reason": f.stop_reason,
            "since": f.stopped_at.isoformat() if f.stopped_at else None,
        }
        for f in blocked.order_by("id")
    ]


@transaction.atomic
def mission_resume(*, mission: Mission, user) -> Mission:
    found = locked_mission(pk=mission.pk)
    if found is None:
        raise Mission.DoesNotExist(f"mission {mission.pk} does not exist")
    mission = found
    if not MISSION.names(mission.status, MissionStatus.ACTIVE, "resume"):
        raise Conflict(f"a {mission.status} mission cannot be resumed", code="illegal_mission_state")
    blockers = resume_blockers(mission)
    if blockers:
        raise Conflict(
            "some blockers cannot be cleared by resuming; repair them first",
            code="resume_conflict",
            extra={"blockers": blockers},
        )
    for f in MissionFeature.objects.filter(
        mission=mission, loop_state=LoopState.BLOCKED, stop_reason=StopReason.OPERATOR
    ):
        feature_transition(
            feature=f.pk,
            old=LoopState.BLOCKED,
            new=LoopState.IMPLEMENTING,
            cause="resume",
            actor_id=getattr(user, "pk", None),
            fields={"stop_reason": "", "stop_detail": "", "stopped_at": None},
        )
    return _set_status(
        mission,
        MissionStatus.ACTIVE,
        user=user,
        cause="resume",
        change="resumed",
    )


@transaction.atomic
def mission_set_autopilot(*, mission: Mission, user, enabled: bool) -> Mission:
    Mission.objects.filter(pk=mission.pk).update(autopilot=enabled, updated_at=timezone.now())
    mission.refresh_from_db()
    publish_on_commit(
        mission,
        "mission:autopilot",
        {"mission": mission.pk, "status": mission.status, "enabled": enabled},
        actor_id=getattr(user, "pk", None),
    )
    _kick_autopilot(mission)
    return mission
