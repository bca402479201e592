"""Forge webhooks: a burst of signed GitHub deliveries against the running product, in the
embedded and the production shape, from the hook's answer to the status on the forge.

    .venv/bin/python bench/forge.py [--mode embedded|redis|both] [--deliveries 200]

Each shape runs in a process of its own (`--mode both`, the default, runs one after the
other; the exit status is non-zero when either lost or doubled a delivery; without
PostgreSQL or Redis to reach, it says the production shape was not measured):
  embedded  `manage.py serve` (Daphne + in-process Dramatiq worker threads, StubBroker) on
            a fresh SQLite database in a temporary FUSION_DATA_DIR;
  redis     `manage.py serve` plus --workers-processes `manage.py rundramatiq` workers, on a
            PostgreSQL database made here and dropped at the end (on the server of
            --postgres) and Redis (--redis-url: a database number of your own), with a
            FUSION_EVENTS_PREFIX of this run's own.

The mission (bench/support/mission.py: N features with two cheap checks each, a task per
feature) is over a real local git repository with one distinct commit per delivery, and
follows `acme/shop` on the local fake forge (tests/support/forge.py, in this process,
recording when each status arrived). Delivery i, signed with the mission's secret and
POSTed over HTTP to `/hooks/github/<mission>/` by --clients threads at once:
  even i  a `push` of its commit to the executor's branch of feature i's task
          (`fusion/<mission>/f<i>-<task id>`);
  odd i   a `pull_request` opened on branch `pr/f<i>` titled `[f<i>] …`, head its commit:
          the feature's open task is completed there and the pull request gets a comment.
It prints the answer's latency (p50, p99; the goal is p99 under 50 ms), the time from the
delivery's record (`Delivery.created_at`) to its run's admission (`ValidatorRun.started_at`),
to its verdict and to its final status posted on the forge (p50, p99), then the same 200
deliveries again (replays: each answered 200 `duplicate`, nothing new may happen after).
Lost: a delivery whose commit got no final status, or whose pull request got no comment.
Doubled: a (commit, state) status posted twice, a comment created twice, a commit judged
twice, anything new after the replays. Both must be 0.

Baseline, in the same run and shape, with the same clients: the same server answering
200 authenticated `GET /api/` (the API's root: a token looked up, nothing else) in a burst,
before the deliveries and again after the replays; the ratio is the hook's p50 and p99
over the mean of the baseline's.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--mode", choices=["embedded", "redis", "both"], default="both")
parser.add_argument("--deliveries", type=int, default=200)
parser.add_argument("--clients", type=int, default=8, help="deliveries sent at once (the forge's concurrency)")
parser.add_argument("--threads", type=int, default=4, help="worker threads per worker process (embedded: in serve)")
parser.add_argument("--workers-processes", type=int, default=2, help="redis mode: rundramatiq worker processes")
parser.add_argument(
    "--postgres",
    default=os.environ.get("FUSION_BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432"),
    help="redis mode: the PostgreSQL server where a scratch database is made and dropped",
)
parser.add_argument(
    "--redis-url",
    default=os.environ.get("FUSION_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
    help="redis mode: the Redis database (a number of your own, never 0)",
)
parser.add_argument("--settle", type=float, default=3.0, help="seconds watched after the replays for anything new")
parser.add_argument("--timeout", type=float, default=600, help="give up waiting for the statuses after this")
parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, repository)")
ARGS = parser.parse_args()


NO_SERVERS = 3  # the exit status of `--mode redis` without PostgreSQL or Redis to use


def run_both() -> int:
    """Each shape in its own interpreter: the database and broker are chosen at set-up."""
    passed = [a for a in sys.argv[1:] if not a.startswith("--mode")]
    if "--mode" in sys.argv[1:]:
        i = sys.argv.index("--mode")
        passed = sys.argv[1:i] + sys.argv[i + 2 :]
    codes = [subprocess.call([sys.executable, __file__, "--mode", mode, *passed]) for mode in ("embedded", "redis")]
    if codes[1] == NO_SERVERS:
        # `make bench` on a machine without them: the embedded shape still counts.
        print("the production shape was not measured (no PostgreSQL or Redis, above)")
        codes[1] = 0
    return max(codes)


if ARGS.mode == "both":
    sys.exit(run_both())

TMP = Path(tempfile.mkdtemp(prefix="fusion-bench-forge-"))
DB_NAME = f"fusion_bench_forge_{os.getpid()}"
if ARGS.mode == "embedded":
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
else:
    import psycopg
    import redis as redis_client

    try:
        redis_client.Redis.from_url(ARGS.redis_url).ping()
        with psycopg.connect(f"{ARGS.postgres}/postgres", autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'CREATE DATABASE "{DB_NAME}"')
    except (psycopg.Error, redis_client.RedisError) as exc:
        shutil.rmtree(TMP, ignore_errors=True)
        print(f"--mode redis needs PostgreSQL at --postgres and Redis at --redis-url: {exc}", file=sys.stderr)
        sys.exit(NO_SERVERS)
    os.environ["DATABASE_URL"] = f"{ARGS.postgres}/{DB_NAME}"
    os.environ["REDIS_URL"] = ARGS.redis_url
    os.environ["FUSION_EVENTS_PREFIX"] = f"bench-forge-{os.getpid()}"
os.environ["FUSION_DATA_DIR"] = str(TMP / "data")  # embedded: the SQLite file serve shares
os.environ["FUSION_REPO_CACHE"] = str(TMP / "bench" / "repos")
os.environ["FUSION_SNAPSHOT_DIR"] = str(TMP / "bench" / "snapshots")
os.environ["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
os.environ.setdefault("FUSION_SANDBOX", "auto")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from bench.support import shapes  # noqa: E402
from bench.support.mission import build_mission  # noqa: E402
from bench.support.repos import GIT_ENV, make_repo  # noqa: E402
from tests.support.forge import FakeForge  # noqa: E402

FINAL = {"success", "failure", "error"}


class TimedForge(FakeForge):
    """The local forge, each status stamped with the time it arrived."""

    def _create_status(self, provider: str, body: dict, *, repo: str, sha: str):
        status, answer = super()._create_status(provider, body, repo=repo, sha=sha)
        if status == 201:
            self.statuses[-1]["at"] = time.time()
        return status, answer


# --- the repository and the deliveries ------------------------------------------------------


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, check=True, capture_output=True, text=True, env=env
    )
    return done.stdout.strip()


def heads(repo: Path, base: str, branches: list[str]) -> list[str]:
    """A distinct commit (base's tree, base as parent) per branch, each at its branch."""
    tree = git(repo, "rev-parse", f"{base}^{{tree}}")
    shas = [git(repo, "commit-tree", tree, "-p", base, "-m", f"head {i}") for i in range(len(branches))]
    git(
        repo,
        "update-ref",
        "--stdin",
        stdin="".join(f"create refs/heads/{b} {s}\n" for b, s in zip(branches, shas, strict=True)),
    )
    return shas


def plan(mission, tasks, base: str, repo: Path) -> list[dict]:
    """Delivery i: a push to task i's executor branch (even i) or a pull request naming
    feature i (odd i), each at a commit of its own."""
    from missions.services.executor import result_branch

    branches = [result_branch(t) if i % 2 == 0 else f"pr/f{i}" for i, t in enumerate(tasks)]
    shas = heads(repo, base, branches)
    out: list[dict[str, Any]] = []
    for i, (branch, sha) in enumerate(zip(branches, shas, strict=True)):
        if i % 2 == 0:
            event = "push"
            payload: dict[str, Any] = {
                "ref": f"refs/heads/{branch}",
                "before": base,
                "after": sha,
                "repository": {"full_name": "acme/shop"},
            }
        else:
            event = "pull_request"
            pull: dict[str, Any] = {
                "number": i,
                "title": f"[f{i}] bench",
                "html_url": f"https://github.com/acme/shop/pull/{i}",
            }
            pull |= {"head": {"ref": branch, "sha": sha}, "base": {"ref": "main"}}
            payload = {"action": "opened", "number": i, "pull_request": pull}
        out.append({"i": i, "event": event, "sha": sha, "body": json.dumps(payload).encode(), "pull": i % 2 == 1})
    return out


def signed(secret: str, delivery: dict) -> dict[str, str]:
    signature = hmac.new(secret.encode(), delivery["body"], hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": delivery["event"],
        "X-GitHub-Delivery": f"bench-{delivery['i']}",
        "X-Hub-Signature-256": f"sha256={signature}",
    }


# --- HTTP ---------------------------------------------------------------------------------------


def request(url: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, float, dict]:
    """(status, ms to the full answer, its JSON)."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        status, raw = refused.code, refused.read()
    ms = (time.perf_counter() - started) * 1000
    try:
        return status, ms, json.loads(raw)
    except ValueError:
        return status, ms, {}


def burst(calls: list[tuple[str, bytes | None, dict[str, str]]]) -> list[tuple[int, float, dict]]:
    with ThreadPoolExecutor(max_workers=ARGS.clients) as pool:
        return list(pool.map(lambda call: request(*call), calls))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def spread(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.1f} ms  p99 {percentile(values, 0.99):.1f} ms  max {max(values):.1f} ms"


# --- waiting and counting -----------------------------------------------------------------------


def settled(forge: TimedForge, deliveries: list[dict]) -> bool:
    """Every commit has its final status and every pull request its comment, nothing pending."""
    from forges.models import Outbox, OutboxState

    with forge.lock:
        finals = {s["sha"] for s in forge.statuses if s["state"] in FINAL}
        commented = {c["number"] for c in forge.comments.values()}
    if any(d["sha"] not in finals or (d["pull"] and d["i"] not in commented) for d in deliveries):
        return False
    return not Outbox.objects.filter(state=OutboxState.PENDING).exists()


def watch(forge: TimedForge, deliveries: list[dict], procs: list[shapes.Proc]) -> bool:
    deadline = time.monotonic() + ARGS.timeout
    while time.monotonic() < deadline:
        if settled(forge, deliveries):
            return True
        for p in procs:
            if p.popen.poll() is not None:
                sys.exit(f"{p.name} exited with {p.popen.returncode}:\n{p.text()[-3000:]}")
        time.sleep(0.1)
    return False


def footprint(mission, forge: TimedForge) -> dict[str, int]:
    """What a replay must not change."""
    from forges.models import Delivery, Outbox
    from validation.models import ValidatorRun

    with forge.lock:
        requests = len(forge.requests)
    return {
        "deliveries": Delivery.objects.filter(mission=mission).count(),
        "runs": ValidatorRun.objects.filter(mission=mission).count(),
        "outbox": Outbox.objects.count(),
        "forge_requests": requests,
    }


def timings(mission, forge: TimedForge, deliveries: list[dict]) -> dict[str, list[float]]:
    """Per delivery, ms from its record to its run's admission, verdict and final status."""
    from forges.models import Delivery
    from validation.models import ValidatorRun

    received = {
        d: c.timestamp() for d, c in Delivery.objects.filter(mission=mission).values_list("delivery_id", "created_at")
    }
    runs = {
        rev: (s.timestamp(), c.timestamp() if c else None)
        for rev, s, c in ValidatorRun.objects.filter(mission=mission).values_list(
            "revision", "started_at", "completed_at"
        )
    }
    with forge.lock:
        posted = {s["sha"]: s["at"] for s in forge.statuses if s["state"] in FINAL}
    out: dict[str, list[float]] = {"admitted": [], "verdict": [], "status": []}
    for d in deliveries:
        origin = received.get(f"bench-{d['i']}")
        run = runs.get(d["sha"])
        if origin is None or run is None:
            continue
        out["admitted"].append((run[0] - origin) * 1000)
        if run[1] is not None:
            out["verdict"].append((run[1] - origin) * 1000)
        if d["sha"] in posted:
            out["status"].append((posted[d["sha"]] - origin) * 1000)
    return out


def lost_and_doubled(mission, forge: TimedForge, deliveries: list[dict]) -> dict[str, int]:
    from validation.models import ValidatorRun

    with forge.lock:
        finals = {s["sha"] for s in forge.statuses if s["state"] in FINAL}
        pairs = Counter((s["sha"], s["state"]) for s in forge.statuses)
        created = Counter(r.path for r in forge.requests if r.method == "POST" and r.path.endswith("/comments"))
        commented = {c["number"] for c in forge.comments.values()}
    judged = Counter(ValidatorRun.objects.filter(mission=mission).values_list("revision", flat=True))
    return {
        "lost_statuses": sum(1 for d in deliveries if d["sha"] not in finals),
        "lost_comments": sum(1 for d in deliveries if d["pull"] and d["i"] not in commented),
        "doubled_statuses": sum(n - 1 for n in pairs.values() if n > 1),
        "doubled_comments": sum(n - 1 for n in created.values() if n > 1),
        "doubled_runs": sum(n - 1 for n in judged.values() if n > 1),
    }


# --- one shape ------------------------------------------------------------------------------------


def run_shape() -> dict:
    from forges.models import Forge

    call_command("migrate", verbosity=0)
    n = ARGS.deliveries
    repo, base = make_repo(TMP / "repo", n)
    mission, tasks, token = build_mission(str(repo), n, "forge")
    deliveries = plan(mission, tasks, base, repo)
    fake = TimedForge()
    fake.start()
    forge = Forge.objects.create(
        mission=mission, provider="github", api_url=fake.api_url("github"), repository="acme/shop"
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    port = shapes.free_port()
    redis = ARGS.mode == "redis"
    procs = shapes.start(port, TMP, redis=redis, threads=ARGS.threads, worker_processes=ARGS.workers_processes)
    hook_url = f"http://127.0.0.1:{port}/hooks/github/{mission.key}/"
    api: tuple[str, bytes | None, dict[str, str]] = (
        f"http://127.0.0.1:{port}/api/",
        None,
        {"Authorization": f"Token {token}"},
    )
    try:
        # Warm-up, not counted: the first requests import and compile what the rest reuse.
        pings: list[dict[str, Any]] = [
            {"i": f"ping-{k}", "event": "ping", "body": b'{"zen": "warm"}'} for k in range(10)
        ]
        burst([(hook_url, p["body"], signed(forge.secret, p)) for p in pings] + [api] * 10)
        before = [ms for _s, ms, _b in burst([api] * n)]
        calls = [(hook_url, d["body"], signed(forge.secret, d)) for d in deliveries]
        began = time.monotonic()
        first = burst(calls)
        complete = watch(fake, deliveries, procs)
        elapsed = time.monotonic() - began
        counted = footprint(mission, fake)
        again = burst(calls)
        time.sleep(ARGS.settle)  # anything a replay set off would show by now
        watch(fake, deliveries, procs)
        after_replay = footprint(mission, fake)
        after = [ms for _s, ms, _b in burst([api] * n)]
        result = {
            "first": first,
            "again": again,
            "complete": complete,
            "elapsed": elapsed,
            "baseline": (before, after),
            "timings": timings(mission, fake, deliveries),
            "counts": lost_and_doubled(mission, fake, deliveries),
            "replay_new": {k: after_replay[k] - counted[k] for k in counted},
        }
    finally:
        for p in procs:
            p.stop()
        fake.stop()
    return result


def report(result: dict) -> bool:
    n = ARGS.deliveries
    layout = (
        f"serve + {ARGS.threads} in-process worker threads, SQLite, StubBroker"
        if ARGS.mode == "embedded"
        else f"serve + {ARGS.workers_processes} rundramatiq x {ARGS.threads} threads, PostgreSQL, Redis"
    )
    print(
        f"forge mode={ARGS.mode} ({layout}); {n} deliveries, {ARGS.clients} clients at once; "
        f"{os.cpu_count()} cores; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )
    before, after = result["baseline"]
    hook = [ms for _s, ms, _b in result["first"]]
    replay = [ms for _s, ms, _b in result["again"]]
    for name, values in (("baseline GET /api/ before", before), ("baseline GET /api/ after", after)):
        print(f"{name:>28}: {spread(values)}")
    for name, answers in (("hook, first burst", result["first"]), ("hook, replayed", result["again"])):
        codes = Counter(f"{s} {b.get('status', b.get('code', '?'))}" for s, _ms, b in answers)
        values = [ms for _s, ms, _b in answers]
        print(f"{name:>28}: {spread(values)}  answers {dict(sorted(codes.items()))}")
    base_p50 = (statistics.median(before) + statistics.median(after)) / 2
    base_p99 = (percentile(before, 0.99) + percentile(after, 0.99)) / 2
    p99 = percentile(hook, 0.99)
    print(
        f"ratio_hook_p50_over_baseline={statistics.median(hook) / base_p50:.2f} "
        f"ratio_hook_p99_over_baseline={p99 / base_p99:.2f} (goal: hook p99 under 50 ms: "
        f"{'met' if p99 < 50 else 'not met'}; replays p99 {percentile(replay, 0.99):.1f} ms)"
    )
    t = result["timings"]
    for name, label in (("admitted", "run admitted"), ("verdict", "verdict"), ("status", "final status on the forge")):
        if t[name]:
            print(f"{'delivery -> ' + label:>40}: {spread(t[name])}  ({len(t[name])} of {n})")
    print(
        f"all {n} answered on the forge in {result['elapsed']:.1f} s from the first delivery"
        if result["complete"]
        else f"timed out after {ARGS.timeout:.0f} s waiting for the statuses"
    )
    c = result["counts"]
    lost = c["lost_statuses"] + c["lost_comments"]
    new = sum(result["replay_new"].values())
    doubled = c["doubled_statuses"] + c["doubled_comments"] + c["doubled_runs"] + new
    print(" ".join(f"{k}={v}" for k, v in c.items()) + " replay_new=" + json.dumps(result["replay_new"]))
    print(f"lost={lost} doubled={doubled}")
    answered = [s for s, _ms, _b in result["first"]] == [202] * n
    replayed = [(s, b.get("status")) for s, _ms, b in result["again"]] == [(200, "duplicate")] * n
    return answered and replayed and lost == 0 and doubled == 0


def main() -> int:
    try:
        return 0 if report(run_shape()) else 1
    finally:
        connections.close_all()
        if ARGS.mode == "redis":
            with psycopg.connect(f"{ARGS.postgres}/postgres", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
            # The broker's keys (its namespace is the events prefix): the workers' heartbeats.
            keys = redis_client.Redis.from_url(ARGS.redis_url)
            for key in keys.scan_iter(match=f"{os.environ['FUSION_EVENTS_PREFIX']}*"):
                keys.delete(key)
        if ARGS.keep:
            print(f"kept {TMP}")
        else:
            shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
