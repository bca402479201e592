"""The `command` executor's lease (docs/REPOSITORIES.md), held as validator runs hold
theirs: the actor claims a started task by compare-and-swap (`claim_token`, `claimed_by`,
`lease_until`, `executor_attempts`) and renews the lease with a heartbeat while it works;
a redelivered message for a task held under a live lease, or finished, does nothing.
`executor_redrive` (the recovery sweep) sends again the tasks whose executor died — the
lease passed, or, at embedded start-up, any claim of another process — until
`FUSION_EXECUTOR_ATTEMPTS`, then fails them with the reason."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import uuid
from collections.abc import Callable
from datetime import UTC, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fusion_site.repos.snapshots import remove_tree
from fusion_site.runtime.lease import renewing
from fusion_site.runtime.queue import send_on_commit
from missions.errors import Conflict
from missions.locks import lock_mission
from missions.models import Executor, Task, TaskStatus
from missions.services.tasks import task_fail

logger = logging.getLogger(__name__)

ACTOR = "execute_task"
# What the executor names its folders; `executor_redrive` removes those of dead tasks.
CLONE_NAME = re.compile(r"^task-(\d+)-([0-9a-f]{12})$")
_boot: dict[int, str] = {}


def worker_id() -> str:
    """Who holds a claim: host, process and a token of this process's life (a pid is
    reused by the next server, in a container often at once)."""
    pid = os.getpid()
    boot = _boot.setdefault(pid, uuid.uuid4().hex[:8])
    return f"{socket.gethostname()}:{pid}:{boot}"


def _lease() -> timedelta:
    return timedelta(seconds=settings.FUSION_EXECUTOR_LEASE_SECONDS)


def _max_attempts() -> int:
    return max(1, settings.FUSION_EXECUTOR_ATTEMPTS)


def claim(task_id: int) -> tuple[Task | None, str]:
    """Take a started `command` task by compare-and-swap: unclaimed, or its holder's lease
    has passed (the holder died), and attempts left. Two deliveries never both run it."""
    now, token = timezone.now(), uuid.uuid4().hex
    free = Q(claim_token="") | Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    claimed = Task.objects.filter(
        free,
        pk=task_id,
        status=TaskStatus.IN_PROGRESS,
        executor=Executor.COMMAND,
        executor_attempts__lt=_max_attempts(),
    ).update(
        claim_token=token,
        claimed_by=worker_id()[:200],
        lease_until=now + _lease(),
        executor_attempts=F("executor_attempts") + 1,
        updated_at=now,
    )
    if not claimed:
        return None, ""
    return Task.objects.select_related("mission", "feature").get(pk=task_id), token


def heartbeat(task_id: int, token: str) -> contextlib.AbstractContextManager[None]:
    """Renew the task's lease while its executor works: a long command is never re-driven,
    a dead worker stops renewing and its task is re-driven after one lease."""
    held = Task.objects.filter(pk=task_id, claim_token=token, status=TaskStatus.IN_PROGRESS)
    return renewing(held, every=settings.FUSION_EXECUTOR_LEASE_SECONDS / 4, lease=_lease(), name=f"task-{task_id}")


def holds(task_id: int, token: str) -> bool:
    return Task.objects.filter(pk=task_id, claim_token=token, status=TaskStatus.IN_PROGRESS).exists()


def finish(task_id: int, token: str, action: Callable[[Task], object], **still) -> bool:
    """Apply `action` (complete or fail) only while this delivery still holds the task
    (and the row still matches `still`): a claim the sweep took away (its lease passed)
    is never completed by its old holder."""
    with transaction.atomic():
        mission_id = Task.objects.filter(pk=task_id).values_list("mission_id", flat=True).first()
        if mission_id is None:
            return False
        lock_mission(mission_id)  # the lock order of every task service: mission, then task
        task = Task.objects.select_for_update().filter(pk=task_id, claim_token=token, **still).first()
        if task is None or task.status != TaskStatus.IN_PROGRESS:
            return False
        action(task)
    return True


def fail(task_id: int, token: str, reason: str, log: str | None = None) -> str:
    done = finish(task_id, token, lambda t: task_fail(user=None, task=t, reason=reason, log=log))
    return "failed" if done else "lost"


# ---------------------------------------------------------------- recovery


def executor_redrive(*, startup: bool, now=None) -> list[int]:
    """Started `command` tasks whose executor died are sent again, bounded by
    `FUSION_EXECUTOR_ATTEMPTS`; past it they fail with the reason. Dead: the lease passed,
    or — at embedded start-up, when no delivery of the previous process is alive — any
    claim of another process. A task whose message was lost (never claimed) is sent again
    at start-up, or after `FUSION_REDRIVE_GRACE`. The folders of dead executors go.
    Returns the ids of the tasks sent again or failed. A second sweep right after the
    first changes nothing (the sends are claimed, or are duplicates that end stale)."""
    now = now or timezone.now()
    leftovers = _clone_folders()  # listed before the live tasks are read (a new clone is never one)
    me = worker_id()
    grace = timedelta(seconds=settings.FUSION_REDRIVE_GRACE)
    acted = []
    for task in Task.objects.filter(status=TaskStatus.IN_PROGRESS, executor=Executor.COMMAND).order_by("id"):
        if task.claim_token:
            alive = task.claimed_by == me if startup else (task.lease_until is not None and task.lease_until >= now)
            if alive:
                continue
        elif not startup and task.executor_attempts < _max_attempts() and (task.started_at or now) > now - grace:
            continue  # its message is most likely still queued
        if task.executor_attempts >= _max_attempts():
            if _fail_dead(task):
                acted.append(task.pk)
        elif _release(task):
            send_on_commit(ACTOR, task.pk)
            acted.append(task.pk)
    _remove_dead_clones(leftovers, now=now)
    return acted


def _release(task: Task) -> bool:
    """Take a dead holder's claim away: a compare-and-swap on its token and on the lease
    judged dead (a holder that renewed it meanwhile is alive and keeps it)."""
    if not task.claim_token:
        return True
    return bool(
        Task.objects.filter(
            pk=task.pk, status=TaskStatus.IN_PROGRESS, claim_token=task.claim_token, lease_until=task.lease_until
        ).update(claim_token="", lease_until=None)
    )


def _fail_dead(task: Task) -> bool:
    if task.lease_until is not None:
        last = task.lease_until - _lease()  # its last renewal: the last sign of life
        when = f"{last.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    else:
        when = "an unknown time"
    who = f" on {task.claimed_by}" if task.claimed_by else ""
    reason = f"the executor died {task.executor_attempts} times; last at {when}{who}"
    try:
        return finish(
            task.pk,
            task.claim_token,
            lambda t: task_fail(user=None, task=t, reason=reason),
            lease_until=task.lease_until,
        )
    except Conflict:  # finished meanwhile
        return False


def clone_name(task_id: int, token: str) -> str:
    """`task-<pk>-<the claim token's first 12>`: the folder of one claim of a task."""
    return f"task-{task_id}-{token[:12]}"


def _clone_folders() -> list[tuple[int, str, Path]]:
    root = Path(settings.FUSION_SNAPSHOT_DIR)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = CLONE_NAME.match(child.name)
        if match and not child.is_symlink():
            found.append((int(match.group(1)), match.group(2), child))
    return found


def _remove_dead_clones(leftovers: list[tuple[int, str, Path]], *, now) -> None:
    """Remove the folders of claims that are no longer live: a task re-driven and claimed
    again keeps only its new claim's folder."""
    if not leftovers:
        return
    live = {
        clone_name(pk, token)
        for pk, token in Task.objects.filter(
            pk__in={pk for pk, _token, _path in leftovers},
            status=TaskStatus.IN_PROGRESS,
            lease_until__gte=now,
        )
        .exclude(claim_token="")
        .values_list("pk", "claim_token")
    }
    for _pk, _token, path in leftovers:
        if path.name not in live:
            remove_tree(path)
