"""How far the plan has come: a slice starts (and its milestone with it), a milestone
completes, the mission completes with its last milestone, and anything that undoes a
completion reopens the slice, the milestone and the mission, with events
(docs/TRUTH.md, "A slice, a milestone, a mission is complete when"): a feature leaving
`passed`, a changed contract, and new or moved work (`work_added`). Judging whether a
milestone may complete is the validation floor's (`validation/services/milestones.py`).
The moves themselves are the machines' (`missions.transitions.moves`)."""

from __future__ import annotations

from django.utils import timezone

from missions import hooks
from missions.hooks import announce_on_commit
from missions.models import (
    ContractAssertion,
    Milestone,
    MilestoneStatus,
    MissionFeature,
    MissionStatus,
    Slice,
    SliceStatus,
)
from missions.transitions.moves import milestone_transition, mission_transition, slice_transition


def slice_activate(*, slice_: Slice, actor_id: int | None = None) -> bool:
    """A pending slice starts (`activated_at`), and its milestone with it while that is
    pending (else a lost compare-and-swap: no move). False when the slice was not pending."""
    moved = slice_transition(
        slice_=slice_,
        old=SliceStatus.PENDING,
        new=SliceStatus.ACTIVE,
        cause="activate",
        actor_id=actor_id,
        fields={"activated_at": timezone.now()},
        payload={"milestone": slice_.milestone_id, "key": slice_.key},
    )
    milestone_activate(milestone_id=slice_.milestone_id, actor_id=actor_id, slice=slice_.pk)
    return moved


def milestone_activate(*, milestone_id: int, actor_id: int | None = None, **payload) -> bool:
    """A pending milestone starts; any other state stays as it is (False)."""
    return milestone_transition(
        milestone=milestone_id,
        old=MilestoneStatus.PENDING,
        new=MilestoneStatus.ACTIVE,
        cause="activate",
        actor_id=actor_id,
        payload=payload,
    )


def milestone_complete(*, milestone: Milestone, actor_id: int | None = None) -> str:
    old = Milestone.objects.filter(pk=milestone.pk).values_list("status", flat=True).get()
    if old != MilestoneStatus.COMPLETE:
        milestone_transition(
            milestone=milestone.pk, old=old, new=MilestoneStatus.COMPLETE, cause="complete", actor_id=actor_id
        )
    return "complete"


def mission_complete(*, mission_id: int, actor_id: int | None = None) -> bool:
    """An active mission whose every milestone is complete is complete (True when it moved
    now; a mission that is not active, or another writer first, is no move)."""
    if Milestone.objects.filter(mission_id=mission_id).exclude(status=MilestoneStatus.COMPLETE).exists():
        return False
    return mission_transition(
        mission=mission_id, old=MissionStatus.ACTIVE, new=MissionStatus.COMPLETE, cause="complete", actor_id=actor_id
    )


def reopen_for_feature(*, feature_id: int, cause: str) -> None:
    """A feature left `passed`: its slice, milestone and mission are not complete any more."""
    slice_id = MissionFeature.objects.filter(pk=feature_id).values_list("slice_id", flat=True).first()
    if slice_id is not None:
        reopen_slice(slice_id=slice_id, cause=cause, feature_id=feature_id)


def reopen_slice(*, slice_id: int, cause: str, **payload) -> bool:
    """Reopen the slice (if complete), its milestone and its mission. True when the
    mission was reopened (the autopilot is then told to look again)."""
    row = Slice.objects.filter(pk=slice_id).values("milestone_id", "status").first()
    if row is None:
        return False
    if row["status"] == SliceStatus.COMPLETE:
        slice_transition(
            slice_=slice_id, old=SliceStatus.COMPLETE, new=SliceStatus.ACTIVE, cause=cause, payload=payload
        )
    return reopen_milestone(milestone_id=row["milestone_id"], cause=cause, **payload)


def milestone_inputs_changed(*, milestone_ids, cause: str) -> None:
    """An assertion was added, edited, linked, unlinked or deleted: the milestone's last
    judgement is no longer over its current set, so it is not complete; and a passed
    feature whose contract changed is judged again (the `contract_changed` hook)."""
    ids = sorted({pk for pk in milestone_ids if pk is not None})
    for milestone_id in ids:
        reopen_milestone(milestone_id=milestone_id, cause=cause)
    hooks.contract_changed.send(sender=None, milestone_ids=ids, cause=cause)


def reopen_milestone(*, milestone_id: int, cause: str, **payload) -> bool:
    """Reopen the milestone (if complete) and its mission; True when the mission was reopened."""
    row = Milestone.objects.filter(pk=milestone_id).values("mission_id", "status").first()
    if row is None:
        return False
    if row["status"] == MilestoneStatus.COMPLETE:
        milestone_transition(
            milestone=milestone_id,
            old=MilestoneStatus.COMPLETE,
            new=MilestoneStatus.ACTIVE,
            cause=cause,
            payload=payload,
        )
    return reopen_mission(mission_id=row["mission_id"], cause=cause, **payload)


def reopen_mission(*, mission_id: int, cause: str, **payload) -> bool:
    """Reopen the mission if it is complete (True), and let the autopilot look again."""
    if not mission_transition(
        mission=mission_id, old=MissionStatus.COMPLETE, new=MissionStatus.ACTIVE, cause=cause, payload=payload
    ):
        return False
    announce_on_commit(hooks.mission_may_advance, mission_id=mission_id)
    return True


def work_added(
    *,
    mission_id: int,
    cause: str,
    under_slice: int | None = None,
    under_milestone: int | None = None,
    left_milestone: int | None = None,
    **payload,
) -> None:
    """New or moved work lies under the slice `under_slice` (a feature), the milestone
    `under_milestone` (a slice) or the mission (a milestone): every complete node above it
    is not complete any more and is reopened, the cause named in each event, `payload`
    (what was added: `feature_id`, `slice_id`, `milestone_id`) in each (docs/TRUTH.md).

    `left_milestone`: the work moved out of this other milestone. What stays there is as
    done as before, so its slices stay as they are (a slice left with only done features is
    completed by the autopilot, by the usual rules, when it looks next); but a milestone
    with assertions is judged at a revision taken from its features' revisions, which the
    move may have changed, so it is reopened and judged again at its new revision (an
    unchanged input reuses its passed milestone run). The autopilot is told to look again
    in every case, after commit."""
    if under_slice is not None:
        reopened = reopen_slice(slice_id=under_slice, cause=cause, **payload)
    elif under_milestone is not None:
        reopened = reopen_milestone(milestone_id=under_milestone, cause=cause, **payload)
    else:
        reopened = reopen_mission(mission_id=mission_id, cause=cause, **payload)
    if left_milestone is not None and ContractAssertion.objects.filter(milestone_id=left_milestone).exists():
        reopened = reopen_milestone(milestone_id=left_milestone, cause=cause, **payload) or reopened
    if not reopened:  # a reopened mission has told the autopilot already
        announce_on_commit(hooks.mission_may_advance, mission_id=mission_id)


# Where new or moved work lands: every writer of the plan (services, mission files, admin)
# reports it here, with where the work was before (None: it is new).


def milestone_placed(*, mission_id: int, milestone_id: int) -> None:
    """A milestone was created in the mission."""
    work_added(mission_id=mission_id, cause="milestone_created", milestone_id=milestone_id)


def slice_placed(*, mission_id: int, slice_id: int, milestone_id: int, was: int | None = None) -> None:
    """A slice was created under `milestone_id` (`was` None) or moved there from the
    milestone `was`."""
    if was is None:
        work_added(mission_id=mission_id, cause="slice_created", under_milestone=milestone_id, slice_id=slice_id)
    elif was != milestone_id:
        work_added(
            mission_id=mission_id,
            cause="slice_moved",
            under_milestone=milestone_id,
            left_milestone=was,
            slice_id=slice_id,
        )


def feature_placed(
    *, mission_id: int, feature_id: int, slice_id: int, milestone_id: int, was: tuple[int, int] | None = None
) -> None:
    """A feature was created in the slice `slice_id` of `milestone_id` (`was` None) or
    moved there from `was`: (its slice, that slice's milestone) before the move."""
    if was is None:
        work_added(mission_id=mission_id, cause="feature_created", under_slice=slice_id, feature_id=feature_id)
    elif was[0] != slice_id:
        work_added(
            mission_id=mission_id,
            cause="feature_moved",
            under_slice=slice_id,
            left_milestone=was[1] if was[1] != milestone_id else None,
            feature_id=feature_id,
        )
