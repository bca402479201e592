"""Outbox delivery across a killed worker and a forge that is down (issue 40, "Tests"),
with real processes: `manage.py serve` answers the forge's webhook over real HTTP and its
workers judge and deliver (its own threads in the embedded shape; a `rundramatiq` beside
it with Redis). The local forge is down (503) while the verdict is decided, then stops
answering; the worker is SIGKILLed while a delivery hangs; a new server's recovery sweep
sends the dead worker's row again once its lease has passed, through more 503s and a 429,
until the forge is back. Time is driven by settings (short leases and backoff, a sweep
every second), never slept: the test waits on the database and on the forge."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from collections import Counter, deque

import pytest
from django.utils import timezone

from forges.models import Forge, Outbox, OutboxState, PullRequest
from missions.models import MissionFeature
from tests.forges.conftest import GOOD, GREETING, POLITE, github_pr, signed_headers
from tests.mcp.conftest import Serve, serve  # noqa: F401 — fixture
from tests.support.forge import Failure
from validation.models import RunStatus, ValidatorRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WAIT = float(os.environ.get("FUSION_REPO_TEST_TIMEOUT", "180"))
QUICK = {"FUSION_FORGE_RETRY_BASE": "0.5", "FUSION_FORGE_RETRY_MAX": "1", "FUSION_REDRIVE_GRACE": "0"}


def wait_until(predicate, what: str, *servers: Serve):
    deadline = time.monotonic() + WAIT
    while not (value := predicate()):
        if time.monotonic() > deadline:
            logs = "\n".join(s.logs() for s in servers)
            pytest.fail(f"timed out after {WAIT:g}s waiting for {what}\n{logs}")
        time.sleep(0.1)
    return value


def post_hook(server: Serve, forge: Forge, payload: dict) -> int:
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        **signed_headers("github", forge.secret, body, "pull_request", "d-1"),
    }
    request = urllib.request.Request(f"{server.url}/hooks/github/{forge.mission.key}/", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.status


def kill_workers(server: Serve) -> None:
    """SIGKILL what runs the workers: the `rundramatiq` processes beside the server, or
    (embedded) the server itself."""
    targets = [proc for proc, _ in server.workers.procs] if server.workers else [server.proc]
    for proc in targets:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def in_flight() -> list[Outbox]:
    """Rows a live claim holds: a sender has them at the forge right now."""
    return list(Outbox.objects.exclude(claim_token="").filter(lease_until__gt=timezone.now()))


def test_a_delivery_survives_a_killed_worker_and_a_forge_down(serve, build_mission, served, fake_forge):  # noqa: F811
    mission = build_mission({"hello": [("GREET", GREETING), ("POLITE", POLITE)]}, auto_fix=False, workspace=served.url)
    forge = Forge.objects.create(
        mission=mission, provider="github", api_url=fake_forge.api_url("github"), repository="acme/shop"
    )
    hello = MissionFeature.objects.get(mission=mission, key="hello")
    head = served.commit(GOOD, "hello, politely", push=False)
    served.push("HEAD:refs/heads/agent/hello")

    # The forge is down while the verdict is decided: every request answers 503.
    fake_forge.fail_next(10_000, status=503)
    first = serve(FUSION_FORGE_LEASE_SECONDS="3", FUSION_FORGE_TIMEOUT="120", **QUICK)
    assert post_hook(first, forge, github_pr(7, "agent/hello", "[hello] say hello", head)) == 202
    run = wait_until(
        lambda: ValidatorRun.objects.filter(feature=hello, revision=head, status=RunStatus.PASSED).first(),
        "the verdict",
        first,
    )
    wait_until(
        lambda: (
            {r.key for r in Outbox.objects.filter(attempts__gte=1, last_status=503)}
            >= {f"status:{head}:success", "comment:7"}
        ),
        "the verdict's status and the comment refused by the forge that is down",
        first,
    )

    # Now it does not answer at all: the worker is killed while a delivery hangs there.
    with fake_forge.lock:
        fake_forge.failures = deque(Failure(hang=True) for _ in range(10_000))
        hanging = len(fake_forge.requests)
    held = wait_until(lambda: len(fake_forge.requests) > hanging and in_flight(), "a delivery in flight", first)
    kill_workers(first)
    for row in held:  # the dead worker's claims, never released
        row.refresh_from_db()
        assert row.claim_token and row.state == OutboxState.PENDING

    # The forge answers again, 503 and a 429 first; a new server's sweep sends the row again
    # once the dead worker's lease has passed.
    with fake_forge.lock:
        fake_forge.failures = deque([Failure(503), Failure(503), Failure(429, {"Retry-After": "1"})])
    second = serve(FUSION_SWEEP_INTERVAL="1", **QUICK)

    def settled() -> bool:
        rows = list(Outbox.objects.all())
        return bool(rows) and all(r.state in (OutboxState.DELIVERED, OutboxState.SUPERSEDED) for r in rows)

    wait_until(settled, "every row delivered (or superseded by a newer status)", first, second)

    assert not fake_forge.failures  # the new worker met the 503s and the 429 before the forge took it
    for row in held:  # sent again by the new worker (or superseded by a newer status sent instead)
        before = row.attempts
        row.refresh_from_db()
        assert row.claim_token == "", row.key
        assert row.state == OutboxState.SUPERSEDED or row.attempts > before, (row.key, before, row.attempts)
    # Each (revision, state) on the forge once, the verdict last; nothing lost.
    posted = Counter((s["sha"], s["state"]) for s in fake_forge.statuses)
    assert posted and set(posted.values()) == {1}, posted
    assert [s["state"] for s in fake_forge.statuses_of(head)][-1] == "success"
    # One comment, whatever became of the requests that hung or were refused.
    [(comment_id, comment)] = fake_forge.comments.items()
    assert f"`hello` ✅ passed at `{head[:12]}`" in comment["body"] and f"/runs/{run.pk}/" in comment["body"]
    assert PullRequest.objects.get(forge=forge, number=7).comment_id == str(comment_id)
