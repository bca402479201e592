"""Loop floor: the CPU the service's own steps take per feature, against the baseline's.

`bench/loop_throughput.py` measures the loop's time; this says how far down that time can
go on a machine whose cores are all busy, as a 2-core machine's are in both of its runs.
It runs the steps of the loop for one feature after another in this one process, with
nothing else running: no HTTP, no worker picking up a queued message, no second feature
waiting for the mission's lock. Per feature and step, it measures the CPU time of this
process, of its database backend (PostgreSQL's, read from /proc; SQLite works in this
process) and of its reaped children (git, the checks):

  complete  `missions.services.tasks.task_complete` (what `POST /api/tasks/{id}/complete/`
            calls: the revision pinned, the task `done`, `process_task_outcome` queued);
  admit     `validation.services.verdicts.task.task_outcome_process` (that message's work:
            the guards, the run created, `run_validator` queued);
  run       `validation.services.runner.execute_run` (that message's work: the claim, the
            snapshot, the checks, the journal, the outcome, the events).

Then the baseline of `bench/loop_throughput.py` for the same features, one after another:
the snapshot from a bare mirror, the two checks, the removal (`bench/support/baseline.py`).
It prints both, and `ratio_floor`, the steps' CPU over the baseline's. When the baseline
and the loop both keep every core busy, their times are in the ratio of their CPU: the
loop, which adds the HTTP request, the two queue hops and the waits for the mission's lock
to these steps, cannot be faster than this ratio times the baseline. The first
--warm-up features of each side are not counted (connections, caches, the mirror's clone).

    .venv/bin/python bench/loop_floor.py [--features 100] [--source path|url]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fusion_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        FUSION_EVENTS_PREFIX=bench .venv/bin/python bench/loop_floor.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--features", type=int, default=100, help="features measured (after the warm-up ones)")
parser.add_argument("--warm-up", type=int, default=5, help="features done first and not counted")
parser.add_argument("--source", choices=["path", "url"], default="path", help="the mission's repository")
parser.add_argument(
    "--snapshot-root", type=Path, help="where the snapshots go (default: the temporary folder; e.g. /dev/shm)"
)
ARGS = parser.parse_args()
if ARGS.features < 1 or ARGS.warm_up < 0:
    parser.error("--features needs at least 1, --warm-up at least 0")

TMP = Path(tempfile.mkdtemp(prefix="fusion-floor-"))
SNAPSHOTS = Path(tempfile.mkdtemp(prefix="fusion-floor-", dir=ARGS.snapshot_root)) if ARGS.snapshot_root else TMP
if not os.environ.get("DATABASE_URL"):
    os.environ.pop("REDIS_URL", None)  # the embedded shape: SQLite, no Redis
elif not os.environ.get("REDIS_URL"):
    sys.exit("with DATABASE_URL (a scratch PostgreSQL database), give REDIS_URL too: the production shape")
os.environ["FUSION_DATA_DIR"] = str(TMP / "data")
os.environ["FUSION_SNAPSHOT_DIR"] = str(SNAPSHOTS / "snapshots")
os.environ["FUSION_REPO_CACHE"] = str(TMP / "repos")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fusion_site.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.support import machine_cpu  # noqa: E402
from bench.support.baseline import plain_mirror, snapshot_and_check  # noqa: E402
from bench.support.mission import build_mission  # noqa: E402
from bench.support.repos import make_repo  # noqa: E402
from tests.gitserver import GitDaemon  # noqa: E402

STEPS = ("complete", "admit", "run")
PARTS = ("own", "database", "children")


class Meter:
    """CPU seconds by (step, part): this process, its database backend, its reaped children."""

    def __init__(self) -> None:
        self.spent = {(step, part): 0.0 for step in (*STEPS, "baseline") for part in PARTS}
        self.backend = None
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.backend = cursor.fetchone()[0]

    def _backend_cpu(self) -> float:
        if self.backend is None:
            return 0.0
        return machine_cpu.process_cpu(self.backend)[0]

    def _now(self) -> tuple[float, float, float]:
        times = os.times()
        return time.process_time(), self._backend_cpu(), times.children_user + times.children_system

    def measure(self, step: str, work: Callable[[], object], counted: bool) -> object:
        before = self._now()
        result = work()
        after = self._now()
        if counted:
            for part, b, a in zip(PARTS, before, after, strict=True):
                self.spent[(step, part)] += a - b
        return result


def run_steps(meter: Meter, source: str, rev: str) -> None:
    from missions.models import MissionFeature, Task
    from missions.services.tasks import task_complete
    from validation.models import ValidatorRun
    from validation.services.runner import execute_run
    from validation.services.verdicts.task import task_outcome_process

    mission, tasks, _token = build_mission(source, ARGS.warm_up + ARGS.features, "floor")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # as autovacuum would on a live database
    owner = mission.owner
    for i, created in enumerate(tasks):
        counted = i >= ARGS.warm_up
        task = Task.objects.select_related("mission").get(pk=created.pk)  # as the API's visibility check reads it
        meter.measure(
            "complete",
            lambda t=task: task_complete(user=owner, task=t, revision=rev, summary="floor", fresh=True),
            counted,
        )
        outcome = meter.measure("admit", lambda t=task: task_outcome_process(task_id=t.pk), counted)
        if outcome != "started":
            sys.exit(f"feature {i}: the task's outcome was {outcome!r}, not a started run")
        run = ValidatorRun.objects.filter(feature_id=task.feature_id).order_by("-id").first()
        meter.measure("run", lambda r=run: execute_run(r.pk), counted)
        if not MissionFeature.objects.filter(pk=task.feature_id, loop_state="passed").exists():
            sys.exit(f"feature {i} did not pass: see {TMP}")


def run_baseline(meter: Meter, source: str, rev: str) -> None:
    mirror = plain_mirror(source, TMP / "baseline")
    for i in range(ARGS.warm_up + ARGS.features):
        snap = SNAPSHOTS / "baseline" / f"b{i}"
        meter.measure("baseline", lambda i=i, snap=snap: snapshot_and_check(i, mirror, rev, snap), i >= ARGS.warm_up)


def report(meter: Meter, machine: dict[str, float]) -> None:
    n = ARGS.features

    def ms(step: str, part: str | None = None) -> float:
        parts = PARTS if part is None else (part,)
        return sum(meter.spent[(step, p)] for p in parts) / n * 1000

    shape = "postgresql + redis" if connection.vendor == "postgresql" else "embedded (sqlite)"
    print(f"shape={shape} source={ARGS.source} features={n} (after {ARGS.warm_up} not counted), one at a time")
    print("ms of CPU per feature      own  database  children   total")
    for step in (*STEPS, "baseline"):
        print(
            f"  {step:<22} {ms(step, 'own'):6.2f}  {ms(step, 'database'):8.2f}  {ms(step, 'children'):8.2f}  {ms(step):6.2f}"
        )
    steps = sum(ms(step) for step in STEPS)
    own = sum(ms(step, part) for step in STEPS for part in ("own", "database"))
    print(f"steps: {steps:.2f} ms, of which the service's own (this process and its database) {own:.2f} ms")
    print(
        "machine cpu_s during the steps, by command: "
        + " ".join(f"{command}={seconds:.1f}" for command, seconds in machine.items() if seconds >= 0.05)
    )
    print(f"ratio_floor={steps / ms('baseline'):.2f}  (the steps' CPU over the baseline's)")


def main() -> None:
    call_command("migrate", verbosity=0)
    repo, rev = make_repo(TMP / "repo", ARGS.warm_up + ARGS.features)
    daemon, source = None, str(repo)
    try:
        if ARGS.source == "url":
            daemon = GitDaemon(TMP / "served").start()
            daemon.bare("repo.git", source=repo)
            source = daemon.url("repo.git")
        meter = Meter()
        before = machine_cpu.snapshot()
        run_steps(meter, source, rev)
        machine = dict(machine_cpu.spent(before, machine_cpu.snapshot()).most_common())
        run_baseline(meter, source, rev)
        report(meter, machine)
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(TMP, ignore_errors=True)
        if SNAPSHOTS != TMP:
            shutil.rmtree(SNAPSHOTS, ignore_errors=True)


if __name__ == "__main__":
    main()
