"""Milestone validation: when every feature of a milestone has passed, one run (scope
`milestone`) judges all its assertions at the workspace's latest revision; the milestone
completes only when such a run passes."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from missions.events import publish_on_commit
from missions.models import Feature, Milestone, MilestoneStatus
from validation.models import RunScope, RunStatus, ValidatorRun


def _start_milestone_run(milestone: Milestone) -> ValidatorRun | None:
    from validation import profiles
    from validation.services.admission import queue_run
    from validation.snapshots import SnapshotError, head_revision

    mission = milestone.mission
    try:
        revision = head_revision(mission.workspace)
        profile = profiles.get_profile(mission.validator)
    except (SnapshotError, profiles.ProfileError) as exc:
        publish_on_commit(mission, "mission:updated", {"mission": mission.pk, "change": "milestone_validation_unavailable",
                                                       "milestone": milestone.pk, "reason": str(exc)[:300]})
        return None
    run = ValidatorRun.objects.create(mission=mission, milestone=milestone, scope=RunScope.MILESTONE, trigger="milestone",
                                      validator=profile["name"], validator_config=profiles.public_config(profile),
                                      revision=revision)
    publish_on_commit(mission, "validator-run:started", {"run": run.pk, "milestone": milestone.pk, "scope": "milestone",
                                                         "trigger": "milestone", "revision": revision})
    queue_run(run.pk)
    return run


def milestone_ready(*, milestone: Milestone) -> str:
    """Called by the autopilot (under its mission lock) once every slice is complete."""
    if not milestone.assertions.exists():
        return _complete(milestone)
    last = milestone.runs.filter(scope=RunScope.MILESTONE).order_by("-id").first()
    changed = Feature.objects.filter(slice__milestone=milestone).aggregate(m=Max("updated_at"))["m"]
    if last is not None and (changed is None or last.created_at >= changed):
        if last.status == RunStatus.RUNNING:
            return "waiting"
        if last.status == RunStatus.PASSED:
            return _complete(milestone)
        return "milestone_" + last.status
    _start_milestone_run(milestone)
    return "validating_milestone"


def _complete(milestone: Milestone) -> str:
    Milestone.objects.filter(pk=milestone.pk).update(status=MilestoneStatus.COMPLETE, updated_at=timezone.now())
    publish_on_commit(milestone.mission_id, "mission:updated", {"mission": milestone.mission_id, "change": "milestone_completed",
                                                                "milestone": milestone.pk})
    return "complete"


def _notify(mission_id: int) -> None:
    from missions.tasks import autopilot_advance

    transaction.on_commit(lambda: autopilot_advance.send(mission_id))


def milestone_run_completed(*, run: ValidatorRun, verdict) -> None:
    _notify(run.mission_id)


def milestone_run_errored(*, run: ValidatorRun, retry: bool) -> None:
    _notify(run.mission_id)
