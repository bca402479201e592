"""The `command` task executor: runs the mission's `executor_command` for a started task
in a private working clone made from the worker's mirror of the source — never in the
user's checkout — and pushes the result to the source (docs/REPOSITORIES.md).

- **Where a task starts.** At the newest revision a task of the mission landed: tasks of
  one mission build on each other, so a fix (and a feature's next task) starts from the
  code it fixes, and a milestone's features stay on one line of history (what milestone
  validation judges). Before any task landed: the head of the mission's `branch` when it
  names one (the line of work a validation without a landed revision judges, too), else
  the mission's pinned base (`base_commit`, the commit its `base_revision` named when a
  person set it), else the head of the source's default branch.
- **The clone.** `git clone --shared` of the mirror: the mirror's objects are read through
  `objects/info/alternates`, everything new is written into the clone only, and the
  mirror is held (`mirrors.in_use`) so that eviction never removes it under the clone. A
  partial mirror makes a partial clone whose missing file contents come from the source.
  The clone lives in `FUSION_SNAPSHOT_DIR/task-<pk>-<hex>/` and is always removed.
- **Exit 0.** Leftovers are committed, and the commit is pushed to
  `refs/heads/fusion/<mission key>/<feature key>-<task id>` on the source — from a bare
  repository of ours that reads the clone's objects: git never reads the clone's config
  (which the command could have changed: a URL, a hook, an ssh command) while it holds
  the source's credentials. The command itself never gets them (`scrubbed_env`). Then
  the task's revision is the pushed commit (`task_complete`). Anything else — a failing
  command, a refused push — fails the task with the (scrubbed) reason.
- **A lease, like validator runs'**: `missions/services/executor_lease.py`.
- Tasks of one mission run one at a time on a host (a lock file in the repository cache),
  in the order they were made (an older started task goes first: its executor holds its
  claim, or its message is on its way),
  so that each starts from what the one before it landed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from fusion_site.repos import mirrors, refs
from fusion_site.repos.mirrors import FULL_COMMIT
from fusion_site.repos.snapshots import mission_folder, remove_tree, snapshot_root
from fusion_site.repos.sources import SnapshotError, Source, SourceUnavailable, run_git, scrub
from fusion_site.runtime.proc import CommandError, CommandResult, run_command, scrubbed_env
from fusion_site.runtime.redact import redact
from fusion_site.runtime.sandbox import Confinement
from missions.models import Executor, Mission, Task, TaskStatus
from missions.services.executor_lease import claim, clone_name, fail, finish, heartbeat, holds
from missions.services.tasks import task_complete
from missions.services.verdict_settings import mission_base

logger = logging.getLogger(__name__)

IDENTITY = (("user.name", "Fusion Missions"), ("user.email", "fusion@localhost"))


class ExecutorFailed(Exception):
    """The task fails with this reason (and the command's log, when it ran)."""

    def __init__(self, reason: str, log: str | None = None):
        super().__init__(reason)
        self.reason, self.log = reason, log


def result_branch(task: Task) -> str:
    """`fusion/<mission key>/<feature key>-<task id>`: where a task's result is pushed."""
    feature = task.feature.key if task.feature_id and task.feature else "task"
    return f"fusion/{_ref_part(task.mission.key)}/{_ref_part(feature)}-{task.pk}"


def _ref_part(key: str) -> str:
    # Keys are slugs; anything else a ref name could not hold (or that reads as an option) goes.
    return re.sub(r"[^A-Za-z0-9_-]+", "-", key).strip("-") or "x"


# ---------------------------------------------------------------- the actor's work


def task_execute(*, task_id: int) -> str:
    """Run one started `command` task to its end. Returns done, failed, stale (another
    delivery holds it, or it is finished) or lost (the claim was taken away meanwhile)."""
    task, token = claim(task_id)
    if task is None:
        return "stale"
    with heartbeat(task.pk, token):
        try:
            return _execute(task, token)
        except Exception as exc:  # a defect of ours: fail the task now instead of leaving it in progress
            logger.exception("the executor of task %s crashed with an unexpected error", task.pk)
            return fail(task.pk, token, f"unexpected {type(exc).__name__}: {exc}"[:2000])


def _execute(task: Task, token: str) -> str:
    mission = task.mission
    if not mission.executor_command.strip():
        return fail(task.pk, token, "the mission has no executor_command")
    try:
        source = mission.source()
    except SnapshotError as exc:
        return fail(task.pk, token, str(exc))
    # Completed under the lock: the next task of the mission starts from this one's result.
    with _mission_lock(source, mission, task):
        try:
            revision, log = _run_in_clone(task, source, token)
        except ExecutorFailed as exc:
            return fail(task.pk, token, exc.reason, log=exc.log)
        summary = f"executor finished: {log.strip()[-300:]}"
        done = finish(
            task.pk, token, lambda t: task_complete(user=None, task=t, revision=revision, summary=summary, log=log)
        )
    return "done" if done else "lost"


@contextlib.contextmanager
def _mission_lock(source: Source, mission: Mission, task: Task) -> Iterator[None]:
    """The mission's executor lock, taken in the tasks' order: the lock itself grants in no
    order, so a task that gets it while an older task of the mission is claimed by a live
    executor (waiting for this lock, here or on another host) gives it back and waits. A
    dead executor's claim ends with its lease, so the wait is bounded by one lease."""
    # flock locks belong to the open file: two threads of one process exclude each other too.
    path = mirrors.cache_root() / f"executor-{source.key}-{_ref_part(mission.key)}.lock"
    with open(path, "a") as fh:
        while True:
            fcntl.flock(fh, fcntl.LOCK_EX)
            if not _older_claimed(task):
                break
            fcntl.flock(fh, fcntl.LOCK_UN)
            time.sleep(ORDER_POLL_SECONDS)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


ORDER_POLL_SECONDS = 0.2


def _older_claimed(task: Task) -> bool:
    """Whether an older started `command` task of the mission goes first: one whose
    executor holds its claim, or one not claimed yet that started less than a lease ago
    (its message is on its way to a worker: without this, the later task that a worker
    happened to take first landed first). A message that never comes is waited for one
    lease at most; the recovery sweep re-drives it."""
    now = timezone.now()
    held = Q(lease_until__gt=now) & ~Q(claim_token="")
    coming = Q(claim_token="") & Q(started_at__gt=now - timedelta(seconds=settings.FUSION_EXECUTOR_LEASE_SECONDS))
    return Task.objects.filter(
        held | coming,
        mission_id=task.mission_id,
        pk__lt=task.pk,
        status=TaskStatus.IN_PROGRESS,
        executor=Executor.COMMAND,
    ).exists()


def start_revision(task: Task, source: Source) -> str:
    """The commit a task's clone starts from (the module's docstring says why)."""
    landed = (
        Task.objects.filter(mission_id=task.mission_id, status=TaskStatus.DONE)
        .exclude(pk=task.pk)
        .exclude(revision="")
        .order_by("-finished_at", "-id")
        .values_list("revision", flat=True)
        .first()
    )
    if landed and FULL_COMMIT.match(landed):
        return landed
    if task.mission.branch.strip():
        return refs.branch_head(source, task.mission.branch.strip())[1]
    return mission_base(task.mission) or refs.branch_head(source)[1]


def _run_in_clone(task: Task, source: Source, token: str) -> tuple[str, str]:
    """Clone, run the command, commit, push. Returns (the pushed commit, the log)."""
    # Named after the claim: the sweep tells this folder from one a dead holder left.
    folder = snapshot_root() / clone_name(task.pk, token)
    log: str | None = None
    try:
        start = start_revision(task, source)
        folder.mkdir()
        with mirrors.in_use(source):
            mirror = mirrors.ensure_commit(source, start)
            partial = _partial_filter(mirror)
            clone = folder / "repo"
            _clone(source, mirror, partial, start=start, clone=clone, branch=result_branch(task))
            # Never through a committed symlink: the command would work (and write) outside its clone.
            workdir = mission_folder(clone, source.prefix, start)
            result = _run_command(task, workdir, folder)
            log = redact(result.output)
            if not result.ok:
                reason = "timed out" if result.timed_out else f"exit {result.exit_code}"
                raise ExecutorFailed(f"executor {reason}: {log[-500:]}", log)
            commit = _commit_leftovers(clone, task)
            if not holds(task.pk, token):
                raise ExecutorFailed("the task's claim was taken away (its lease passed); not pushed", log)
            _push(source, partial, folder=folder, clone=clone, commit=commit, ref=f"refs/heads/{result_branch(task)}")
        return commit, log
    except ExecutorFailed as exc:
        exc.log = log if exc.log is None else exc.log  # a refused push keeps the command's log
        raise
    except SnapshotError as exc:
        raise ExecutorFailed(str(exc), log) from exc
    except subprocess.TimeoutExpired as exc:
        raise ExecutorFailed(f"git timed out after {exc.timeout:.0f} s", log) from exc
    finally:
        remove_tree(folder)


# ---------------------------------------------------------------- git in the task's folder


def _git(args: list[str], *, cwd: Path | None = None, source: Source | None = None, timeout: float) -> str:
    """A git command; its output, or `SnapshotError` with git's (scrubbed) reason. With
    `source`, the source's credentials are in its environment: never in the clone."""
    try:
        proc = run_git(args, cwd=cwd, source=source, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise SourceUnavailable(f"git {args[0]} timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise SnapshotError(f"git {args[0]} could not run: {exc}") from exc
    if proc.returncode != 0:
        raise SnapshotError(f"git {args[0]} failed: {scrub(proc.stderr.strip()[-500:], source)}")
    return proc.stdout


def _partial_filter(mirror: Path) -> str:
    """The mirror's partial-clone filter ('' for a full mirror)."""
    proc = run_git(["config", "--get", "remote.origin.partialclonefilter"], cwd=mirror, timeout=mirrors.LOCAL_TIMEOUT)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _origin_config(source: Source, partial: str) -> list[tuple[str, str]]:
    config = [("remote.origin.url", source.url), ("gc.auto", "0")]
    if partial:  # missing file contents are fetched from the source, into this repository only
        config += [
            ("core.repositoryformatversion", "1"),
            ("extensions.partialClone", "origin"),
            ("remote.origin.promisor", "true"),
            ("remote.origin.partialclonefilter", partial),
        ]
    return config


def _clone(source: Source, mirror: Path, partial: str, *, start: str, clone: Path, branch: str) -> None:
    _git(
        ["clone", "--shared", "--no-checkout", "--quiet", "--", str(mirror), str(clone)], timeout=mirrors.LOCAL_TIMEOUT
    )
    for key, value in (*_origin_config(source, partial), *IDENTITY):
        _git(["config", key, value], cwd=clone, timeout=mirrors.LOCAL_TIMEOUT)
    # Before the command runs the clone's config is ours: the checkout may fetch file
    # contents a partial mirror lacks, with the source's credentials.
    _git(
        ["checkout", "--quiet", "-B", branch, start, "--"],
        cwd=clone,
        source=source,
        timeout=settings.FUSION_GIT_REMOTE_TIMEOUT,
    )


def _run_command(task: Task, workdir: Path, folder: Path) -> CommandResult:
    prompt_file = folder / "prompt.md"
    prompt_file.write_text(task.prompt)
    home = folder / "home"
    home.mkdir()
    env = scrubbed_env(
        {
            "FUSION_TASK_PROMPT_FILE": str(prompt_file),
            "FUSION_TASK_ID": str(task.pk),
            "FUSION_FEATURE_KEY": task.feature.key if task.feature else "",
        },
        home=str(home),
    )
    try:
        return run_command(
            task.mission.executor_command,
            cwd=workdir,
            timeout=settings.FUSION_EXECUTOR_TIMEOUT,
            max_output=settings.FUSION_TASK_LOG_BYTES,
            env=env,
            stdin=task.prompt,
            confine=_confinement(workdir, folder),
        )
    except CommandError as exc:
        raise ExecutorFailed(str(exc)) from exc


def _confinement(workdir: Path, folder: Path) -> Confinement | None:
    """With `FUSION_EXECUTOR_SANDBOX`, the coding agent runs in the sandbox with the
    network (its model), writing its clone and its task folder only (docs/SANDBOX.md)."""
    if not settings.FUSION_EXECUTOR_SANDBOX:
        return None
    return Confinement(tree=workdir, writable=(folder,), network=True, limits=False)


def _commit_leftovers(clone: Path, task: Task) -> str:
    """Commit what the command left uncommitted; the clone's HEAD. No credentials here."""
    git_dir = clone / ".git"
    if git_dir.is_symlink() or not git_dir.is_dir():
        raise SnapshotError("the command replaced the clone's .git; nothing was pushed")
    if _git(["status", "--porcelain"], cwd=clone, timeout=mirrors.LOCAL_TIMEOUT).strip():
        _git(["add", "-A"], cwd=clone, timeout=mirrors.LOCAL_TIMEOUT)
        message = f"task {task.pk}: {task.title}"[:200]
        _git(["commit", "--quiet", "--no-verify", "-m", message], cwd=clone, timeout=mirrors.LOCAL_TIMEOUT)
    commit = _git(["rev-parse", "--verify", "HEAD^{commit}"], cwd=clone, timeout=mirrors.LOCAL_TIMEOUT).strip()
    if not FULL_COMMIT.match(commit):
        raise SnapshotError(f"the clone's HEAD is not a commit ({commit[:80]!r})")
    return commit


def _push(source: Source, partial: str, *, folder: Path, clone: Path, commit: str, ref: str) -> None:
    """Push `commit` to `ref` on the source from a bare repository of ours that reads the
    clone's objects: the credentials meet no config, hook or URL the command wrote."""
    pusher = folder / "push.git"
    _git(["init", "--bare", "--quiet", "--", str(pusher)], timeout=mirrors.LOCAL_TIMEOUT)
    (pusher / "objects" / "info" / "alternates").write_text(f"{clone / '.git' / 'objects'}\n")
    for key, value in _origin_config(source, partial):
        _git(["config", key, value], cwd=pusher, timeout=mirrors.LOCAL_TIMEOUT)
    _git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=pusher, timeout=mirrors.LOCAL_TIMEOUT)
    # Forced: the branch is this task's own (a re-driven attempt replaces its predecessor's).
    proc = run_git(
        ["push", "--quiet", "--no-verify", "origin", f"+{commit}:{ref}"],
        cwd=pusher,
        source=source,
        timeout=settings.FUSION_GIT_REMOTE_TIMEOUT,
    )
    if proc.returncode != 0:
        reason = scrub(proc.stderr.strip()[-600:], source) or f"exit {proc.returncode}"
        raise ExecutorFailed(f"the push of the result to {source.display} ({ref}) failed: {reason}")
