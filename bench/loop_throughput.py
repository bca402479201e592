"""Loop throughput: N features (default 200), two cheap checks each, all tasks completed at once.

The loop runs in real processes, the way it is deployed:
  embedded (default)  `manage.py serve` (Daphne + in-process Dramatiq worker threads,
                      StubBroker, SQLite) on a free port;
  redis               `manage.py serve` (Daphne + the sweeper) plus --workers-processes
                      separate `manage.py rundramatiq` workers, on PostgreSQL and Redis
                      (needs DATABASE_URL and REDIS_URL; use a scratch database, a Redis DB
                      and a FUSION_EVENTS_PREFIX of your own). `--sweep 1,2,4` runs the
                      redis mode once per number of worker processes.
`--repeat N` runs each point N times, each with new processes, a new mission and its own
baseline before and after, and prints the median of their ratios (in the same database, as
a sweep's points are): one run's ratio swings with the speed of a shared machine.
Every process gets its own FUSION_DATA_DIR (the embedded serve: the shared SQLite one),
FUSION_REPO_CACHE and FUSION_SNAPSHOT_DIR, as separate hosts would have. The mission's
`repository` is
  --source path (default)  the generated repository's local path;
  --source url             a git:// URL: the repository is served by `git daemon`
                           (tests/gitserver.py) and no process is told its path.
This script builds a mission over a generated git repository (on PostgreSQL it then runs
ANALYZE, as autovacuum would on a live database), completes every task through the REST
API of `serve` (`POST /api/tasks/{id}/complete/`, 8 clients at once), and watches the
database until every feature has passed. It prints, per run: the time and features/s,
the ratio to the baseline of the same run, the latency from a task's completion (its API
answer) to its run's completion (p50, p99), the network fetches each process made (the
lines of `fusion-fetches` in its mirror cache: a clone, a fetch of a commit or of all
heads, the first batch of a commit's blobs; the goal is one per new commit per worker,
never one per run) and, for a URL, the git daemon's connections, then the peak resident
memory (VmHWM) and the CPU seconds (own + reaped children) of every process, and the CPU
seconds of every process on the machine during the loop by command (PostgreSQL, Redis, the
kernel's workers: `bench/support/machine_cpu.py`). Give the redis mode a new, empty
database each time: `serve`'s recovery sweep at start reads the last hour's events, and
those of earlier runs would weigh on the loop.

Then, on the idle system, it completes --latency-rounds more tasks one at a time (one
feature each, of a second mission) and reports the median time from the completion to the
run's admission (`validator-run:started`), to its start on a worker (its claim) and to its
verdict, against the bare cost of the same work measured here just before each round (a
snapshot from a mirror and the two checks); the goal is that the loop adds under 100 ms.

Baseline, measured in the same run with the same concurrency as the loop's workers, once
before the loop and once after (the ratio is to their mean, so that a machine that gets
busier or quieter meanwhile weighs on both alike): a plain script that, per feature, makes
a snapshot from a bare mirror of the repository (`git read-tree -u --reset` into a folder
with a private index, as the service does; the mirror is cloned from the same source first,
partially for a URL), runs the two checks (a regex over a file, `python -c "print('ok')"`
with the service's interpreter, in the snapshot), removes the snapshot; plus one bare
Dramatiq round trip per feature on the same broker kind (StubBroker in this process /
Redis). The service gives a `run` check a private copy of the snapshot unless it is the
run's only one (its isolation rule, docs/TRUTH.md): here it is, so neither copies; the
second baseline figure (`with_copy`) is that work with the copy, for comparison with a
mission whose features have several `run` checks. `--snapshot-root /dev/shm` puts
every snapshot and copy, the baseline's and the loop's, on a memory file system, to leave
the disk's file-creation cost out of both.

Every command of a revision runs in the sandbox (FUSION_SANDBOX, `auto` unless set; each
run prints what its checks ran in, as the runs recorded it); `--sandbox-compare` runs each
point a second time with FUSION_SANDBOX=off right after, and prints the loop's ratio
sandboxed over unsandboxed (`ratio_sandboxed_over_unsandboxed`, the median of the pairs).

    .venv/bin/python bench/loop_throughput.py [--features 200] [--threads 4] [--source path|url]
    .venv/bin/python bench/loop_throughput.py --sandbox-compare --repeat 3 --latency-rounds 0
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fusion_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        FUSION_EVENTS_PREFIX=bench .venv/bin/python bench/loop_throughput.py --mode redis --workers-processes 2
    ... --mode redis --sweep 1,2,4 --source url
    ... --mode redis --source url --repeat 5 --latency-rounds 0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _sweep(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError("a comma-separated list of process counts, e.g. 1,2,4") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of process counts >= 1, e.g. 1,2,4")
    return values


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--features", type=int, default=200)
parser.add_argument("--threads", type=int, default=4, help="worker threads per worker process (embedded: in serve)")
parser.add_argument("--mode", choices=["embedded", "redis"], default="embedded")
parser.add_argument("--workers-processes", type=int, default=2, help="redis mode: rundramatiq worker processes")
parser.add_argument("--sweep", type=_sweep, help="redis mode: run once per number of worker processes (e.g. 1,2,4)")
parser.add_argument("--source", choices=["path", "url"], default="path", help="the mission's repository")
parser.add_argument("--latency-rounds", type=int, default=7, help="single features timed on the idle system")
parser.add_argument(
    "--snapshot-root",
    type=Path,
    help="where every snapshot and check copy goes, the baseline's and the loop's (default: the temporary folder; "
    "e.g. /dev/shm to leave the disk's file-creation cost out)",
)
parser.add_argument(
    "--repeat",
    type=int,
    default=1,
    help="run each point this many times (new processes and mission each time, its own baseline before and "
    "after) and report the median ratio: one run's ratio swings with the machine's speed",
)
parser.add_argument(
    "--sandbox-compare",
    action="store_true",
    help="run each point twice, sandboxed (FUSION_SANDBOX as set, `auto` by default) and with FUSION_SANDBOX=off, "
    "and report the ratio of their loop times",
)
parser.add_argument("--timeout", type=float, default=900, help="give up after this many seconds")
parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, repository)")
ARGS = parser.parse_args()
if ARGS.sweep and ARGS.mode != "redis":
    parser.error("--sweep varies the rundramatiq processes: it needs --mode redis")
if ARGS.repeat < 1:
    parser.error("--repeat needs at least 1")

TMP = Path(tempfile.mkdtemp(prefix="fusion-bench-"))
SNAPSHOTS = (
    Path(tempfile.mkdtemp(prefix="fusion-bench-snapshots-", dir=ARGS.snapshot_root)) if ARGS.snapshot_root else TMP
)
if ARGS.mode == "embedded":
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    os.environ["FUSION_DATA_DIR"] = str(TMP / "data")  # a fresh SQLite database, shared with serve
elif not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
    sys.exit("--mode redis needs DATABASE_URL (a scratch PostgreSQL database) and REDIS_URL")
else:
    os.environ.setdefault("FUSION_DATA_DIR", str(TMP / "data"))
# This process (set-up, baseline) has caches of its own too: nothing is shared with serve or the workers.
os.environ["FUSION_SNAPSHOT_DIR"] = str(SNAPSHOTS / "bench" / "snapshots")
os.environ["FUSION_REPO_CACHE"] = str(TMP / "bench" / "repos")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fusion_site.settings")
os.environ.setdefault("FUSION_RETRY_BACKOFF_MS", "0")
# Every command of a revision runs sandboxed unless this says otherwise (`--sandbox-compare`
# runs each point with `off` too).
os.environ.setdefault("FUSION_SANDBOX", "auto")

import django  # noqa: E402

django.setup()

import dramatiq  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.support import machine_cpu  # noqa: E402
from bench.support.baseline import plain_mirror, snapshot_and_check  # noqa: E402
from bench.support.mission import build_mission  # noqa: E402
from bench.support.repos import make_repo  # noqa: E402
from tests.gitserver import GitDaemon  # noqa: E402

# --- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_env(home: Path) -> dict[str, str]:
    """A process of its own "host": its own repository cache and snapshot folder (and, in
    the production shape, data folder; the embedded serve keeps the shared SQLite one)."""
    env = {
        **os.environ,
        "FUSION_WORKER_THREADS": str(ARGS.threads),
        "PYTHONUNBUFFERED": "1",
        "FUSION_REPO_CACHE": str(home / "repos"),
        "FUSION_SNAPSHOT_DIR": str(SNAPSHOTS / home.relative_to(TMP) / "snapshots"),
    }
    if ARGS.mode == "redis":
        env["FUSION_DATA_DIR"] = str(home / "data")
    return env


class Proc:
    def __init__(self, name: str, argv: list[str], home: Path):
        self.name = name
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / f"{name}.log"
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=host_env(home),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self) -> list[int]:
        """The process and its descendants (rundramatiq's master forks the workers)."""
        found, frontier = [self.popen.pid], [self.popen.pid]
        while frontier:
            parent = frontier.pop()
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    fields = stat.read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == parent:
                    pid = int(stat.parent.name)
                    found.append(pid)
                    frontier.append(pid)
        return found

    def fetches(self) -> dict[str, int]:
        """Network fetches by kind (clone, commit, heads), from every mirror of its cache."""
        counts: dict[str, int] = {}
        for log in (self.home / "repos").glob("*.git/fusion-fetches"):
            for line in log.read_text().splitlines():
                kind = line.split()[1] if len(line.split()) > 1 else "?"
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> tuple[float, float] | None:
    """User + system seconds of the process itself, and of its reaped children (git, checks)."""
    try:
        return machine_cpu.process_cpu(pid)
    except OSError:
        return None


def wait_until(predicate, what: str, timeout: float, procs: list[Proc], poll: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in procs:
            if p.popen.poll() is not None:
                sys.exit(f"{p.name} exited with {p.popen.returncode}:\n{p.text()[-3000:]}")
        time.sleep(poll)
    sys.exit(f"timed out waiting for {what}")


def start_processes(port: int, home: Path, worker_processes: int) -> tuple[Proc, list[Proc]]:
    py = sys.executable
    serve_argv = [py, "manage.py", "serve", f"127.0.0.1:{port}", "--no-migrate"]
    if ARGS.mode == "embedded":
        serve_argv += ["--workers", str(ARGS.threads)]
    serve = Proc("serve", serve_argv, home / "serve")
    workers = []
    if ARGS.mode == "redis":
        workers = [
            Proc(
                f"worker-{i}",
                [
                    py,
                    "manage.py",
                    "rundramatiq",
                    "--processes",
                    "1",
                    "--threads",
                    str(ARGS.threads),
                    "--worker-shutdown-timeout",
                    "10000",
                ],
                home / f"worker-{i}",
            )
            for i in range(worker_processes)
        ]

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    everyone = [serve, *workers]
    wait_until(listening, "serve to listen", 60, everyone)
    wait_until(lambda: all("ready for action" in w.text() for w in workers), "the workers to boot", 60, everyone)
    return serve, workers


# --- the loop -----------------------------------------------------------------------------


def complete(port: int, token: str, task, rev: str) -> float:
    """Complete one task through the API; the time of its answer."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/tasks/{task.pk}/complete/",
        method="POST",
        data=json.dumps({"revision": rev, "summary": "bench"}).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200, response.status
    return time.time()


def complete_all(port: int, token: str, tasks, rev: str) -> dict[int, float]:
    done_at: dict[int, float] = {}

    def one(task) -> None:
        done_at[task.feature_id] = complete(port, token, task, rev)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, tasks))
    return done_at


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(int(len(ordered) * q) - 1, 0)]


def run_loop(mission, tasks, token: str, rev: str, port: int, procs: list[Proc]) -> dict:
    from missions.models import MissionFeature
    from validation.models import RunStatus, ValidatorRun

    features = MissionFeature.objects.filter(mission=mission)
    cpu_before = machine_cpu.snapshot()
    started = time.monotonic()
    done_at = complete_all(port, token, tasks, rev)
    api_seconds = time.monotonic() - started

    def all_passed() -> bool:
        bad = features.filter(loop_state__in=["blocked", "needs_fix"]).count()
        if bad:
            sys.exit(f"{bad} features did not pass; see {TMP}")
        return not features.exclude(loop_state="passed").exists()

    wait_until(all_passed, "every feature to pass", ARGS.timeout, procs)
    elapsed = time.monotonic() - started
    machine = machine_cpu.spent(cpu_before, machine_cpu.snapshot())
    runs = ValidatorRun.objects.filter(mission=mission, status=RunStatus.PASSED).values_list(
        "feature_id", "completed_at"
    )
    latencies = [completed.timestamp() - done_at[fid] for fid, completed in runs]
    sandboxes = sorted(set(ValidatorRun.objects.filter(mission=mission).values_list("sandbox", flat=True)))
    return {
        "sandbox": sandboxes,
        "elapsed": elapsed,
        "api": api_seconds,
        "p50": statistics.median(latencies),
        "p99": percentile(latencies, 0.99),
        "runs": ValidatorRun.objects.filter(mission=mission).count(),
        "machine": machine,
    }


def run_latency(mission, tasks, token: str, rev: str, port: int, procs: list[Proc], mirror: Path, home: Path) -> dict:
    """One feature at a time on the idle system: completion -> admission, start, verdict;
    each round right after a bare snapshot + checks here (`bare`), so that both see the
    machine alike."""
    from missions.models import MissionEvent, MissionFeature
    from validation.models import RunStatus, ValidatorRun

    lease = settings.FUSION_RUN_LEASE_SECONDS  # the workers' own: the same environment
    samples: dict[str, list[float]] = {"admitted": [], "started": [], "verdict": [], "bare": []}
    for i, task in enumerate(tasks):
        time.sleep(0.5)  # let the previous feature's follow-ups (autopilot, events) settle
        began = time.perf_counter()
        plain_checks(i, mirror, rev, home)
        samples["bare"].append((time.perf_counter() - began) * 1000)
        time.sleep(0.2)
        answered = complete(port, token, task, rev)
        feature = MissionFeature.objects.filter(pk=task.feature_id)
        wait_until(lambda f=feature: f.filter(loop_state="passed").exists(), "the feature to pass", 120, procs, 0.01)
        run = ValidatorRun.objects.get(feature_id=task.feature_id, status=RunStatus.PASSED)
        admitted = (
            MissionEvent.objects.filter(mission=mission, type="validator-run:started", payload__run=run.pk)
            .values_list("created_at", flat=True)
            .get()
        )
        # The claim sets lease_until = now + lease; a run this short never renews it.
        claimed = run.lease_until.timestamp() - lease
        samples["admitted"].append((admitted.timestamp() - answered) * 1000)
        samples["started"].append((claimed - answered) * 1000)
        samples["verdict"].append((run.completed_at.timestamp() - answered) * 1000)
    return {k: statistics.median(v) for k, v in samples.items()}


# --- the baseline -------------------------------------------------------------------------

_round_trips = {"count": 0, "done": threading.Event(), "lock": threading.Lock(), "want": 0}


@dramatiq.actor(max_retries=0, queue_name="bench")
def _noop(i: int) -> None:
    with _round_trips["lock"]:
        _round_trips["count"] += 1
        if _round_trips["count"] >= _round_trips["want"]:
            _round_trips["done"].set()


def plain_checks(i: int, mirror: Path, rev: str, home: Path, copy: bool = False) -> None:
    snap = SNAPSHOTS / home.relative_to(TMP) / f"b{i}-{threading.get_ident()}"
    snapshot_and_check(i, mirror, rev, snap, copy=copy)


def run_baseline(n: int, source: str, rev: str, concurrency: int, home: Path) -> dict:
    cpu_before = os.times()
    started = time.monotonic()
    mirror = plain_mirror(source, home)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lambda i: plain_checks(i, mirror, rev, home), range(n)))
    checks = time.monotonic() - started
    cpu = [after - before for after, before in zip(os.times(), cpu_before, strict=False)]  # without the copies
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lambda i: plain_checks(i, mirror, rev, home, copy=True), range(n)))
    copied = time.monotonic() - began
    broker = dramatiq.get_broker()
    worker = dramatiq.Worker(broker, queues={"bench"}, worker_threads=concurrency, worker_timeout=50)
    worker.start()
    try:
        _round_trips.update(count=0, want=n)
        _round_trips["done"].clear()
        began = time.monotonic()
        for i in range(n):
            _noop.send(i)
        if not _round_trips["done"].wait(timeout=300):
            sys.exit("the bare Dramatiq round trips did not finish")
        trips = time.monotonic() - began
    finally:
        worker.stop()
    own, children = cpu[0] + cpu[1], cpu[2] + cpu[3]
    return {
        "elapsed": checks + trips,
        "copied": copied + trips,
        "checks": checks,
        "trips": trips,
        "mirror": mirror,
        "cpu": (own, children),
    }


# --- main ---------------------------------------------------------------------------------


def run_point(index: int, worker_processes: int, source: str, rev: str, daemon: GitDaemon | None) -> dict:
    home = TMP / f"run{index}"
    n = ARGS.features
    concurrency = ARGS.threads * (worker_processes if ARGS.mode == "redis" else 1)
    mission, tasks, token = build_mission(source, n)
    quiet, quiet_tasks, quiet_token = build_mission(source, ARGS.latency_rounds, "latency")
    if connection.vendor == "postgresql":
        # The rows were just bulk-made: give the planner the statistics a live database has
        # (autovacuum would, later), instead of plans for the tables as they were empty.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    before = run_baseline(n, source, rev, concurrency, home / "baseline")
    port = free_port()
    serve, workers = start_processes(port, home, worker_processes)
    procs = [serve, *workers]
    connections_before = daemon.connections() if daemon else 0
    try:
        loop = run_loop(mission, tasks, token, rev, port, procs)
        connections = daemon.connections() - connections_before if daemon else None
        latency = (
            run_latency(quiet, quiet_tasks, quiet_token, rev, port, procs, before["mirror"], home / "baseline")
            if quiet_tasks
            else None
        )
        rss, cpu = {}, {}
        for p in procs:
            for pid in p.pids():
                label = p.name if pid == p.popen.pid else f"{p.name}[{pid}]"
                rss[label], cpu[label] = peak_rss_mb(pid), cpu_seconds(pid)
    finally:
        for p in procs:
            p.stop()
    # Measured again once the loop is done: the ratio is to the mean of both, so that a
    # machine that gets busier or quieter during the run weighs on both sides alike.
    after = run_baseline(n, source, rev, concurrency, home / "baseline-after")
    baseline = {
        "elapsed": (before["elapsed"] + after["elapsed"]) / 2,
        "copied": (before["copied"] + after["copied"]) / 2,
        "checks": (before["checks"] + after["checks"]) / 2,
        "trips": (before["trips"] + after["trips"]) / 2,
        "cpu": tuple((x + y) / 2 for x, y in zip(before["cpu"], after["cpu"], strict=True)),
        "before": before["elapsed"],
        "after": after["elapsed"],
    }
    return {
        "workers": worker_processes,
        "concurrency": concurrency,
        "baseline": baseline,
        "loop": loop,
        "latency": latency,
        "fetches": {p.name: p.fetches() for p in procs},
        "daemon_connections": connections,
        "rss": rss,
        "cpu": cpu,
    }


def report(point: dict) -> None:
    n, b, loop = ARGS.features, point["baseline"], point["loop"]
    db = connection.vendor
    broker = type(dramatiq.get_broker()).__name__
    layout = (
        f"serve + {ARGS.threads} in-process worker threads"
        if ARGS.mode == "embedded"
        else f"serve + {point['workers']} rundramatiq x {ARGS.threads} threads"
    )
    print(
        f"mode={ARGS.mode} source={ARGS.source} features={n} database={db} broker={broker} ({layout}); "
        f"baseline concurrency={point['concurrency']}"
    )
    print(
        f"baseline: {b['elapsed']:.2f}s  {n / b['elapsed']:.1f} features/s  (mean of {b['before']:.2f}s before "
        f"and {b['after']:.2f}s after the loop; mirror+snapshot+checks {b['checks']:.2f}s, {n} dramatiq round "
        f"trips {b['trips']:.2f}s)"
    )
    print(
        f"loop: {loop['elapsed']:.2f}s  {n / loop['elapsed']:.1f} features/s  latency p50={loop['p50']:.2f}s "
        f"p99={loop['p99']:.2f}s  (API completions {loop['api']:.2f}s, runs={loop['runs']})"
    )
    print(f"ratio_loop_time_over_baseline={loop['elapsed'] / b['elapsed']:.2f}")
    print(f"checks ran in: {', '.join(loop['sandbox']) or '?'} (FUSION_SANDBOX={os.environ['FUSION_SANDBOX']})")
    print(
        f"ratio_loop_time_over_baseline_with_copy={loop['elapsed'] / b['copied']:.2f}  (the baseline with the "
        f"run check in a copy of the snapshot, as a feature with more than one run check has it: {b['copied']:.2f}s)"
    )
    fetches = "  ".join(
        f"{name}={sum(kinds.values())}"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})" if kinds else "")
        for name, kinds in point["fetches"].items()
    )
    print(f"fetches per process: {fetches}")
    if point["daemon_connections"] is not None:
        print(f"git daemon connections during the loop: {point['daemon_connections']}")
    if point["latency"]:
        lat = point["latency"]
        bare = lat["bare"]
        print(
            f"idle latency (median of {ARGS.latency_rounds}, one feature): completion -> admitted "
            f"{lat['admitted']:.0f} ms, -> run started {lat['started']:.0f} ms, -> verdict {lat['verdict']:.0f} ms; "
            f"bare snapshot+checks {bare:.0f} ms; loop_adds_ms={lat['verdict'] - bare:.0f}"
        )
    print("peak_rss_mb " + " ".join(f"{k}={v:.0f}" for k, v in point["rss"].items() if v is not None))
    print(
        f"cpu_s ({n + ARGS.latency_rounds} features; own + children) "
        + " ".join(f"{k}={v[0]:.1f}+{v[1]:.1f}" for k, v in point["cpu"].items() if v is not None)
        + f"; baseline (mean) {point['baseline']['cpu'][0]:.1f}+{point['baseline']['cpu'][1]:.1f}"
    )
    machine = point["loop"]["machine"]
    print(
        f"machine cpu_s during the loop ({os.cpu_count()} cores x {loop['elapsed']:.1f}s), by command: "
        + " ".join(f"{k}={v:.1f}" for k, v in machine.most_common() if v >= 0.05)
    )


def _ratio(point: dict) -> float:
    return point["loop"]["elapsed"] / point["baseline"]["elapsed"]


def report_repeats(runs: list[dict]) -> dict:
    """The ratios of one point's runs, in their order, and their median; the run with the
    median ratio (the lower middle one of an even number) stands for the point."""
    ratios = [_ratio(run) for run in runs]
    median = statistics.median_low(ratios)
    print(
        f"repeat: {runs[0]['workers'] if ARGS.mode == 'redis' else 'embedded'} x {len(runs)} runs: "
        f"ratio_median={median:.2f} (runs {', '.join(f'{r:.2f}' for r in ratios)}; loop "
        f"{min(r['loop']['elapsed'] for r in runs):.2f}-{max(r['loop']['elapsed'] for r in runs):.2f}s, baseline "
        f"{min(r['baseline']['elapsed'] for r in runs):.2f}-{max(r['baseline']['elapsed'] for r in runs):.2f}s)"
    )
    return runs[ratios.index(median)]


def report_sandbox(sandboxed: list[dict], unsandboxed: list[dict]) -> None:
    """The loop's time sandboxed over unsandboxed, pair by pair (each run's loop over its
    own baseline, so that a machine's swing between the two runs of a pair weighs less)."""
    pairs = [
        (_ratio(on) / _ratio(off), on["loop"]["elapsed"] / off["loop"]["elapsed"])
        for on, off in zip(sandboxed, unsandboxed, strict=True)
    ]
    by_ratio = ", ".join(f"{r:.2f}" for r, _t in pairs)
    by_time = ", ".join(f"{t:.2f}" for _r, t in pairs)
    print(
        f"ratio_sandboxed_over_unsandboxed={statistics.median(r for r, _t in pairs):.2f} (of the ratios to each run's "
        f"baseline: {by_ratio}; of the loop times: {by_time})"
    )


def main() -> None:
    call_command("migrate", verbosity=0)
    # The latency rounds' features judge files 0, 1, … of the same repository too.
    repo, rev = make_repo(TMP / "repo", max(ARGS.features, ARGS.latency_rounds))
    daemon = None
    source = str(repo)
    try:
        if ARGS.source == "url":
            daemon = GitDaemon(TMP / "served").start()
            daemon.bare("repo.git", source=repo)
            source = daemon.url("repo.git")
        points, index = [], 0
        sandboxed = os.environ["FUSION_SANDBOX"]
        for processes in ARGS.sweep or [ARGS.workers_processes]:
            runs, unsandboxed = [], []
            for _ in range(ARGS.repeat):
                # Sandboxed and not, alternately, when compared: a machine's swing weighs on both.
                for setting, into in [(sandboxed, runs), *([("off", unsandboxed)] if ARGS.sandbox_compare else [])]:
                    os.environ["FUSION_SANDBOX"] = setting  # the processes' environment (`host_env`)
                    into.append(run_point(index, processes, source, rev, daemon))
                    index += 1
                    report(into[-1])
                    sys.stdout.flush()
            os.environ["FUSION_SANDBOX"] = sandboxed
            if unsandboxed:
                report_sandbox(runs, unsandboxed)
            points.append(report_repeats(runs) if len(runs) > 1 else runs[0])
        if len(points) > 1:
            print("sweep: processes  features/s  baseline features/s  ratio  fetches per worker  idle loop adds ms")
            for p in points:
                workers = [sum(k.values()) for name, k in p["fetches"].items() if name.startswith("worker")]
                adds = p["latency"]["verdict"] - p["latency"]["bare"] if p["latency"] else float("nan")
                print(
                    f"sweep: {p['workers']:>9}  {ARGS.features / p['loop']['elapsed']:>10.1f}  "
                    f"{ARGS.features / p['baseline']['elapsed']:>19.1f}  "
                    f"{_ratio(p):>5.2f}  {str(workers):>18}  {adds:>17.0f}"
                )
    finally:
        if daemon is not None:
            daemon.stop()
        if not ARGS.keep:
            shutil.rmtree(TMP, ignore_errors=True)
            if SNAPSHOTS != TMP:
                shutil.rmtree(SNAPSHOTS, ignore_errors=True)
        else:
            print(f"kept {TMP}")


if __name__ == "__main__":
    main()
