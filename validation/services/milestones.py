"""Milestone validation (docs/TRUTH.md, "Honest milestones").

A milestone is complete only while every feature under it is done (passed, or a fix
closed as superseded) and one milestone run passed over exactly its current assertion set
at the milestone's revision: the newest passed feature revision that contains every other
one. Completing and reopening are the plan's (`missions/transitions/progress.py`).
"""

from __future__ import annotations

from functools import partial

from django.db.models import QuerySet

from fusion_site.repos.snapshots import SnapshotError, is_ancestor
from missions.errors import Conflict, DomainError, Invalid
from missions.locks import assert_mission_locked
from missions.models import LoopState, Milestone, MilestoneStatus, Mission, MissionFeature, MissionStatus
from missions.transitions import feature_transition
from missions.transitions.loop import DONE_STATES
from missions.transitions.progress import milestone_complete, mission_complete
from validation import profiles
from validation.models import RunScope, RunStatus, RunTrigger, ValidatorRun
from validation.selectors import consecutive_errors
from validation.services.fixes import fix_create, regression_sources
from validation.services.follow_up import follow_up
from validation.services.queueing import autopilot_notify
from validation.services.run_input import RunInput, branch_revision, frozen_assertion, run_input, unpinned
from validation.services.run_state import run_cancel
from validation.services.runs import Admission, launch, new_run

ERROR_LIMIT = 3  # consecutive milestone-run errors before the autopilot stops and says so


class NoMilestoneRevision(Conflict):
    """The features' passed revisions are not on one line of history."""

    code = "no_milestone_revision"


def milestone_revision(milestone: Milestone) -> tuple[str, str]:
    """(commit, branch name) a milestone is judged at: among its passed features'
    revisions, the newest that contains every other one (`git merge-base
    --is-ancestor`), with no name; without any, the head of the mission's branch
    (`branch_revision`)."""
    source = milestone.mission.source()
    passed = (
        MissionFeature.objects.filter(slice__milestone=milestone, loop_state=LoopState.PASSED, last_run__isnull=False)
        .exclude(last_run__revision="")
        .order_by("-last_run__completed_at", "-last_run_id")
    )
    revisions = list(dict.fromkeys(passed.values_list("last_run__revision", flat=True)))
    if not revisions:
        return branch_revision(milestone.mission)
    for candidate in revisions:
        if all(other == candidate or is_ancestor(source, other, candidate) for other in revisions):
            return candidate, ""
    raise NoMilestoneRevision(
        "the passed features' revisions are not on one line of history ("
        + ", ".join(r[:12] for r in revisions[:5])
        + "): merge them and complete a task at the merged revision"
    )


def _milestone_input(milestone: Milestone) -> RunInput:
    """What a milestone run judges: revision, frozen assertions, profile, protection, and
    the fingerprint over them (a change to any of them needs a new run). Refused with the
    codes a feature's validation has for an unknown profile and an unreachable repository."""
    mission = milestone.mission
    try:
        profile = profiles.get_profile(mission.validator)
    except profiles.ProfileError as exc:
        raise Invalid(str(exc), code="unknown_validator") from exc
    assertions = [frozen_assertion(a) for a in milestone.assertions.order_by("order", "id")]
    try:
        revision, revision_name = milestone_revision(milestone)
        return run_input(
            mission=mission,
            milestone=milestone,
            profile=profile,
            assertions=assertions,
            revision=revision,
            revision_name=revision_name,
        )
    except SnapshotError as exc:
        raise unpinned(exc) from exc


def _start_milestone_run(milestone: Milestone, judged: RunInput, *, trigger: str, actor_id: int | None) -> ValidatorRun:
    # A run still judging an older input (an assertion changed meanwhile) decides nothing:
    # it is cancelled, and only one milestone run is ever running (docs/TRUTH.md).
    for stale in milestone.runs.filter(scope=RunScope.MILESTONE, status=RunStatus.RUNNING):
        run_cancel(run=stale, reason="the milestone's input changed; a run over the current input replaces it")
    run = new_run(
        feature=None,
        mission_id=milestone.mission_id,
        milestone_id=milestone.pk,
        trigger=trigger,
        judged=judged,
        actor_id=actor_id,
    )
    launch(run, actor_id=actor_id)
    return run


def open_features(milestone: Milestone) -> QuerySet[MissionFeature]:
    """The features under the milestone that are not done (passed, or a superseded fix)."""
    return MissionFeature.objects.filter(slice__milestone=milestone).exclude(loop_state__in=DONE_STATES)


def open_dependencies(milestone: Milestone) -> QuerySet[Milestone]:
    """The milestones this one depends on that are not complete."""
    return milestone.dependencies.exclude(status=MilestoneStatus.COMPLETE)


def milestone_advance(*, milestone: Milestone, asked: bool = False, actor_id: int | None = None) -> Admission:
    """The one decision on a milestone whose features may all be done, under its mission's
    lock (the autopilot's, a person's request, a milestone run's pass): `waiting` (a
    feature is not done), `complete` (no assertions, or a run over exactly the current
    input passed: `run`), `already_running` (`run`), `started` (a new milestone run,
    `run`), or `stopped` (`detail` says why). A last run over the current input that
    failed, was blocked or cancelled stops the autopilot until something changes; one that
    errored is retried up to `ERROR_LIMIT` times in a row. `asked`: a person asked for
    this validation, so any such run is followed by a new one. Refusals (the revisions
    not on one line of history, the repository or the profile unavailable) are
    `DomainError`s and change nothing. Called while holding the mission lock."""
    assert_mission_locked(milestone.mission_id)
    if open_features(milestone).exists():
        return Admission("waiting")
    if not milestone.assertions.exists():
        return Admission(milestone_complete(milestone=milestone, actor_id=actor_id))
    judged = _milestone_input(milestone)
    runs = milestone.runs.filter(scope=RunScope.MILESTONE)
    last = runs.filter(input_fingerprint=judged.fingerprint).order_by("-id").first()
    if last is not None and last.status == RunStatus.RUNNING:
        return Admission("already_running", last)
    if last is not None and last.status == RunStatus.PASSED:
        return Admission(milestone_complete(milestone=milestone, actor_id=actor_id), last)
    retry = last is not None and last.status == RunStatus.ERROR and consecutive_errors(runs) < ERROR_LIMIT
    if last is None or asked or retry:
        trigger = RunTrigger.MANUAL if asked else RunTrigger.MILESTONE
        return Admission("started", _start_milestone_run(milestone, judged, trigger=trigger, actor_id=actor_id))
    detail = f"milestone {milestone.key} validation {last.status} (run {last.pk}): {_why(last)}"
    return Admission("stopped", last, detail)


# What the autopilot hears from `milestone_advance`; a stop halts the mission with its reason.
_AUTOPILOT_STATES = {"started": "validating_milestone", "already_running": "waiting"}


def milestone_ready(*, milestone: Milestone) -> str:
    """Called by the autopilot, while holding the mission lock, once every slice is complete."""
    assert_mission_locked(milestone.mission_id)
    try:
        step = milestone_advance(milestone=milestone)
    except DomainError as exc:
        return f"stop:milestone {milestone.key} cannot be validated: {exc.detail[:300]}"
    if step.outcome == "stopped":
        return f"stop:{step.detail}"
    return _AUTOPILOT_STATES.get(step.outcome, step.outcome)


def _why(run: ValidatorRun) -> str:
    if run.status == RunStatus.FAILED:
        keys = ", ".join(run.failures.values_list("assertion_key", flat=True)[:10])
        return f"failing {keys}; fixes are generated when the mission has auto_fix"
    return (run.blocked_reason or run.error or run.summary)[:300]


def milestone_run_completed(*, run: ValidatorRun, verdict) -> None:
    """A failing milestone run sends each failure back to the feature that answers for it:
    a feature-scoped assertion to the root features linked to it (a regression), a
    milestone-scoped one to the feature that landed last. Each source leaves `passed`
    for `needs_fix` (its last run is now this one, so an operator can always create the
    fix it calls for) and gets a fix feature under the usual lineage and budget rules.

    A pass completes the milestone (and the mission with its last milestone) here when the
    mission's autopilot is off: a person asked for the run, and nobody else would. With the
    autopilot on, the autopilot completes it, as it completes everything it drives. Called
    while holding the mission lock."""
    assert_mission_locked(run.mission_id)
    if verdict.status == "fail":
        for source, keys in regression_sources(run).items():
            follow_up(run.mission_id, "milestone_regression", partial(_send_back, run, source, keys))
    elif verdict.status == "pass":
        autopilot, status = Mission.objects.filter(pk=run.mission_id).values_list("autopilot", "status").get()
        if not autopilot and status == MissionStatus.ACTIVE:
            follow_up(run.mission_id, "milestone_complete", partial(_complete_after_pass, run))
    autopilot_notify(run.mission_id)


def _complete_after_pass(run: ValidatorRun) -> None:
    """The decision again, now that the run has passed: the milestone completes when its
    features are still all done and the run judged its current input (else a run over the
    current input starts, as the autopilot would start it)."""
    milestone = Milestone.objects.select_related("mission").get(pk=run.milestone_id)
    if milestone_advance(milestone=milestone).outcome == "complete":
        mission_complete(mission_id=run.mission_id)


def _send_back(run: ValidatorRun, source: MissionFeature, keys: list[str]) -> None:
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
    autopilot_notify(run.mission_id)
