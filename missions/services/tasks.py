"""Tasks: the unit of execution linked to a feature (docs/TRUTH.md).

Creating a task links it to its feature and moves an idle feature to `implementing`.
Completing it records the revision and, after commit, announces `hooks.task_completed`, which the validation floor judges.
Status moves are the task machine's (`missions.transitions.moves.task_transition`).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from fusion_site.repos.snapshots import FULL_COMMIT, SnapshotError, pin_revision
from fusion_site.runtime.queue import send_on_commit
from missions import fastpaths, hooks
from missions.errors import Conflict, Invalid
from missions.hooks import announce_on_commit
from missions.locks import assert_mission_locked, lock_mission
from missions.models import Executor, LoopState, Mission, MissionFeature, MissionStatus, Task, TaskStatus
from missions.outbox import publish_on_commit
from missions.transitions import FEATURE, TASK, feature_transition, task_transition
from missions.transitions.tables import TASK_EVENT


def _task_payload(task: Task, *, revision: str | None = None, revision_name: str | None = None, **extra) -> dict:
    """What a `task:updated` event says of the task besides its status (`revision` and
    `revision_name` as they are after the change)."""
    revision = task.revision if revision is None else revision
    revision_name = task.revision_name if revision_name is None else revision_name
    return {
        "feature": task.feature_id,
        "revision": revision,
        **({"revision_name": revision_name} if revision_name and revision_name != revision else {}),
        **extra,
    }


def _task_event(task: Task, actor_id: int | None, **extra) -> None:
    publish_on_commit(
        task.mission_id,
        TASK_EVENT,
        {"task": task.pk, "status": task.status, **_task_payload(task, **extra)},
        actor_id=actor_id,
    )


def _move(task: Task, *, new: str, cause: str, user, verb: str, fields: dict, **payload) -> None:
    """Move a task that is locked (called while holding the mission lock) and known to be
    in a state that may move: a lost compare-and-swap cannot happen, and would be refused
    as the state it found."""
    assert_mission_locked(task.mission_id)
    if not task_transition(
        task=task,
        old=task.status,
        new=new,
        cause=cause,
        actor_id=getattr(user, "pk", None),
        fields=fields,
        payload=_task_payload(task, **payload),
    ):
        task.refresh_from_db()
        raise Conflict(f"a {task.status} task cannot {verb}", code="illegal_task_state")


def task_prompt_for(feature: MissionFeature) -> str:
    lines = [f"# {feature.title}"]
    if feature.description.strip():
        lines += ["", feature.description.strip()]
    if feature.acceptance_criteria.strip():
        lines += ["", "## Acceptance criteria", feature.acceptance_criteria.strip()]
    assertions = list(feature.assertions.all())
    if assertions:
        lines += ["", "## Contract assertions (what the validator will check)"]
        lines += [f"- [{a.key}] {a.title}: {a.statement}" for a in assertions]
    return "\n".join(lines).strip() + "\n"


@transaction.atomic
def task_create(
    *, user, title: str = "", prompt: str = "", feature: MissionFeature | None = None, mission: Mission | None = None
) -> Task:
    if mission is None:
        if feature is None:
            raise Invalid("a task needs a feature or a mission", fields={"feature": ["required"]})
        mission = feature.mission
    lock_mission(mission.pk)
    if feature is not None:
        feature = MissionFeature.objects.select_for_update().get(pk=feature.pk)
        if feature.tasks.filter(status__in=TASK.open_states).exists():
            raise Conflict("the feature already has an open task", code="task_open")
    task = Task.objects.create(
        mission=mission,
        feature=feature,
        title=title or (feature.title if feature else "Task"),
        prompt=prompt or (task_prompt_for(feature) if feature else ""),
        executor=mission.executor,
    )
    actor_id = getattr(user, "pk", None)
    _task_event(task, actor_id, change="created")
    if feature is not None and FEATURE.allows(feature.loop_state, LoopState.IMPLEMENTING, "task_linked"):
        fields = {"implementation_attempts": feature.implementation_attempts + 1}
        feature_transition(
            feature=feature.pk,
            old=feature.loop_state,
            new=LoopState.IMPLEMENTING,
            cause="task_linked",
            actor_id=actor_id,
            fields=fields,
            payload={"task": task.pk},
        )
    if mission.executor == Executor.COMMAND and mission.status == MissionStatus.ACTIVE:
        task_start(user=user, task=task)
    return task


@transaction.atomic
def task_start(*, user, task: Task) -> Task:
    lock_mission(task.mission_id)
    task = Task.objects.select_for_update().get(pk=task.pk)
    if task.status == TaskStatus.IN_PROGRESS:
        return task
    if not TASK.allows(task.status, TaskStatus.IN_PROGRESS, "start"):
        raise Conflict(f"a {task.status} task cannot be started", code="illegal_task_state")
    if task.mission.status != MissionStatus.ACTIVE:
        raise Conflict("the mission is not active; activate or resume it first", code="mission_not_active")
    _move(
        task,
        new=TaskStatus.IN_PROGRESS,
        cause="start",
        user=user,
        verb="be started",
        fields={"started_at": timezone.now()},
        change="started",
    )
    if task.executor == Executor.COMMAND:
        send_on_commit("execute_task", task.pk)
    return task


def pin_task_revision(*, mission: Mission, name: str) -> str:
    """The full commit id a completed task is judged at, resolved now (docs/TRUTH.md):
    `main` or `HEAD` moving later never changes it. Unknown names are refused."""
    if not mission.repository:
        if FULL_COMMIT.match(name):
            return name
        raise Invalid(
            f"revision {name!r} cannot be resolved: the mission has no repository; give the full commit id",
            code="unknown_revision",
            fields={"revision": ["not a full commit id"]},
        )
    try:
        return pin_revision(mission.source(), name)
    except SnapshotError as exc:
        raise Invalid(
            f"revision {name!r} is not a commit of the mission's repository ({exc})",
            code="unknown_revision",
            fields={"revision": ["unknown revision"]},
        ) from exc


def task_complete(
    *, user, task: Task, revision: str, summary: str = "", log: str | None = None, fresh: bool = False
) -> Task:
    """Record the landed revision, pinned to its commit id; the outcome is processed after
    commit (idempotently). The revision is resolved before the transaction: a `git
    ls-remote` or a fetch into the mirror (bounded by FUSION_GIT_REMOTE_TIMEOUT) never
    holds the mission's lock, nor SQLite's write lock.

    `fresh`: the caller read `task` with its mission (`select_related("mission")`) just
    now, as the API's visibility check does, so it is not read again before the git work
    (the transaction reads it again, locked, whatever the caller passed)."""
    name = revision.strip()
    if not name:
        raise Invalid("a completed task needs the revision it landed", fields={"revision": ["required"]})
    current = task if fresh and Task.mission.is_cached(task) else Task.objects.select_related("mission").get(pk=task.pk)
    _refuse_ended(current)  # before any git work, as after it
    return _record_completion(
        user=user,
        task=current,
        name=name,
        revision=pin_task_revision(mission=current.mission, name=name),
        summary=summary,
        log=log,
    )


def _refuse_ended(task: Task) -> None:
    """A done task is completed again idempotently (same revision) or refused by the caller."""
    if task.status != TaskStatus.DONE and not TASK.allows(task.status, TaskStatus.DONE, "complete"):
        raise Conflict(f"a {task.status} task cannot be completed", code="illegal_task_state")


@transaction.atomic
def _record_completion(*, user, task: Task, name: str, revision: str, summary: str, log: str | None) -> Task:
    lock_mission(task.mission_id)
    # The task locked (and its mission, locked above); its feature read with it, for `_landed_on`.
    task = fastpaths.task_locked_with_feature(task_id=task.pk)
    _refuse_ended(task)  # it may have ended while the revision was resolved
    if task.status == TaskStatus.DONE:
        if task.revision == revision:
            return task  # the same completion delivered twice: nothing new to do
        raise Conflict(
            "the task is already done at another revision", code="task_already_done", extra={"revision": task.revision}
        )
    now = timezone.now()
    fields = {
        "revision": revision,
        "revision_name": name[:200],
        "summary": summary,
        "finished_at": now,
        "updated_at": now,
    }
    if task.started_at is None:
        fields["started_at"] = now
    if log is not None:
        fields["log"] = log
    _move(
        task,
        new=TaskStatus.DONE,
        cause="complete",
        user=user,
        verb="be completed",
        fields=fields,
        revision=revision,
        revision_name=name[:200],
        change="completed",
    )
    _landed_on(task, getattr(user, "pk", None))
    # The hand-off to judging: validation subscribes to this hook (docs/ARCHITECTURE.md).
    announce_on_commit(hooks.task_completed, task_id=task.pk)
    return task


def _landed_on(task: Task, actor_id: int | None) -> None:
    """New code landed on a feature that is `passed` (or idle): it is not passed any more
    — its pass was at older code — and waits for the judgement of this revision. The
    feature is the one read with the locked task (called while holding the mission lock:
    it is current)."""
    assert_mission_locked(task.mission_id)
    feature = task.feature if task.feature_id else None
    if feature is not None and feature.loop_state in (LoopState.PASSED, LoopState.IDLE):
        feature_transition(
            feature=feature.pk,
            old=feature.loop_state,
            new=LoopState.IMPLEMENTING,
            cause="task_linked",
            actor_id=actor_id,
            payload={"task": task.pk, "revision": task.revision},
            mission_id=feature.mission_id,
        )


@transaction.atomic
def task_fail(*, user, task: Task, reason: str = "", log: str | None = None) -> Task:
    lock_mission(task.mission_id)
    task = Task.objects.select_for_update().get(pk=task.pk)
    if not TASK.allows(task.status, TaskStatus.FAILED, "fail"):
        raise Conflict(f"a {task.status} task cannot fail", code="illegal_task_state")
    now = timezone.now()
    fields = {"summary": reason, "finished_at": now, "updated_at": now}
    if log is not None:
        fields["log"] = log
    _move(
        task,
        new=TaskStatus.FAILED,
        cause="fail",
        user=user,
        verb="fail",
        fields=fields,
        change="failed",
        reason=reason[:500],
    )
    return task
