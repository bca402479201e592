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
from validation.selectors import consecutive_errors


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


ERROR_LIMIT = 3  # consecutive milestone-run errors before the autopilot stops and says so


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
        errors = consecutive_errors(milestone.runs.filter(scope=RunScope.MILESTONE))
        if last.status == RunStatus.ERROR and errors < ERROR_LIMIT:
            _start_milestone_run(milestone)
            return "validating_milestone"
        return f"stop:milestone {milestone.key} validation {last.status} (run {last.pk}): {_why(last)}"
    _start_milestone_run(milestone)
    return "validating_milestone"


def _why(run: ValidatorRun) -> str:
    if run.status == RunStatus.FAILED:
        keys = ", ".join(run.failures.values_list("assertion_key", flat=True)[:10])
        return f"failing {keys}; fixes are generated when the mission has auto_fix"
    return (run.blocked_reason or run.error or run.summary)[:300]


def _complete(milestone: Milestone) -> str:
    Milestone.objects.filter(pk=milestone.pk).update(status=MilestoneStatus.COMPLETE, updated_at=timezone.now())
    publish_on_commit(milestone.mission_id, "mission:updated", {"mission": milestone.mission_id, "change": "milestone_completed",
                                                                "milestone": milestone.pk})
    return "complete"


def _notify(mission_id: int) -> None:
    from missions.tasks import autopilot_advance

    transaction.on_commit(lambda: autopilot_advance.send(mission_id))


def milestone_run_completed(*, run: ValidatorRun, verdict) -> None:
    """A failing milestone run sends each failure back to the feature that answers for it:
    a feature-scoped assertion to the root features linked to it (a regression), a
    milestone-scoped one to the feature that landed last. Each source leaves `passed`
    for `needs_fix` and gets a fix feature under the usual lineage and budget rules."""
    if verdict.status == "fail":
        for source, keys in _regression_sources(run).items():
            _send_back(run, source, keys)
    _notify(run.mission_id)


def _regression_sources(run: ValidatorRun) -> dict[Feature, list[str]]:
    from missions.models import AssertionScope, Task, TaskStatus

    roots = Feature.objects.filter(slice__milestone=run.milestone, generated_from__isnull=True)
    sources: dict[Feature, list[str]] = {}
    for failure in run.failures.select_related("assertion"):
        assertion = failure.assertion
        if assertion is not None and assertion.scope == AssertionScope.FEATURE:
            linked = list(roots.filter(assertions=assertion).order_by("id")) or list(assertion.features.order_by("id")[:1])
        else:
            task = Task.objects.filter(feature__in=roots, status=TaskStatus.DONE).order_by("-finished_at", "-id").first()
            linked = [task.feature] if task else list(roots.order_by("-id")[:1])
        for feature in linked:
            sources.setdefault(feature, []).append(failure.assertion_key)
    return sources


def _send_back(run: ValidatorRun, source: Feature, keys: list[str]) -> None:
    from missions.models import LoopState
    from validation.loop import feature_transition
    from validation.services.fixes import fix_create

    source.refresh_from_db()
    if source.loop_state == LoopState.PASSED:
        feature_transition(feature=source.pk, old=LoopState.PASSED, new=LoopState.NEEDS_FIX, cause="milestone_regression",
                           payload={"run": run.pk, "assertions": keys})
        source.refresh_from_db()
    if source.loop_state == LoopState.NEEDS_FIX and run.mission.auto_fix:
        fix_create(source_id=source.pk, run_id=run.pk, assertion_keys=keys)


def milestone_run_errored(*, run: ValidatorRun, retry: bool) -> None:
    _notify(run.mission_id)
