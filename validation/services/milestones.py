"""Milestone validation (docs/TRUTH.md, "Honest milestones").

A milestone is complete only while every feature under it is done (passed, or a fix
closed as superseded) and one milestone run passed over exactly its current assertion set
at the milestone's revision: the newest passed feature revision that contains every other
one. Completing and reopening are the plan's (`missions/transitions/progress.py`).
"""

from __future__ import annotations

from functools import partial

from fusion_site.base.snapshots import SnapshotError, is_ancestor
from missions.models import LoopState, Milestone, MissionFeature
from missions.transitions.loop import feature_transition
from missions.transitions.progress import milestone_complete
from validation import profiles
from validation.models import RunScope, RunStatus, ValidatorRun
from validation.selectors import consecutive_errors
from validation.services.admission import (
    branch_revision,
    frozen_assertion,
    input_fingerprint,
    mission_protection,
    new_run,
    run_environment,
    run_started_event,
)
from validation.services.fixes import fix_create, regression_sources
from validation.services.follow_up import follow_up
from validation.services.queueing import autopilot_notify, queue_run
from validation.services.run_state import run_cancel

ERROR_LIMIT = 3  # consecutive milestone-run errors before the autopilot stops and says so
DONE = (LoopState.PASSED, LoopState.SUPERSEDED)


class NoMilestoneRevision(Exception):
    """The features' passed revisions are not on one line of history."""


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


def _milestone_input(milestone: Milestone) -> dict:
    """What a milestone run judges: revision, frozen assertions, profile, protection, and
    the fingerprint over them (a change to any of them needs a new run)."""
    mission = milestone.mission
    profile = profiles.get_profile(mission.validator)
    revision, revision_name = milestone_revision(milestone)
    assertions = [frozen_assertion(a) for a in milestone.assertions.order_by("order", "id")]
    protection = mission_protection(mission, assertions)
    return {
        "profile": profile,
        "revision": revision,
        "revision_name": revision_name,
        "assertions": assertions,
        "protection": protection,
        "fingerprint": input_fingerprint(
            revision=revision,
            assertions=assertions,
            profile=profile,
            protection=protection,
            environment=run_environment(mission, milestone),
        ),
    }


def _start_milestone_run(milestone: Milestone, spec: dict) -> ValidatorRun:
    # A run still judging an older input (an assertion changed meanwhile) decides nothing:
    # it is cancelled, and only one milestone run is ever running (docs/TRUTH.md).
    for stale in milestone.runs.filter(scope=RunScope.MILESTONE, status=RunStatus.RUNNING):
        run_cancel(run=stale, reason="the milestone's input changed; a run over the current input replaces it")
    run = new_run(
        feature=None,
        mission_id=milestone.mission_id,
        milestone_id=milestone.pk,
        trigger="milestone",
        validator=spec["profile"]["name"],
        validator_config=profiles.public_config(spec["profile"]),
        revision=spec["revision"],
        revision_name=spec["revision_name"],
        assertions=spec["assertions"],
        protection=spec["protection"],
        fingerprint=spec["fingerprint"],
    )
    run_started_event(run)
    queue_run(run)
    return run


def milestone_ready(*, milestone: Milestone) -> str:
    """Called by the autopilot (under its mission lock) once every slice is complete."""
    if MissionFeature.objects.filter(slice__milestone=milestone).exclude(loop_state__in=DONE).exists():
        return "waiting"
    if not milestone.assertions.exists():
        return milestone_complete(milestone=milestone)
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
        return milestone_complete(milestone=milestone)
    if last.status == RunStatus.ERROR and consecutive_errors(runs) < ERROR_LIMIT:
        _start_milestone_run(milestone, spec)
        return "validating_milestone"
    return f"stop:milestone {milestone.key} validation {last.status} (run {last.pk}): {_why(last)}"


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
    fix it calls for) and gets a fix feature under the usual lineage and budget rules."""
    if verdict.status == "fail":
        for source, keys in regression_sources(run).items():
            follow_up(run.mission_id, "milestone_regression", partial(_send_back, run, source, keys))
    autopilot_notify(run.mission_id)


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
