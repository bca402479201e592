"""Step 1, a completed task (the order: `verdicts/__init__.py`; docs/TRUTH.md): the
guards that decide whether its revision is judged, then admission (step 2)."""

from __future__ import annotations

from django.db import transaction

from missions.models import LoopState, MissionStatus, Task, TaskStatus
from missions.outbox import publish_on_commit, published_together
from missions.transitions import FEATURE
from validation import fastpaths
from validation.selectors import feature_revision
from validation.services.verdicts.admit import admit


def _warn(task: Task, reason: str) -> None:
    publish_on_commit(
        task.mission_id,
        "task:updated",
        {"task": task.pk, "feature": task.feature_id, "status": task.status, "warning": reason},
    )


@transaction.atomic
@published_together()
def task_outcome_process(*, task_id: int) -> str:
    """The `process_task_outcome` message's work: the admission's outcome, or why the
    completion starts nothing (skipped, not_done, superseded, duplicate, mission_inactive,
    not_implementing)."""
    try:
        task = fastpaths.task_with_feature(task_id=task_id)
    except Task.DoesNotExist:
        return "skipped"
    if task.feature is None:  # loaded with the task (select_related)
        return "skipped"
    if task.status != TaskStatus.DONE:
        return "not_done"
    feature = task.feature
    if task.revision != feature_revision(feature):
        # A later revision landed on this feature (a newer task, a fix's pass): this late
        # message would judge older code; the newer one drives the feature.
        return "superseded"
    if (
        fastpaths.judging_run_id(feature_id=feature.pk, revision=task.revision, attempt=feature.implementation_attempts)
        is not None
    ):
        return "duplicate"  # the same completion delivered twice: no second run
    if task.mission.status != MissionStatus.ACTIVE:
        _warn(task, f"mission is {task.mission.status}; the task outcome was recorded and nothing runs")
        return "mission_inactive"
    # A task that lands while its feature waits for a fix is judged too (its newest code).
    if not FEATURE.allows(feature.loop_state, LoopState.VALIDATING, "task_done"):
        _warn(task, f"feature is {feature.loop_state}, not implementing; no validation started")
        return "not_implementing"
    trigger = "fix" if feature.generated_from_id else "task"
    # In this transaction, no savepoint of its own: an exception fails the whole step anyway.
    return admit(
        feature_id=feature.pk, trigger=trigger, cause="task_done", revision=task.revision, mission_id=feature.mission_id
    ).outcome
