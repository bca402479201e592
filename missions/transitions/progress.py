"""How far the plan has come: a milestone completes, and anything that undoes a
completion reopens the slice, the milestone and the mission, with events
(docs/TRUTH.md, "Honest milestones"). Judging whether a milestone may complete is the
validation floor's (`validation/services/milestones.py`)."""

from __future__ import annotations

from django.utils import timezone

from missions import hooks
from missions.events import publish_on_commit
from missions.hooks import announce_on_commit
from missions.models import Milestone, MilestoneStatus, Mission, MissionFeature, MissionStatus, Slice, SliceStatus


def milestone_complete(*, milestone: Milestone) -> str:
    Milestone.objects.filter(pk=milestone.pk).update(status=MilestoneStatus.COMPLETE, updated_at=timezone.now())
    publish_on_commit(
        milestone.mission_id,
        "mission:updated",
        {"mission": milestone.mission_id, "change": "milestone_completed", "milestone": milestone.pk},
    )
    return "complete"


def reopen_for_feature(*, feature_id: int, cause: str) -> None:
    """A feature left `passed`: its slice, milestone and mission are not complete any more."""
    slice_id = MissionFeature.objects.filter(pk=feature_id).values_list("slice_id", flat=True).first()
    if slice_id is not None:
        reopen_slice(slice_id=slice_id, cause=cause, feature_id=feature_id)


def reopen_slice(*, slice_id: int, cause: str, **payload) -> None:
    row = Slice.objects.filter(pk=slice_id).values("mission_id", "milestone_id", "status").first()
    if row is None:
        return
    if row["status"] == SliceStatus.COMPLETE:
        Slice.objects.filter(pk=slice_id).update(status=SliceStatus.ACTIVE, updated_at=timezone.now())
        publish_on_commit(
            row["mission_id"],
            "mission:updated",
            {"mission": row["mission_id"], "change": "slice_reopened", "slice": slice_id, "cause": cause, **payload},
        )
    reopen_milestone(milestone_id=row["milestone_id"], cause=cause, **payload)


def milestone_inputs_changed(*, milestone_ids, cause: str) -> None:
    """An assertion was added, edited, linked, unlinked or deleted: the milestone's last
    judgement is no longer over its current set, so it is not complete; and a passed
    feature whose contract changed is judged again (the `contract_changed` hook)."""
    ids = sorted({pk for pk in milestone_ids if pk is not None})
    for milestone_id in ids:
        reopen_milestone(milestone_id=milestone_id, cause=cause)
    hooks.contract_changed.send(sender=None, milestone_ids=ids, cause=cause)


def reopen_milestone(*, milestone_id: int, cause: str, **payload) -> None:
    row = Milestone.objects.filter(pk=milestone_id).values("mission_id", "status").first()
    if row is None:
        return
    mission_id = row["mission_id"]
    if row["status"] == MilestoneStatus.COMPLETE:
        Milestone.objects.filter(pk=milestone_id).update(status=MilestoneStatus.ACTIVE, updated_at=timezone.now())
        publish_on_commit(
            mission_id,
            "mission:updated",
            {
                "mission": mission_id,
                "change": "milestone_reopened",
                "milestone": milestone_id,
                "cause": cause,
                **payload,
            },
        )
    if Mission.objects.filter(pk=mission_id, status=MissionStatus.COMPLETE).update(
        status=MissionStatus.ACTIVE, updated_at=timezone.now()
    ):
        publish_on_commit(
            mission_id,
            "mission:updated",
            {"mission": mission_id, "status": MissionStatus.ACTIVE, "change": "reopened", "cause": cause, **payload},
        )
        announce_on_commit(hooks.mission_may_advance, mission_id=mission_id)
