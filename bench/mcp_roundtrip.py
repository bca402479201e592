"""Benchmark: MCP round trips against the same reads over REST, and the delay from a run's
completion to the `resources/updated` its subscribed MCP sessions receive.

Run:  .venv/bin/python bench/mcp_roundtrip.py [--calls 200] [--sessions 50] [--rounds 20]
                                               [--subscribe listen|legacy] [--keep]

Starts `manage.py serve` (Daphne, in-process Dramatiq worker threads, StubBroker) on a free
port, in the embedded shape: its own FUSION_DATA_DIR with a fresh SQLite database (migrated
here and shared with serve), its own repository cache and snapshot folder. The mission (one
milestone, --features features, each with a file check and a `run` check of about a second)
lives in a generated git repository, with the manual executor; its owner signs in
with an API token, the MCP sessions at the mission endpoint `/mcp/missions/<key>/` with the
SDK's own client (`mcp`, streamable HTTP, `Authorization: Bearer`).

1. Round trips, on the idle server, one call at a time: `mission_status` and
   `feature_loop` over one MCP session, against the same reads over REST — the baseline,
   measured in the same run with the same HTTP client library (httpx2, keep-alive):
   `GET /api/missions/{id}/tree/` (mission_status is that tree plus progress, blocked
   features and open tasks) and `GET /api/features/{id}/loop/` (feature_loop is that
   snapshot plus the last verdict per assertion). MCP and REST calls alternate, so that a
   machine getting busier or quieter weighs on both alike; --warmup calls of each are not
   counted. Both sides include the client's parsing (the SDK also checks every result
   against the tool's output schema, as any SDK client does). Prints p50/p99 and
   `ratio_mcp_over_rest` (of the p50s; the issue's goal: within 1.5x) with its p99
   counterpart. The feature read is one that has been judged (it has runs and a verdict).
2. Notifications: --sessions MCP sessions (default 50) each subscribe to the mission's
   resource `fusion://missions/{id}` (`subscriptions/listen`, as tests/mcp/test_resources.py
   does; `--subscribe legacy`: `resources/subscribe`, the notifications on each session's
   standalone stream), then --rounds tasks are completed one at a time through the API
   (`POST /api/tasks/{id}/complete/`) and judged by the serve's workers. Per run, the
   delay from its `completed_at` (written by the worker before its commit; the same
   machine's clock) to the first `resources/updated` each session receives after it (its
   start was announced a second earlier and nothing else touches the mission while the run
   ends; `ambiguous` counts the sessions that heard of the start only after the end, whose
   sample may be the start's), p50/p99 over sessions x runs (goal: p99 under 250 ms), and
   the same from the run's `validator-run:completed` audit row. Baseline, measured first in the same run:
   one subscribed session alone (`ratio_notify_p99_over_one_session`). A session that
   hears nothing within --notify-timeout seconds counts as lost. All clients run in this
   one Python process, on the same cores as the server: the figures include their own
   parsing time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import asynccontextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--calls", type=int, default=200, help="measured calls of each read, MCP and REST each")
parser.add_argument("--warmup", type=int, default=20, help="uncounted calls of each read first")
parser.add_argument("--sessions", type=int, default=50, help="subscribed MCP sessions for the notifications")
parser.add_argument("--rounds", type=int, default=20, help="runs completed one at a time with every session subscribed")
parser.add_argument("--baseline-rounds", type=int, default=5, help="runs completed with one subscribed session")
parser.add_argument("--features", type=int, default=40, help="features of the mission (at least the rounds)")
parser.add_argument("--subscribe", choices=["listen", "legacy"], default="listen")
parser.add_argument("--notify-timeout", type=float, default=15.0)
parser.add_argument("--timeout", type=float, default=120.0, help="give up on one run after this many seconds")
parser.add_argument("--keep", action="store_true", help="keep the temporary folder (serve's log, repository)")
ARGS = parser.parse_args()
if ARGS.features < ARGS.rounds + ARGS.baseline_rounds:
    parser.error("--features must be at least --rounds + --baseline-rounds")

TMP = Path(tempfile.mkdtemp(prefix="fusion-bench-mcp-"))
for name in ("DATABASE_URL", "REDIS_URL"):
    os.environ.pop(name, None)  # the embedded shape: SQLite, in-process workers
os.environ["FUSION_DATA_DIR"] = str(TMP / "data")  # a fresh SQLite database, shared with serve
os.environ["FUSION_SNAPSHOT_DIR"] = str(TMP / "bench" / "snapshots")
os.environ["FUSION_REPO_CACHE"] = str(TMP / "bench" / "repos")
os.environ["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
os.environ.setdefault("LOG_LEVEL", "WARNING")
os.environ.setdefault("FUSION_RETRY_BACKOFF_MS", "0")

import django  # noqa: E402

django.setup()

import anyio  # noqa: E402
import httpx2  # noqa: E402
import mcp_types as types  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from bench.support.repos import make_repo  # noqa: E402

SLOW_CHECK = {"run": "python -c \"import time; time.sleep(1); print('ok')\"", "expect_output": "ok", "timeout": 60}


# --- set-up ------------------------------------------------------------------------------


def build_mission(repository: str, n: int, with_tasks: int):
    """One milestone, slices of 10 features, two checks per feature; open tasks for the
    first `with_tasks` features (the runs of the notification rounds)."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice
    from missions.services.tasks import task_create

    user = get_user_model().objects.create_user("bench", password=os.urandom(12).hex())
    token = Token.objects.create(user=user).key
    mission = Mission.objects.create(
        key="bench", title="MCP bench", status="active", repository=repository, owner=user, executor="manual"
    )
    milestone = Milestone.objects.create(mission=mission, key="m", title="m")
    features, slice_ = [], None
    for i in range(n):
        if i % 10 == 0:
            slice_ = Slice(milestone=milestone, key=f"s{i // 10}", title=f"Slice {i // 10}")
            slice_.save()
        feature = MissionFeature(slice=slice_, key=f"f{i}", title=f"Feature {i}", description=f"Feature {i}.")
        feature.save()
        checks = [
            ContractAssertion(
                milestone=milestone,
                key=f"F{i}-FILE",
                title="file",
                statement=f"f{i}.txt says done",
                check_spec={"file": f"f{i}.txt", "contains": f"feature {i} done"},
            ),
            ContractAssertion(milestone=milestone, key=f"F{i}-RUN", title="run", statement="s", check_spec=SLOW_CHECK),
        ]
        for assertion in checks:
            assertion.save()
        feature.assertions.add(*checks)
        features.append(feature)
    tasks = [task_create(user=user, feature=feature) for feature in features[:with_tasks]]
    return mission, features, tasks, token


# --- the server ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home = TMP / "serve"
        home.mkdir()
        self.log = home / "serve.log"
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "FUSION_REPO_CACHE": str(home / "repos"),
            "FUSION_SNAPSHOT_DIR": str(home / "snapshots"),
            "FUSION_SWEEP_INTERVAL": "3600",
        }
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "manage.py", "serve", f"127.0.0.1:{self.port}", "--no-migrate"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"serve did not start:\n{self.text()[-3000:]}")
                time.sleep(0.1)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> None:
        if self.popen.poll() is not None:
            sys.exit(f"serve exited with {self.popen.returncode}:\n{self.text()[-3000:]}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


@asynccontextmanager
async def mcp_session(url: str, token: str, *, mode: str = "auto", **kwargs):
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=120)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, **kwargs) as client,
    ):
        yield client


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(int(len(ordered) * q) - 1, 0)]


def in_thread(fn):
    """An ORM read of the shared SQLite database, off the event loop."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    return anyio.to_thread.run_sync(run)


# --- 1. round trips ------------------------------------------------------------------------


async def round_trips(serve: Serve, mission, feature, token: str) -> dict[str, dict]:
    reads = {
        "mission_status": (("mission_status", {}), f"/api/missions/{mission.pk}/tree/"),
        "feature_loop": (("feature_loop", {"feature": feature.key}), f"/api/features/{feature.pk}/loop/"),
    }
    samples: dict[str, dict] = {name: {"mcp": [], "rest": [], "path": path} for name, (_call, path) in reads.items()}
    async with (
        httpx2.AsyncClient(
            base_url=serve.url, headers={"Authorization": f"Token {token}", "Accept": "application/json"}, timeout=60
        ) as rest,
        mcp_session(f"{serve.url}/mcp/missions/{mission.key}/", token) as client,
    ):
        await client.list_tools()  # the output schemas the client checks every result against
        for name, ((tool, arguments), path) in reads.items():
            for i in range(ARGS.warmup + ARGS.calls):
                began = time.perf_counter()
                result = await client.call_tool(tool, arguments)
                mcp_ms = (time.perf_counter() - began) * 1000
                if result.is_error or result.structured_content is None:
                    sys.exit(f"{tool} failed: {result.content}")
                began = time.perf_counter()
                response = await rest.get(path)
                response.json()
                rest_ms = (time.perf_counter() - began) * 1000
                if response.status_code != 200:
                    sys.exit(f"GET {path}: {response.status_code} {response.text[:500]}")
                if i >= ARGS.warmup:
                    samples[name]["mcp"].append(mcp_ms)
                    samples[name]["rest"].append(rest_ms)
    return samples


# --- 2. notifications ----------------------------------------------------------------------


async def notifications(serve: Serve, mission, tasks, token: str, rev: str, sessions: int) -> dict:
    """`sessions` subscribed sessions; each task completed, judged, and the delay from its
    run's completion to each session's first notification after it."""
    from missions.models import MissionEvent
    from validation.models import ValidatorRun

    uri = f"fusion://missions/{mission.pk}"
    url = f"{serve.url}/mcp/missions/{mission.key}/"
    stamps: list[list[float]] = [[] for _ in range(sessions)]
    subscribed = 0
    everyone = anyio.Event()
    stop = anyio.Event()
    failures: list[str] = []

    def joined() -> None:
        nonlocal subscribed
        subscribed += 1
        if subscribed == sessions:
            everyone.set()

    async def listener(index: int) -> None:
        try:
            if ARGS.subscribe == "listen":
                async with (
                    mcp_session(url, token) as client,
                    client.listen(resource_subscriptions=[uri]) as subscription,
                ):
                    joined()
                    async with anyio.create_task_group() as group:

                        async def consume() -> None:
                            async for event in subscription:
                                if str(event.uri) == uri:
                                    stamps[index].append(time.time())

                        group.start_soon(consume)
                        await stop.wait()
                        group.cancel_scope.cancel()
            else:

                async def on_message(message) -> None:
                    if isinstance(message, types.ResourceUpdatedNotification) and str(message.params.uri) == uri:
                        stamps[index].append(time.time())

                async with mcp_session(url, token, mode="legacy", message_handler=on_message) as client:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # resources/subscribe is deprecated for 2026-07-28 clients
                        await client.subscribe_resource(uri)
                    joined()
                    await stop.wait()
        except Exception as exc:  # noqa: BLE001 — reported, and the run stops
            failures.append(f"session {index}: {type(exc).__name__}: {exc}")
            everyone.set()

    delays: list[float] = []
    from_event: list[float] = []
    lost = ambiguous = 0
    async with (
        httpx2.AsyncClient(base_url=serve.url, headers={"Authorization": f"Token {token}"}, timeout=60) as rest,
        anyio.create_task_group() as group,
    ):
        for index in range(sessions):
            group.start_soon(listener, index)
        with anyio.fail_after(120):
            await everyone.wait()
        if failures:
            stop.set()
            sys.exit(f"subscribing failed: {failures[:5]}\n{serve.text()[-3000:]}")
        await anyio.sleep(0.5)
        for task in tasks:
            response = await rest.post(f"/api/tasks/{task.pk}/complete/", json={"revision": rev, "summary": "bench"})
            if response.status_code != 200:
                sys.exit(f"completing task {task.pk}: {response.status_code} {response.text[:500]}")
            deadline = time.monotonic() + ARGS.timeout
            while True:
                run = await in_thread(
                    lambda t=task: (
                        ValidatorRun.objects.filter(feature_id=t.feature_id, completed_at__isnull=False)
                        .order_by("-id")
                        .first()
                    )
                )
                if run is not None:
                    break
                serve.alive()
                if time.monotonic() > deadline:
                    sys.exit(f"the run of feature {task.feature_id} did not end in {ARGS.timeout:.0f}s")
                await anyio.sleep(0.02)
            if run.status != "passed":
                sys.exit(f"run {run.pk} ended {run.status}: {run.summary or run.error}")
            completed = run.completed_at.timestamp()
            rows = await in_thread(
                lambda r=run: dict(
                    MissionEvent.objects.filter(
                        mission=mission,
                        type__in=["validator-run:started", "validator-run:completed"],
                        payload__run=r.pk,
                    ).values_list("type", "created_at")
                )
            )
            written = rows["validator-run:completed"].timestamp() if "validator-run:completed" in rows else None
            started = rows["validator-run:started"].timestamp() if "validator-run:started" in rows else None
            heard_by = time.monotonic() + ARGS.notify_timeout
            while time.monotonic() < heard_by and not all(s and s[-1] >= completed for s in stamps):
                await anyio.sleep(0.01)
            for heard in stamps:
                first = next((t for t in heard if t >= completed), None)
                if first is None:
                    lost += 1
                    continue
                if started is not None and not any(started <= t < completed for t in heard):
                    ambiguous += 1  # the run's start reached it only after its end: `first` may be the start's
                delays.append((first - completed) * 1000)
                if written is not None:
                    from_event.append((first - written) * 1000)
            await anyio.sleep(0.3)  # the run's follow-ups (feature, task, rollups) settle before the next
        stop.set()
    if failures:
        sys.exit(f"a subscribed session failed: {failures[:5]}")
    return {
        "delays": delays,
        "from_event": from_event,
        "lost": lost,
        "ambiguous": ambiguous,
        "runs": len(tasks),
        "sessions": sessions,
    }


# --- main ----------------------------------------------------------------------------------


def summary(values: list[float]) -> str:
    if not values:
        return "no samples"
    return f"p50={statistics.median(values):.1f} ms p99={percentile(values, 0.99):.1f} ms"


async def measure(serve: Serve, mission, features, tasks, token: str, rev: str) -> tuple[dict, dict, dict]:
    base = ARGS.baseline_rounds
    one = await notifications(serve, mission, tasks[:base], token, rev, 1)
    many = await notifications(serve, mission, tasks[base:], token, rev, ARGS.sessions)
    # The feature read over both is one that has been judged: runs, a verdict per assertion.
    trips = await round_trips(serve, mission, features[0], token)
    return trips, one, many


def report(trips: dict, one: dict, many: dict) -> None:
    print(
        f"database={connection.vendor} (embedded serve, in-process workers); features={ARGS.features}; "
        f"calls={ARGS.calls} each (+{ARGS.warmup} warm-up), alternating MCP / REST; "
        f"subscribe={ARGS.subscribe}"
    )
    for name, s in trips.items():
        mcp_p50, rest_p50 = statistics.median(s["mcp"]), statistics.median(s["rest"])
        mcp_p99, rest_p99 = percentile(s["mcp"], 0.99), percentile(s["rest"], 0.99)
        print(
            f"{name}: mcp {summary(s['mcp'])} | rest GET {s['path']} {summary(s['rest'])} | "
            f"ratio_mcp_over_rest={mcp_p50 / rest_p50:.2f} (p99: {mcp_p99 / rest_p99:.2f}; goal <= 1.5)"
        )
    for label, result in (("1 session (baseline)", one), (f"{ARGS.sessions} sessions", many)):
        print(
            f"notify, {label}: {result['runs']} runs, completed_at -> resources/updated {summary(result['delays'])}; "
            f"from the validator-run:completed row {summary(result['from_event'])}; lost={result['lost']} "
            f"ambiguous={result['ambiguous']}"
        )
    if one["delays"] and many["delays"]:
        p99 = percentile(many["delays"], 0.99)
        print(
            f"notify_p99_ms={p99:.1f} with {ARGS.sessions} subscribed sessions (goal < 250); "
            f"ratio_notify_p99_over_one_session={p99 / percentile(one['delays'], 0.99):.2f}"
        )


def main() -> None:
    call_command("migrate", verbosity=0)
    repo, rev = make_repo(TMP / "repo", ARGS.features)
    mission, features, tasks, token = build_mission(str(repo), ARGS.features, ARGS.baseline_rounds + ARGS.rounds)
    connections.close_all()
    serve = Serve()
    try:
        trips, one, many = asyncio.run(measure(serve, mission, features, tasks, token, rev))
    finally:
        serve.stop()
    report(trips, one, many)
    if ARGS.keep:
        print(f"kept {TMP}")
    else:
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
