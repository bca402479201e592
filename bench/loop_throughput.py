"""Loop throughput: N features (default 200), two cheap checks each, all tasks completed at once.

The loop runs in real processes, the way it is deployed:
  embedded (default)  `manage.py serve` (Daphne + in-process Dramatiq worker threads,
                      StubBroker, SQLite) on a free port;
  redis               `manage.py serve` (Daphne + the sweeper) plus --workers-processes
                      separate `manage.py rundramatiq` workers, on PostgreSQL and Redis
                      (needs DATABASE_URL and REDIS_URL; use a scratch database, a Redis DB
                      and a FUSION_EVENTS_PREFIX of your own).
This script builds a mission over a generated git repository, completes every task
through the REST API of `serve` (`POST /api/tasks/{id}/complete/`, 8 clients at once),
and watches the database until every feature has passed. It prints the time and
features/s, the latency from a task's completion (its API answer) to its run's
completion (p50, p99), and the peak resident memory (VmHWM) of `serve` and of each
worker process.

Baseline, measured in the same run with the same concurrency as the loop's workers: a
plain script that, per feature, adds a git worktree (the record under a lock, the
checkout outside it), runs the two checks (a regex over a file, `python -c
"print('ok')"` with the service's interpreter), removes the worktree; plus one bare
Dramatiq round trip per feature on the same broker kind (StubBroker in this process /
Redis).

    .venv/bin/python bench/loop_throughput.py [--features 200] [--threads 4]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fusion_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        FUSION_EVENTS_PREFIX=bench .venv/bin/python bench/loop_throughput.py --mode redis --workers-processes 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
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

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--features", type=int, default=200)
parser.add_argument("--threads", type=int, default=4, help="worker threads per worker process (embedded: in serve)")
parser.add_argument("--mode", choices=["embedded", "redis"], default="embedded")
parser.add_argument("--workers-processes", type=int, default=2, help="redis mode: rundramatiq worker processes")
parser.add_argument("--timeout", type=float, default=900, help="give up after this many seconds")
parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, repository)")
ARGS = parser.parse_args()

TMP = Path(tempfile.mkdtemp(prefix="fusion-bench-"))
if ARGS.mode == "embedded":
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    os.environ["FUSION_DATA_DIR"] = str(TMP / "data")  # a fresh SQLite database
elif not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
    sys.exit("--mode redis needs DATABASE_URL (a scratch PostgreSQL database) and REDIS_URL")
else:
    os.environ.setdefault("FUSION_DATA_DIR", str(TMP / "data"))
os.environ["FUSION_SNAPSHOT_DIR"] = str(TMP / "snapshots")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fusion_site.settings")
os.environ.setdefault("FUSION_RETRY_BACKOFF_MS", "0")

import django  # noqa: E402

django.setup()

import dramatiq  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

CHECK_RUN = {"run": "python -c \"print('ok')\"", "expect_output": "ok"}
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}


# --- set-up ------------------------------------------------------------------------------


def make_repo(n: int) -> tuple[Path, str]:
    repo = TMP / "repo"
    repo.mkdir()
    for i in range(n):
        (repo / f"f{i}.txt").write_text(f"feature {i} done\n")
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "all"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    rev = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return repo, rev


def build_mission(repo: Path, n: int):
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice
    from missions.services.tasks import task_create

    stamp = f"{int(time.time())}-{os.getpid()}"
    user = get_user_model().objects.create_user(
        f"bench-{stamp}", password=os.urandom(12).hex(), is_staff=True, is_superuser=True
    )
    token = Token.objects.create(user=user).key
    mission = Mission.objects.create(
        key=f"bench-{stamp}", title="bench", status="active", repository=str(repo), owner=user
    )
    milestone = Milestone.objects.create(mission=mission, key="m", title="m")
    slice_ = Slice(milestone=milestone, key="s", title="s")
    slice_.save()
    tasks = []
    for i in range(n):
        feature = MissionFeature(slice=slice_, key=f"f{i}", title=f"f{i}")
        feature.save()
        a1 = ContractAssertion(
            milestone=milestone,
            key=f"F{i}-FILE",
            title="file",
            statement="s",
            check_spec={"file": f"f{i}.txt", "contains": f"feature {i}"},
        )
        a2 = ContractAssertion(milestone=milestone, key=f"F{i}-RUN", title="run", statement="s", check_spec=CHECK_RUN)
        a1.save()
        a2.save()
        feature.assertions.add(a1, a2)
        tasks.append(task_create(user=user, feature=feature))
    return mission, tasks, token


# --- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    return {
        **os.environ,
        "FUSION_WORKER_THREADS": str(ARGS.threads),
        "PYTHONUNBUFFERED": "1",
        "FUSION_SNAPSHOT_DIR": str(TMP / "snapshots"),
    }


class Proc:
    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.log = TMP / f"{name}.log"
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=child_env(),
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


def wait_until(predicate, what: str, timeout: float, procs: list[Proc]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in procs:
            if p.popen.poll() is not None:
                sys.exit(f"{p.name} exited with {p.popen.returncode}:\n{p.text()[-3000:]}")
        time.sleep(0.1)
    sys.exit(f"timed out waiting for {what}")


def start_processes(port: int) -> tuple[Proc, list[Proc]]:
    py = sys.executable
    serve_argv = [py, "manage.py", "serve", f"127.0.0.1:{port}", "--no-migrate"]
    if ARGS.mode == "embedded":
        serve_argv += ["--workers", str(ARGS.threads)]
    serve = Proc("serve", serve_argv)
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
            )
            for i in range(ARGS.workers_processes)
        ]

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    everyone = [serve, *workers]
    wait_until(listening, "serve to listen", 60, everyone)
    wait_until(lambda: all("ready for action" in w.text() for w in workers), "the workers to boot", 60, everyone)
    return serve, workers


# --- the loop -----------------------------------------------------------------------------


def complete_all(port: int, token: str, tasks, rev: str) -> dict[int, float]:
    done_at: dict[int, float] = {}

    def complete(task) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/tasks/{task.pk}/complete/",
            method="POST",
            data=json.dumps({"revision": rev, "summary": "bench"}).encode(),
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200, response.status
        done_at[task.feature_id] = time.time()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(complete, tasks))
    return done_at


def run_loop(mission, tasks, token: str, rev: str, port: int, procs: list[Proc]) -> dict:
    from missions.models import MissionFeature
    from validation.models import RunStatus, ValidatorRun

    features = MissionFeature.objects.filter(mission=mission)
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
    runs = ValidatorRun.objects.filter(mission=mission, status=RunStatus.PASSED).values_list(
        "feature_id", "completed_at"
    )
    latencies = sorted(completed.timestamp() - done_at[fid] for fid, completed in runs)
    return {
        "elapsed": elapsed,
        "api": api_seconds,
        "p50": statistics.median(latencies),
        "p99": latencies[max(int(len(latencies) * 0.99) - 1, 0)],
        "runs": ValidatorRun.objects.filter(mission=mission).count(),
    }


# --- the baseline -------------------------------------------------------------------------

_round_trips = {"count": 0, "done": threading.Event(), "lock": threading.Lock(), "want": 0}


@dramatiq.actor(max_retries=0, queue_name="bench")
def _noop(i: int) -> None:
    with _round_trips["lock"]:
        _round_trips["count"] += 1
        if _round_trips["count"] >= _round_trips["want"]:
            _round_trips["done"].set()


# As the checks validator does: `python` is the interpreter this service runs with.
PLAIN_ENV = {
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
    "HOME": tempfile.gettempdir(),
}


# Concurrent `git worktree add/remove` on one repository fail now and then ("Invalid path
# .git/worktrees/…"): even a plain script serializes the changes to those records. Like
# the service, it checks the files out outside the lock.
_git_lock = threading.Lock()


def plain_checks(i: int, repo: Path, rev: str) -> None:
    wt = TMP / "baseline" / f"b{i}"
    with _git_lock:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "-q", "--no-checkout", "--detach", str(wt), rev], check=True
        )
    try:
        subprocess.run(["git", "-C", str(wt), "reset", "-q", "--hard"], check=True)
        assert re.search(f"feature {i}", (wt / f"f{i}.txt").read_text())
        out = subprocess.run(
            shlex.split(CHECK_RUN["run"]), cwd=wt, capture_output=True, text=True, timeout=120, env=PLAIN_ENV
        )
        assert out.returncode == 0 and re.search(CHECK_RUN["expect_output"], out.stdout)
    finally:
        shutil.rmtree(wt)
        with _git_lock:
            shutil.rmtree(repo / ".git" / "worktrees" / wt.name)


def run_baseline(n: int, repo: Path, rev: str, concurrency: int) -> dict:
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lambda i: plain_checks(i, repo, rev), range(n)))
    checks = time.monotonic() - started
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
    return {"elapsed": checks + trips, "checks": checks, "trips": trips}


# --- main ---------------------------------------------------------------------------------


def main() -> None:
    call_command("migrate", verbosity=0)
    n = ARGS.features
    concurrency = ARGS.threads * (ARGS.workers_processes if ARGS.mode == "redis" else 1)
    repo, rev = make_repo(n)
    mission, tasks, token = build_mission(repo, n)
    baseline = run_baseline(n, repo, rev, concurrency)
    port = free_port()
    serve, workers = start_processes(port)
    procs = [serve, *workers]
    try:
        loop = run_loop(mission, tasks, token, rev, port, procs)
        rss = {"serve": peak_rss_mb(serve.popen.pid)}
        for w in workers:
            for pid in w.pids():
                rss[f"{w.name}[{pid}]"] = peak_rss_mb(pid)
    finally:
        for p in procs:
            p.stop()
    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    broker = type(dramatiq.get_broker()).__name__
    layout = (
        f"serve + {ARGS.threads} in-process worker threads"
        if ARGS.mode == "embedded"
        else f"serve + {ARGS.workers_processes} rundramatiq x {ARGS.threads} threads"
    )
    print(f"mode={ARGS.mode} features={n} database={db} broker={broker} ({layout}); baseline concurrency={concurrency}")
    print(
        f"baseline: {baseline['elapsed']:.2f}s  {n / baseline['elapsed']:.1f} features/s  "
        f"(worktree+checks {baseline['checks']:.2f}s, {n} dramatiq round trips {baseline['trips']:.2f}s)"
    )
    print(
        f"loop: {loop['elapsed']:.2f}s  {n / loop['elapsed']:.1f} features/s  latency p50={loop['p50']:.2f}s "
        f"p99={loop['p99']:.2f}s  (API completions {loop['api']:.2f}s, runs={loop['runs']})"
    )
    print(f"ratio_loop_time_over_baseline={loop['elapsed'] / baseline['elapsed']:.2f}")
    print("peak_rss_mb " + " ".join(f"{k}={v:.0f}" for k, v in rss.items() if v is not None))
    if not ARGS.keep:
        shutil.rmtree(TMP, ignore_errors=True)
    else:
        print(f"kept {TMP}")


if __name__ == "__main__":
    main()
