"""Benchmark: the webhook's answer (`/hooks/github/<mission>/`, docs/FORGES.md) for a
burst of 200 signed deliveries, then the same 200 again (replays).

Run:  .venv/bin/python bench/forge_hooks.py

The embedded shape, in process (Django's test client: no network, the server's own
work): its own SQLite database in a temporary FUSION_DATA_DIR, the in-memory broker (the
queued messages are counted, not run). Measures what the forge waits for: verify the
signature, record the delivery, queue its message; goal p99 under 50 ms. Then checks
that none was lost (200 recorded, 200 messages) and none doubled (every replay answered
`duplicate`, no row or message more).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA_DIR = tempfile.mkdtemp(prefix="fusion-bench-")
os.environ["FUSION_DATA_DIR"] = DATA_DIR  # before settings are read: its own SQLite file
os.environ.pop("DATABASE_URL", None)
os.environ.pop("REDIS_URL", None)
os.environ["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

import dramatiq  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402

from forges.models import Delivery, Forge  # noqa: E402
from missions.models import Mission  # noqa: E402

DELIVERIES = 200


def signed(secret: str, n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"ref": f"refs/heads/topic-{n}", "after": f"{n:040x}", "before": "0" * 40}).encode()
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": f"bench-{n}",
        "X-Hub-Signature-256": f"sha256={signature}",
    }


def burst(client: Client, requests: list[tuple[bytes, dict[str, str]]]) -> tuple[list[float], list[int]]:
    times, statuses = [], []
    for body, headers in requests:
        started = time.perf_counter()
        answer = client.post("/hooks/github/bench/", data=body, content_type="application/json", headers=headers)
        times.append((time.perf_counter() - started) * 1000)
        statuses.append(answer.status_code)
    return times, statuses


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    call_command("migrate", verbosity=0)
    broker = dramatiq.get_broker()
    broker.flush_all()
    mission = Mission.objects.create(key="bench", title="Bench")
    forge = Forge.objects.create(mission=mission, provider="github")
    requests = [signed(forge.secret, n) for n in range(DELIVERIES)]
    client = Client()
    burst(client, requests[:5])  # warm-up: first imports, compiled statements
    Delivery.objects.all().delete()
    broker.flush_all()

    first, first_statuses = burst(client, requests)
    again, again_statuses = burst(client, requests)

    queued = broker.queues["fusion"].qsize() if hasattr(broker, "queues") else -1
    recorded = Delivery.objects.filter(mission=mission).count()
    print(f"POST /hooks/github/<mission>/  database=sqlite (embedded, in process)  {DELIVERIES} deliveries")
    print(f"{'burst':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'answers':>20}")
    for name, times, statuses in (("first", first, first_statuses), ("replayed", again, again_statuses)):
        counts = {code: statuses.count(code) for code in sorted(set(statuses))}
        print(
            f"{name:>8} {statistics.median(times):>8.1f} {percentile(times, 0.99):>8.1f} {max(times):>8.1f} "
            f"{json.dumps(counts):>20}"
        )
    lost = DELIVERIES - recorded
    doubled = max(0, recorded - DELIVERIES) + max(0, queued - DELIVERIES)
    print(f"recorded={recorded} messages_queued={queued} lost={lost} doubled={doubled}")
    ok = first_statuses == [202] * DELIVERIES and again_statuses == [200] * DELIVERIES and lost == 0 and doubled == 0
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        code = main()
    finally:
        shutil.rmtree(DATA_DIR, ignore_errors=True)
    sys.exit(code)
