"""The `command` task executor: runs the mission's `executor_command` in the workspace
for a started task. Tasks of one mission run one at a time (a lock on the repository).
Exit 0 -> uncommitted changes are committed, HEAD is the task's revision, the task
completes; anything else fails the task with the log tail."""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from pathlib import Path

from django.conf import settings

from fusion_site.base.mirrors import mirror_git as git
from fusion_site.base.proc import CommandError, run_command, scrubbed_env
from fusion_site.base.redact import redact
from fusion_site.base.sources import SnapshotError
from missions.models import Executor, Task, TaskStatus
from missions.services.tasks import task_complete, task_fail


def _commit_leftovers(repo: Path, task: Task) -> None:
    if git(repo, "status", "--porcelain").strip():
        git(repo, "add", "-A")
        git(
            repo,
            "-c",
            "user.name=Fusion Missions",
            "-c",
            "user.email=fusion@localhost",
            "commit",
            "-q",
            "-m",
            f"task {task.pk}: {task.title}"[:200],
        )


def task_execute(*, task_id: int) -> str:
    task = Task.objects.select_related("mission").filter(pk=task_id).first()
    if task is None or task.status != TaskStatus.IN_PROGRESS or task.executor != Executor.COMMAND:
        return "stale"
    mission = task.mission
    if not mission.executor_command.strip():
        task_fail(user=None, task=task, reason="the mission has no executor_command")
        return "failed"
    try:
        repo = Path(mission.source().url)
    except SnapshotError as exc:
        task_fail(user=None, task=task, reason=str(exc))
        return "failed"
    with _lock(repo), tempfile.TemporaryDirectory(prefix="fusion-task-") as tmp:
        prompt_file = Path(tmp) / "prompt.md"
        prompt_file.write_text(task.prompt)
        env = scrubbed_env(
            {
                "FUSION_TASK_PROMPT_FILE": str(prompt_file),
                "FUSION_TASK_ID": str(task.pk),
                "FUSION_FEATURE_KEY": task.feature.key if task.feature else "",
            },
            home=tmp,
        )
        try:
            result = run_command(
                mission.executor_command,
                cwd=repo,
                timeout=settings.FUSION_EXECUTOR_TIMEOUT,
                max_output=settings.FUSION_TASK_LOG_BYTES,
                env=env,
                stdin=task.prompt,
            )
        except CommandError as exc:
            task_fail(user=None, task=task, reason=str(exc))
            return "failed"
        log = redact(result.output)
        if not result.ok:
            reason = "timed out" if result.timed_out else f"exit {result.exit_code}"
            task_fail(user=None, task=task, reason=f"executor {reason}: {log[-500:]}", log=log)
            return "failed"
        try:
            _commit_leftovers(repo, task)
            revision = git(repo, "rev-parse", "HEAD").strip()
        except SnapshotError as exc:
            task_fail(user=None, task=task, reason=str(exc), log=log)
            return "failed"
    task_complete(user=None, task=task, revision=revision, summary=f"executor finished: {log.strip()[-300:]}", log=log)
    return "done"


@contextlib.contextmanager
def _lock(repo: Path):
    with open(repo / ".git" / "fusion-executor.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
