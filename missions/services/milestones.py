"""Milestone validation and completion (docs/TRUTH.md).

A milestone is complete only while every feature under it is done (passed, or a fix
closed as superseded) and one milestone run passed over exactly its current assertion set
at the milestone's revision: the newest passed feature revision that contains every other
one. Any later change (a feature leaving `passed`, an assertion added, edited, linked or
unlinked) reopens the slice, the milestone and the mission, with events.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from missions.events import publish_on_commit
from missions.models import (
    LoopState,
    Milestone,
    MilestoneStatus,
    Mission,
    MissionFeature,
    MissionStatus,
    Slice,
    SliceStatus,
)
from validation.models import RunScope, RunStatus, ValidatorRun
from validation.selectors import consecutive_errors

ERROR_LIMIT = 3  # consecutive milestone-run errors before the autopilot stops and says so
DONE = (LoopState.PASSED, LoopState.SUPERSEDED)


class NoMilestoneRevision(Exception):
    """The features' passed revisions are not on one line of history."""


def milestone_revision(milestone: Milestone) -> str:
    """The commit a milestone is judged at: among its passed features' revisions, the
    newest that contains every other one (`git merge-base --is-ancestor`)."""
    from fusion_site.base.snapshots import is_ancestor, pin_revision

    workspace = milestone.mission.workspace
    passed = (
        MissionFeature.objects.filter(slice__milestone=milestone, loop_state=LoopState.PASSED, last_run__isnull=False)
        .exclude(last_run__revision="")
        .order_by("-last_run__completed_at", "-last_run_id")
    )
    revisions = list(dict.fromkeys(passed.values_list("last_run__revision", flat=True)))
    if not revisions:
        return pin_revision(workspace, "HEAD")
    for candidate in revisions:
        if all(other == candidate or is_ancestor(workspace, other, candidate) for other in revisions):
            return candidate
    raise NoMilestoneRevision(
        "the passed features' revisions are not on one line of history ("
        + ", ".join(r[:12] for r in revisions[:5])
        + "): merge them and complete a task at the merged revision"
    )


def _milestone_input(milestone: Milestone) -> dict:
    """What a milestone run judges: revision, frozen assertions, profile, protection, and
    the fingerprint over them (a change to any of them needs a new run)."""
    from validation import profiles
    from validation.services.admission import frozen_assertion, input_fingerprint, mission_protection

    mission = milestone.mission
    profile = profiles.get_profile(mission.validator)
    revision = milestone_revision(milestone)
    assertions = [frozen_assertion(a) for a in milestone.assertions.order_by("order", "id")]
    protection = mission_protection(mission, assertions)
    return {
        "profile": profile,
        "revision": revision,
        "assertions": assertions,
        "protection": protection,
        "fingerprint": input_fingerprint(
            revision=revision, assertions=assertions, profile=profile, protection=protection
        ),
    }


def _start_milestone_run(milestone: Milestone, spec: dict) -> ValidatorRun:
    from validation import profiles
    from validation.services.admission import new_run, queue_run, run_started_event

    run = new_run(
        feature=None,
        mission_id=milestone.mission_id,
        milestone_id=milestone.pk,
        trigger="milestone",
        validator=spec["profile"]["name"],
        validator_config=profiles.public_config(spec["profile"]),
        revision=spec["revision"],
        assertions=spec["assertions"],
        protection=spec["protection"],
        fingerprint=spec["fingerprint"],
    )
    run_started_event(run)
    queue_run(run)
    return run


def milestone_ready(*, milestone: Milestone) -> str:
    """Called by the autopilot (under its mission lock) once every slice is complete."""
    from fusion_site.base.snapshots import SnapshotError
    from validation import profiles

    if MissionFeature.objects.filter(slice__milestone=milestone).exclude(loop_state__in=DONE).exists():
        return "waiting"
    if not milestone.assertions.exists():
        return _complete(milestone)
    try:
        spec = _milestone_input(milestone)
    except (NoMilestoneRevision, SnapshotError, profiles.ProfileError) as exc:
        return f"stop:milestone {milestone.key} cannot be validated: {str(exc)[:300]}"
    runs = milestone.runs.filter(scope=RunScope.MILESTONE)
    last = runs.filter(input_fingerprint=spec["fingerprint"]).order_by("-id").first()
    if last is None:
        _start_milestone_run(milestone, spec)
        return "validating_milestone"
    if last.status == RunStatus.RUNNING:
        return "waiting"
    if last.status == RunStatus.PASSED:
        return _complete(milestone)
    if last.status == RunStatus.ERROR and consecutive_errors(runs) < ERROR_LIMIT:
        _start_milestone_run(milestone, spec)
        return "validating_milestone"
    return f"stop:milestone {milestone.key} validation {last.status} (run {last.pk}): {_why(last)}"


def _why(run: ValidatorRun) -> str:
    if run.status == RunStatus.FAILED:
        keys = ", ".join(run.failures.values_list("assertion_key", flat=True)[:10])
        return f"failing {keys}; fixes are generated when the mission has auto_fix"
    return (run.blocked_reason or run.error or run.summary)[:300]


def _complete(milestone: Milestone) -> str:
    Milestone.objects.filter(pk=milestone.pk).update(status=MilestoneStatus.COMPLETE, updated_at=timezone.now())
    publish_on_commit(
        milestone.mission_id,
        "mission:updated",
        {"mission": milestone.mission_id, "change": "milestone_completed", "milestone": milestone.pk},
    )
    return "complete"


# --- reopening ------------------------------------------------------------------------


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
    feature whose contract changed is judged again (validation.services.operator)."""
    from validation.services.operator import revalidate_changed_contracts

    ids = sorted({pk for pk in milestone_ids if pk is not None})
    for milestone_id in ids:
        reopen_milestone(milestone_id=milestone_id, cause=cause)
    revalidate_changed_contracts(milestone_ids=ids, cause=cause)


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
        _notify(mission_id)


def _notify(mission_id: int) -> None:
    from missions.tasks import autopilot_advance

    transaction.on_commit(lambda: autopilot_advance.send(mission_id))


# --- milestone run outcomes -------------------------------------------------------------


def milestone_run_completed(*, run: ValidatorRun, verdict) -> None:
    """A failing milestone run sends each failure back to the feature that answers for it:
    a feature-scoped assertion to the root features linked to it (a regression), a
    milestone-scoped one to the feature that landed last. Each source leaves `passed`
    for `needs_fix` (its last run is now this one, so an operator can always create the
    fix it calls for) and gets a fix feature under the usual lineage and budget rules."""
    from validation.services.outcomes import follow_up

    if verdict.status == "fail":
        for source, keys in regression_sources(run).items():
            follow_up(run.mission_id, "milestone_regression", lambda s=source, k=keys: _send_back(run, s, k))
    _notify(run.mission_id)


def regression_sources(run: ValidatorRun) -> dict[MissionFeature, list[str]]:
    from missions.models import AssertionScope, Task, TaskStatus

    roots = MissionFeature.objects.filter(slice__milestone=run.milestone, generated_from__isnull=True)
    sources: dict[MissionFeature, list[str]] = {}
    for failure in run.failures.select_related("assertion"):
        assertion = failure.assertion
        if assertion is not None and assertion.scope == AssertionScope.FEATURE:
            linked = list(roots.filter(assertions=assertion).order_by("id")) or list(
                assertion.features.order_by("id")[:1]
            )
        else:
            task = (
                Task.objects.filter(feature__in=roots, status=TaskStatus.DONE).order_by("-finished_at", "-id").first()
            )
            linked = [task.feature] if task else list(roots.order_by("-id")[:1])
        for feature in linked:
            sources.setdefault(feature, []).append(failure.assertion_key)
    return sources


def _send_back(run: ValidatorRun, source: MissionFeature, keys: list[str]) -> None:
    from validation.loop import feature_transition
    from validation.services.fixes import fix_create

    source.refresh_from_db()
    if source.loop_state == LoopState.PASSED:
        feature_transition(
            feature=source.pk,
            old=LoopState.PASSED,
            new=LoopState.NEEDS_FIX,
            cause="milestone_regression",
            payload={"run": run.pk, "assertions": keys},
            fields={"last_run": run},
        )
        source.refresh_from_db()
    if source.loop_state == LoopState.NEEDS_FIX and run.mission.auto_fix:
        fix_create(source_id=source.pk, run_id=run.pk, assertion_keys=keys)


def milestone_run_errored(*, run: ValidatorRun, retry: bool) -> None:
    _notify(run.mission_id)
