"""Benchmark: live-event fan-out to many clients of one mission.

Run:  .venv/bin/python bench/events_fanout.py [--clients 200] [--events 100] [--interval 0.05] [--no-redis]

Starts real servers (`manage.py serve`, Daphne) on a throw-away SQLite database, opens
N server-sent-event clients (`/events/missions/<id>/`, token sign-in) and N WebSocket
clients (`/ws/missions/<id>/`), publishes E events through the REST API (each
`POST /api/missions/<id>/autopilot/` writes one `mission:autopilot`), and measures the
delivery latency of every event to every client: from the event's audit row
(`MissionEvent.created_at`, written just before commit) to the moment the client has
parsed it. Two configurations:
  embedded   one server process, in-process event delivery (the default);
  redis      two server processes behind one Redis (its own redis-server on a free
             port): clients are split across both, events are published on the first.
The baseline is the same run with one SSE and one WebSocket client, measured first.
It also prints the server's resident memory per open connection (RSS growth / clients).
Clients run in this one Python process, on the same 2 cores as the servers: the figures
include the clients' own parsing time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA_DIR = tempfile.mkdtemp(prefix="fusion-bench-events-")
os.environ["FUSION_DATA_DIR"] = DATA_DIR
os.environ["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
os.environ.setdefault("LOG_LEVEL", "WARNING")
for name in ("REDIS_URL", "DATABASE_URL"):
    os.environ.pop(name, None)  # this process only reads the shared SQLite file

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from bench.support import machine_cpu  # noqa: E402
from missions.management.commands.watch_mission import WebSocketClient  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Servers:
    """`count` server processes of this project on the benchmark's database."""

    def __init__(self, count: int, redis_url: str | None = None):
        self.ports = [free_port() for _ in range(count)]
        env = {**os.environ, "LOG_LEVEL": "WARNING", "FUSION_SWEEP_INTERVAL": "3600"}
        if redis_url:
            env["REDIS_URL"] = redis_url
        # Open as long as the servers run (closed by `stop`): no `with` spans that.
        self.logs = [open(Path(DATA_DIR) / f"server-{p}.log", "w") for p in self.ports]  # noqa: SIM115
        self.procs = [
            subprocess.Popen(
                [sys.executable, "manage.py", "serve", f"127.0.0.1:{port}", "--no-migrate", "--no-workers"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for port, log in zip(self.ports, self.logs, strict=True)
        ]
        for port in self.ports:
            wait_port(port)

    def cpu(self) -> float:
        return sum(machine_cpu.process_cpu(p.pid)[0] for p in self.procs)

    def rss(self) -> list[int]:
        return [rss_kib(p.pid) for p in self.procs]

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in self.logs:
            log.close()


class Redis:
    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                DATA_DIR,
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_port(self.port)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# --- clients ---------------------------------------------------------------------------


class Deliveries:
    def __init__(self):
        self.times: dict[tuple[str, int], dict[int, float]] = {}

    def record(self, client: tuple[str, int], seq: int) -> None:
        self.times.setdefault(client, {})[seq] = time.time()


async def _chunks(reader: asyncio.StreamReader, chunked: bool):
    while True:
        if not chunked:
            data = await reader.read(65536)
            if not data:
                return
            yield data
            continue
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def sse_client(
    port: int, mission_id: int, token: str, name: tuple, ready: asyncio.Event, deliveries: Deliveries
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            f"GET /events/missions/{mission_id}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Token {token}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n")[0] + b" ":
        raise RuntimeError(f"SSE refused: {head[:80]!r}")
    buffer = b""
    try:
        async for chunk in _chunks(reader, b"chunked" in head.lower()):
            buffer += chunk
            while b"\n\n" in buffer:
                raw, buffer = buffer.split(b"\n\n", 1)
                fields = dict(line.split(": ", 1) for line in raw.decode().split("\n") if ": " in line)
                if fields.get("event") == "stream-open":
                    ready.set()
                elif fields.get("event") == "mission:autopilot":
                    deliveries.record(name, json.loads(fields["data"])["seq"])
    finally:
        writer.close()


async def ws_client(
    port: int, mission_id: int, token: str, name: tuple, ready: asyncio.Event, deliveries: Deliveries
) -> None:
    client = await WebSocketClient.connect(f"ws://127.0.0.1:{port}/ws/missions/{mission_id}/?token={token}")
    ready.set()
    try:
        while True:
            message = json.loads(await client.recv())
            deliveries.record(name, message["id"])
    finally:
        await client.close()


def publish(port: int, mission_id: int, token: str, enabled: bool) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/missions/{mission_id}/autopilot/",
        data=json.dumps({"enabled": enabled}).encode(),
        method="POST",
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


async def open_clients(kind, servers: Servers, n: int, mission_id: int, token: str, deliveries: Deliveries):
    tasks, gate = [], asyncio.Semaphore(25)

    async def one(i: int):
        port = servers.ports[i % len(servers.ports)]
        ready = asyncio.Event()
        async with gate:
            task = asyncio.create_task(kind(port, mission_id, token, (kind.__name__, i), ready, deliveries))
            waiter = asyncio.create_task(ready.wait())
            done, _ = await asyncio.wait({task, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                raise RuntimeError(
                    f"{kind.__name__} {i} did not open: {task.exception() if task.done() else 'timeout'}"
                )
        return task

    tasks = await asyncio.gather(*(one(i) for i in range(n)))
    return list(tasks)


def stored_times(mission_id: int, seqs: set[int]) -> dict[int, float]:
    from django_eventstream.models import Event

    out = {}
    for row in Event.objects.filter(channel=f"mission-{mission_id}").exclude(eid=0).values("data", "created"):
        data = json.loads(row["data"])
        seq = (json.loads(data) if isinstance(data, str) else data).get("seq")  # stored as JSON text in JSON
        if seq in seqs:
            out[seq] = row["created"].timestamp()
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def scenario(servers: Servers, n: int, events: int, interval: float, mission_id: int, token: str) -> dict:
    from missions.models import Mission, MissionEvent

    deliveries = Deliveries()
    await asyncio.sleep(0.5)
    rss0 = servers.rss()
    sse = await open_clients(sse_client, servers, n, mission_id, token, deliveries)
    await asyncio.sleep(0.5)
    rss1 = servers.rss()
    ws = await open_clients(ws_client, servers, n, mission_id, token, deliveries)
    await asyncio.sleep(0.5)
    rss2 = servers.rss()

    first = await asyncio.to_thread(lambda: Mission.objects.get(pk=mission_id).event_seq + 1)
    loop = asyncio.get_running_loop()
    cpu0, own0, wall0 = servers.cpu(), time.process_time(), time.monotonic()
    for i in range(events):
        await loop.run_in_executor(None, publish, servers.ports[0], mission_id, token, i % 2 == 0)
        await asyncio.sleep(interval)
    wanted = set(range(first, first + events))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if len(deliveries.times) == 2 * n and all(wanted <= set(t) for t in deliveries.times.values()):
            break
        await asyncio.sleep(0.1)
    wall = time.monotonic() - wall0
    server_cpu_s = servers.cpu() - cpu0
    server_cpu, client_cpu = server_cpu_s / wall, (time.process_time() - own0) / wall
    for task in sse + ws:
        task.cancel()
    await asyncio.gather(*sse, *ws, return_exceptions=True)

    created = await asyncio.to_thread(
        lambda: {
            e.seq: e.created_at.timestamp() for e in MissionEvent.objects.filter(mission_id=mission_id, seq__in=wanted)
        }
    )
    stored = await asyncio.to_thread(stored_times, mission_id, wanted)
    latencies = {"sse_client": [], "ws_client": []}
    missing = 0
    for (kind, _i), times in deliveries.times.items():
        for seq in wanted:
            if seq in times:
                latencies[kind].append((times[seq] - created[seq]) * 1000)
            else:
                missing += 1
    missing += (2 * n - len(deliveries.times)) * events
    # Where the time goes: audit row -> stored for SSE (after commit; the moment of sending)
    to_send = [(stored[seq] - created[seq]) * 1000 for seq in wanted if seq in stored]
    per_conn = lambda a, b: sum(y - x for x, y in zip(a, b, strict=True)) / n  # noqa: E731
    return {
        "sse": latencies["sse_client"],
        "ws": latencies["ws_client"],
        "missing": missing,
        "sse_kib": per_conn(rss0, rss1),
        "ws_kib": per_conn(rss1, rss2),
        "server_cpu": server_cpu,
        "client_cpu": client_cpu,
        "to_send": to_send,
        "cpu_us_per_delivery": server_cpu_s * 1e6 / max(sum(len(v) for v in latencies.values()), 1),
    }


def report(label: str, base: dict, full: dict, n: int) -> None:
    print(f"\n{label}")
    print(f"  {'':28} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for kind in ("sse", "ws"):
        for name, result in (("baseline, 1 client", base), (f"{n} clients", full)):
            values = result[kind]
            print(
                f"  {kind.upper():4} {name:23} {statistics.median(values):8.1f} {percentile(values, 99):8.1f} "
                f"{max(values):8.1f}"
            )
        ratio = percentile(full[kind], 99) / max(percentile(base[kind], 99), 0.001)
        print(f"  {kind.upper():4} p99 ratio {n} clients / baseline: {ratio:.1f}x")
    print(
        f"  of which commit -> sending (both configurations' common part): p50 "
        f"{statistics.median(full['to_send']):.1f} ms, p99 {percentile(full['to_send'], 99):.1f} ms"
    )
    print(f"  deliveries missing: baseline {base['missing']}, {n} clients {full['missing']}")
    print(
        f"  CPU while publishing ({n} clients): servers {full['server_cpu']:.0%}, "
        f"clients (this process) {full['client_cpu']:.0%} of one core; server CPU per delivery "
        f"{full['cpu_us_per_delivery']:.0f} µs (baseline {base['cpu_us_per_delivery']:.0f} µs, mostly the API request)"
    )
    print(f"  resident memory per open connection: SSE {full['sse_kib']:.1f} KiB, WebSocket {full['ws_kib']:.1f} KiB")


def run(config: str, servers: Servers, args, mission_id: int, token: str) -> None:
    try:
        base = asyncio.run(scenario(servers, 1, args.events, args.interval, mission_id, token))
        full = asyncio.run(scenario(servers, args.clients, args.events, args.interval, mission_id, token))
    except Exception:
        for log in servers.logs:
            log.flush()
            print(f"--- {log.name} (last lines)\n" + "".join(Path(log.name).read_text().splitlines(True)[-40:]))
        raise
    report(config, base, full, args.clients)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="SSE clients and as many WebSocket clients")
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between published events")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis configuration")
    args = parser.parse_args()

    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from missions.models import Mission

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    token = Token.objects.create(user=user).key
    # A planning mission: toggling its autopilot writes one event and starts nothing.
    mission = Mission.objects.create(key="fanout", title="Fan-out", owner=user)
    load = os.getloadavg()[0]
    print(
        f"events_fanout: {args.clients} SSE + {args.clients} WebSocket clients, {args.events} events "
        f"every {args.interval * 1000:.0f} ms, {os.cpu_count()} CPUs, load average {load:.1f} at start"
    )
    try:
        servers = Servers(1)
        try:
            run("embedded (1 server process, in-process delivery)", servers, args, mission.pk, token)
        finally:
            servers.close()
        if args.no_redis:
            return
        if not shutil.which("redis-server"):
            print("\nredis: skipped (no redis-server on PATH)")
            return
        redis = Redis()
        try:
            servers = Servers(2, redis.url)
            try:
                run(
                    "redis (2 server processes, clients split evenly, events published on the first)",
                    servers,
                    args,
                    mission.pk,
                    token,
                )
            finally:
                servers.close()
        finally:
            redis.close()
    finally:
        shutil.rmtree(DATA_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
