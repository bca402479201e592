"""How far the plan has come: a milestone completes, and anything that undoes a
completion reopens the slice, the milestone and the mission, with events
(docs/TRUTH.md, "Honest milestones"). Judging whether a milestone may complete is the
validation floor's (`validation/services/milestones.py`). The moves themselves are the
machines' (`missions.transitions.slice`, `.milestone`, `.mission`)."""

from __future__ import annotations

from missions import hooks
from missions.hooks import announce_on_commit
from missions.models import Milestone, MilestoneStatus, MissionFeature, MissionStatus, Slice, SliceStatus
from missions.transitions.milestone import milestone_transition
from missions.transitions.mission import mission_transition
from missions.transitions.slice import slice_transition


def milestone_complete(*, milestone: Milestone) -> str:
    old = Milestone.objects.filter(pk=milestone.pk).values_list("status", flat=True).get()
    if old != MilestoneStatus.COMPLETE:
        milestone_transition(milestone=milestone.pk, old=old, new=MilestoneStatus.COMPLETE, cause="complete")
    return "complete"


def reopen_for_feature(*, feature_id: int, cause: str) -> None:
    """A feature left `passed`: its slice, milestone and mission are not complete any more."""
    slice_id = MissionFeature.objects.filter(pk=feature_id).values_list("slice_id", flat=True).first()
    if slice_id is not None:
        reopen_slice(slice_id=slice_id, cause=cause, feature_id=feature_id)


def reopen_slice(*, slice_id: int, cause: str, **payload) -> None:
    row = Slice.objects.filter(pk=slice_id).values("milestone_id", "status").first()
    if row is None:
        return
    if row["status"] == SliceStatus.COMPLETE:
        slice_transition(
            slice_=slice_id, old=SliceStatus.COMPLETE, new=SliceStatus.ACTIVE, cause=cause, payload=payload
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
        milestone_transition(
            milestone=milestone_id,
            old=MilestoneStatus.COMPLETE,
            new=MilestoneStatus.ACTIVE,
            cause=cause,
            payload=payload,
        )
    if mission_transition(
        mission=mission_id, old=MissionStatus.COMPLETE, new=MissionStatus.ACTIVE, cause=cause, payload=payload
    ):
        announce_on_commit(hooks.mission_may_advance, mission_id=mission_id)
