"""End to end with real `manage.py rundramatiq` worker processes on Redis.

The test process plays the web tier: it completes tasks (the messages go to Redis on
commit) and watches the database; separate `rundramatiq` processes, pointed at the same
test database, Redis DB and key prefix, do all the validation work.

Killed worker: dramatiq's RedisBroker would requeue a dead worker's unacked message only
during its probabilistic maintenance (0.1 % of commands) after a 60 s heartbeat timeout:
too slow and too random for a test, and not the design's safety net anyway. What the product
promises (docs/TRUTH.md) is that the database is the truth and the recovery sweep re-drives it:
the killed worker's run keeps its lease (FUSION_RUN_LEASE_SECONDS=3 s in the workers
here), then a sweep — sent as the `recovery_sweep` actor through Redis, as a periodic
tick would — reaps it as `error`, starts a retry run that the new worker executes, and
removes the dead worker's snapshot (folder and git record). A late redelivery of the old
message would find its run no longer `running` and bail out as stale.

Only meaningful with Redis: the embedded pass (StubBroker) skips this module; CI's
PostgreSQL + Redis pass runs it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import dramatiq
import pytest
from django.conf import settings
from django.utils import timezone

from fusion_site.repos.snapshots import snapshot_root
from missions.models import MissionEvent, MissionFeature
from missions.services.tasks import task_complete, task_create
from tests.support.workers import child_database_url, clear_namespace
from validation.models import FixLineage, RunStatus, ValidatorRun
from validation.services.recovery import recover

pytestmark = [
    pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL: runs in the PostgreSQL+Redis pass of .ci/run"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.redis,
]

ROOT = Path(__file__).resolve().parents[2]
GREETING = {"file": "hello.py", "contains": r"def hello\("}


class Workers:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, *, processes: int = 1, threads: int = 2, **env) -> subprocess.Popen:
        log = self.tmp_path / f"worker-{len(self.procs)}.log"
        child_env = {
            **os.environ,
            "DATABASE_URL": child_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "FUSION_EVENTS_PREFIX": settings.EVENTS_PREFIX,
            "FUSION_DATA_DIR": str(settings.DATA_DIR),
            "FUSION_SNAPSHOT_DIR": str(snapshot_root()),
            "FUSION_RETRY_BACKOFF_MS": "0",
            "DJANGO_SETTINGS_MODULE": "fusion_site.settings",
            "PYTHONUNBUFFERED": "1",
            **{k: str(v) for k, v in env.items()},
        }
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "rundramatiq",
                    "--processes",
                    str(processes),
                    "--threads",
                    str(threads),
                    "--worker-shutdown-timeout",
                    "5000",
                ],
                cwd=ROOT,
                env=child_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: the master and its forked workers
            )
        self.procs.append((proc, log))
        return proc

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        # Forked worker processes of the group that outlived the master.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for _, log in self.procs if log.exists()
        )

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                self.kill(proc, signal.SIGTERM)


@pytest.fixture
def workers(transactional_db, tmp_path):
    clear_namespace()
    handle = Workers(tmp_path)
    try:
        yield handle
    finally:
        handle.stop_all()  # before pytest-django flushes the database the workers use
        clear_namespace()


def wait_for(predicate, *, timeout: float, what: str, workers: Workers, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{workers.logs()}")


def worktrees(repo) -> list[str]:
    out = repo.git("worktree", "list", "--porcelain")
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


def test_rundramatiq_workers_validate_completed_tasks(workers, build_mission, git_repo, alice):
    build_mission(
        {
            "hello": [("VAL-1", GREETING), ("VAL-2", {"run": "python hello.py", "expect_output": "hi"})],
            "readme": [("VAL-3", {"file": "README.md", "contains": "project"})],
            "missing": [("VAL-4", {"file": "missing.txt", "exists": True})],
        }
    )
    rev = git_repo.commit({"hello.py": "def hello():\n    return 'hi'\nprint(hello())\n"})
    feats = {f.key: f for f in MissionFeature.objects.all()}
    tasks = [task_create(user=alice, feature=f) for f in feats.values()]
    workers.start(processes=2, threads=2)
    for task in tasks:
        task_complete(user=alice, task=task, revision=rev, summary="landed")

    def settled():
        states = dict(MissionFeature.objects.filter(generated_from__isnull=True).values_list("key", "loop_state"))
        return states if states == {"hello": "passed", "readme": "passed", "missing": "implementing"} else None

    wait_for(settled, timeout=45, what="every feature to pass or get a fix", workers=workers)
    for key in ("hello", "readme"):
        run = ValidatorRun.objects.get(feature=feats[key])
        assert run.status == RunStatus.PASSED and run.revision == rev and run.trigger == "task"
        assert run.lease_until is not None  # claimed by a worker process
    failed = ValidatorRun.objects.get(feature=feats["missing"])
    assert failed.status == RunStatus.FAILED and failed.failures.get().assertion_key == "VAL-4"
    fix = MissionFeature.objects.get(generated_from=feats["missing"])
    assert FixLineage.objects.filter(source=feats["missing"], fix=fix, run=failed).count() == 1
    # The workers published through the same audit log.
    assert MissionEvent.objects.filter(type="feature:updated", payload__cause="pass").count() == 2
    assert MissionEvent.objects.filter(type="fix-feature:created").count() == 1
    assert not list(snapshot_root().iterdir())
    assert worktrees(git_repo) == [str(git_repo.path)]


SLOW_ONCE = (
    "import os, sys, time; marker = sys.argv[1]; first = not os.path.exists(marker); "
    "open(marker, 'a').close(); time.sleep(30 if first else 0); print('ok')"
)


def test_a_worker_killed_mid_run_is_recovered_by_the_sweep(workers, build_mission, git_repo, alice, tmp_path):
    marker = tmp_path / "check-started"
    slow = {"run": f'python -c "{SLOW_ONCE}" {marker}', "expect_output": "ok", "timeout": 60}
    build_mission({"hello": [("VAL-1", GREETING), ("VAL-2", slow)]})
    rev = git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    # Unsandboxed: the check tells the test it started, and its retry that it ran before,
    # through a file of the test's (the worker's recovery is the subject, not the sandbox).
    lease_env = {"FUSION_RUN_LEASE_SECONDS": "3", "FUSION_SANDBOX": "off"}
    first = workers.start(**lease_env)
    task_complete(user=alice, task=task, revision=rev)

    def in_flight():
        run = ValidatorRun.objects.filter(feature=feature, status=RunStatus.RUNNING, lease_until__isnull=False).first()
        return run if run is not None and marker.exists() else None

    run = wait_for(in_flight, timeout=30, what="the run to be claimed and its slow check to start", workers=workers)
    # the run's snapshot (made from the worker's mirror), where its lone run check runs after
    # the file check (docs/TRUTH.md); the user's repository never gets a worktree record
    # (docs/REPOSITORIES.md)
    leftover = [p for p in snapshot_root().iterdir() if p.is_dir() and p.name.startswith(f"run-{run.pk}-")]
    assert len(leftover) == 1 and worktrees(git_repo) == [str(git_repo.path)]

    workers.kill(first)  # SIGKILL to the whole group, mid-check
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and all(p.is_dir() for p in leftover)  # nobody finished or cleaned up

    workers.start(**lease_env)
    wait_for(
        lambda: ValidatorRun.objects.filter(pk=run.pk, lease_until__lt=timezone.now()).exists(),
        timeout=10,
        what="the dead worker's lease to expire",
        workers=workers,
    )
    from validation.actors import recovery_sweep

    recovery_sweep.send()  # the periodic sweep's tick, executed by the new worker
    wait_for(
        lambda: MissionFeature.objects.filter(pk=feature.pk, loop_state="passed").exists(),
        timeout=40,
        what="the feature to pass after recovery",
        workers=workers,
    )

    run.refresh_from_db()
    assert run.status == RunStatus.ERROR and run.error.startswith("timeout:") and run.completed_at is not None
    retry = ValidatorRun.objects.exclude(pk=run.pk).get(feature=feature)
    assert retry.status == RunStatus.PASSED and retry.validator_attempt == 2 and retry.revision == rev
    started = MissionEvent.objects.get(type="validator-run:started", payload__run=retry.pk)
    assert started.payload["retry_of"] == run.pk
    feature.refresh_from_db()
    assert feature.last_run_id == retry.pk and feature.status == "done"
    # The dead worker's snapshot is gone, folder and git record alike.
    assert not any(p.exists() for p in leftover) and not list(snapshot_root().iterdir())
    assert worktrees(git_repo) == [str(git_repo.path)]
    # Nothing is left for a later sweep to do.
    report = recover()
    assert report["reaped"] == [] and report["redriven_runs"] == [] and report["snapshots_removed"] == 0
    assert ValidatorRun.objects.filter(feature=feature).count() == 2
