"""Fixtures for the dashboard and event-stream tests: a real ASGI server, users with
passwords and tokens, the demo mission held still, and a broker stepper.

Why Daphne in a thread (and not pytest-django's `live_server`): the live server is a
threaded WSGI server, and django-eventstream streams with an async generator, which a
WSGI server can only consume to the end (never, for a stream) — SSE and WebSockets need
ASGI. Daphne runs the project's real ASGI application (HTTP, SSE, WebSocket) on the test
database, in this process: an event published here (by the test, or by an API request
the server handles) reaches the server's stream listeners directly in the embedded
configuration, and through Redis in the production-shaped one. Twisted's reactor runs
once per process, so the server is session-scoped.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import dramatiq
import pytest

from tests.support.users import PASSWORDS, _fast_password_hashing, _user, alice, bob, free_port, staff  # noqa: F401


@pytest.fixture(scope="session")
def asgi_server(django_db_setup):
    from daphne.server import Server
    from twisted.internet import reactor

    from fusion_site.asgi import application

    port = free_port()
    server = Server(
        application=application, endpoints=[f"tcp:port={port}:interface=127.0.0.1"], signal_handlers=False, verbosity=0
    )
    thread = threading.Thread(target=server.run, name="daphne-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError("the test Daphne server did not start") from exc
            time.sleep(0.05)
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}", ws=f"ws://127.0.0.1:{port}", port=port)
    reactor.callFromThread(reactor.stop)
    thread.join(10)


# --- users ---------------------------------------------------------------------------


# --- HTTP helpers --------------------------------------------------------------------


def api(server, method: str, path: str, *, token: str, body: dict | None = None) -> tuple[int, dict]:
    """The REST API over real HTTP, signed in with a token."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class SSE:
    """A server-sent events reader over http.client: `events(until=..., timeout=...)`."""

    def __init__(self, server, path: str, *, headers: dict[str, str] | None = None):
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        self.conn.request("GET", path, headers={"Accept": "text/event-stream", **(headers or {})})
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.buffer: list[dict] = []

    def _read_event(self) -> dict | None:
        event: dict = {}
        data: list[str] = []
        while True:
            line = self.response.readline()
            if not line:
                return None
            line = line.decode("utf-8").rstrip("\n")
            if line == "":
                if event or data:
                    event["data"] = "\n".join(data)
                    return event
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            else:
                event[field] = value

    def next(self, timeout: float = 5) -> dict:
        """The next event other than keep-alives; raises on timeout."""
        self.conn.sock.settimeout(timeout)
        while True:
            event = self._read_event()
            if event is None:
                raise EOFError("the stream ended")
            if event.get("event") != "keep-alive":
                if event.get("data") and event["data"].startswith(("{", "[")):
                    event["json"] = json.loads(event["data"])
                return event

    def until(self, predicate, timeout: float = 5) -> list[dict]:
        seen, deadline = [], time.monotonic() + timeout
        while True:
            event = self.next(max(deadline - time.monotonic(), 0.05))
            seen.append(event)
            if predicate(event):
                return seen

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def sse(asgi_server):
    opened: list[SSE] = []

    def open_(path: str, **kwargs) -> SSE:
        stream = SSE(asgi_server, path, **kwargs)
        opened.append(stream)
        return stream

    yield open_
    for stream in opened:
        stream.close()
    # The server goes on with a closed stream until its next step: wait until every stream
    # has ended and no read of one still runs, before the test's database is emptied (a
    # read that joins tables while it is truncated is a deadlock).
    from django_eventstream.views import get_listener_manager

    from missions.streams.views import reads_done

    manager, deadline = get_listener_manager(), time.monotonic() + 30
    while any(manager.listeners_by_channel.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reads_done(max(deadline - time.monotonic(), 0.1)), "a stream's database read never ended"


def session_cookie(client, user) -> str:
    """A real session for `user` (Django's test client writes it to the database)."""
    from django.conf import settings

    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


# --- the demo mission, held still ------------------------------------------------------


def publish_in_a_rolled_back_savepoint(mission) -> None:
    """A `mission:updated` event ("rolled back") published in a savepoint that then rolls back."""
    from django.db import transaction

    from missions.outbox import publish_on_commit

    try:
        with transaction.atomic():  # a savepoint
            publish_on_commit(mission, "mission:updated", {"change": "rolled back"})
            raise RuntimeError
    except RuntimeError:
        pass


def off_thread(fn, *args, **kwargs):
    """Run `fn` in a thread of its own, as a worker would, and return its result. (The
    browser tests' main thread holds Playwright's event loop, where Django's code that
    publishes to the channel layer cannot run.)"""
    from django.db import connection

    result: dict = {}

    def run():
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


class Stepper:
    """Runs queued Dramatiq messages one at a time in the test, so that a page can be
    watched in every state the loop passes through (works with the stub and Redis brokers)."""

    def __init__(self, queue: str = "fusion"):
        import missions.actors  # noqa: F401 - declares the actors and their queue
        import validation.actors  # noqa: F401

        self.broker = dramatiq.get_broker()
        self.consumer = self.broker.consume(queue, prefetch=1, timeout=100)
        self.done: list[str] = []

    def step(self, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = next(self.consumer)
            if message is None:
                continue
            try:
                off_thread(self.broker.get_actor(message.actor_name).fn, *message.args, **message.kwargs)
            finally:
                self.consumer.ack(message)
            self.done.append(message.actor_name)
            return message.actor_name
        raise AssertionError(f"no queued message within {timeout} s (ran so far: {self.done})")

    def until(self, actor_name: str, timeout: float = 20) -> list[str]:
        ran, deadline = [], time.monotonic() + timeout
        while not ran or ran[-1] != actor_name:
            ran.append(self.step(max(deadline - time.monotonic(), 0.1)))
        return ran

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def stepper(transactional_db):
    broker = dramatiq.get_broker()
    broker.flush_all()
    stepper = Stepper()
    yield stepper
    stepper.close()
    broker.flush_all()


def commit_change(workspace: str, feature_key: str) -> str:
    """Apply the demo implementer's prepared change for a feature and commit it."""
    from missions.demo.implementer import CHANGES

    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    for rel, text in CHANGES[feature_key].items():
        path = Path(workspace) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for args in (["add", "-A"], ["commit", "-q", "-m", f"implement {feature_key}"]):
        subprocess.run(["git", "-C", workspace, *args], check=True, capture_output=True, env=env)
    return subprocess.run(
        ["git", "-C", workspace, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def held_demo(stepper, tmp_path, alice):
    """The demo mission with a manual executor, its first slice activated by the autopilot
    (tasks created, nothing implemented): a person completes tasks through the API."""
    from missions.management.commands.demo import create_demo
    from missions.models import Mission, MissionFeature, Task

    mission = off_thread(create_demo, directory=tmp_path / "demo-repo", user=alice)
    Mission.objects.filter(pk=mission.pk).update(executor="manual")
    stepper.until("autopilot_advance")
    mission.refresh_from_db()
    features = {f.key: f for f in MissionFeature.objects.filter(mission=mission)}
    tasks = {t.feature.key: t for t in Task.objects.filter(mission=mission).select_related("feature")}
    assert set(tasks) == {"cart-total", "cart-count"}, tasks
    return SimpleNamespace(mission=mission, features=features, tasks=tasks, stepper=stepper)


@pytest.fixture
def small_mission(alice):
    """A mission of alice's built with the ORM: one milestone, one slice, a feature that
    failed once (with a failure, a journal and a fix that passed), and an idle feature."""
    from django.utils import timezone

    from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice, Task
    from missions.services.rollup import milestone_rollup_refresh
    from validation.journal import append
    from validation.models import FixLineage, ValidatorFailure, ValidatorRun

    mission = Mission.objects.create(key="shop", title="Shop", owner=alice, status="active")
    milestone = Milestone.objects.create(mission=mission, key="cart", title="Cart", order=1)
    slice_ = Slice(milestone=milestone, key="totals", title="Totals")
    slice_.save()
    total = MissionFeature(
        slice=slice_, key="cart-total", title="Cart total", loop_state="needs_fix", status="in_progress"
    )
    total.save()
    idle = MissionFeature(slice=slice_, key="cart-count", title="Item count", order=2)
    idle.save()
    a1 = ContractAssertion(
        milestone=milestone,
        key="VAL-CART-001",
        title="Total multiplies",
        statement="total == 8",
        check_spec={"run": "python -m unittest tests.test_cart"},
        status="failed",
    )
    a1.save()
    total.assertions.add(a1)
    task = Task.objects.create(
        mission=mission,
        feature=total,
        title="Cart total",
        status="done",
        revision="a" * 40,
        summary="implemented",
        log="line 1\nline 2 <b>not html</b>",
    )
    now = timezone.now()
    verdict = {
        "status": "fail",
        "summary": "1 failed",
        "blocked_reason": "",
        "assertions": [
            {
                "key": "VAL-CART-001",
                "verdict": "fail",
                "message": "wrong total",
                "expected": "8",
                "actual": "7",
                "evidence": [{"kind": "test-output", "text": "AssertionError: 7 != 8"}],
            }
        ],
    }
    failed = ValidatorRun.objects.create(
        mission=mission,
        feature=total,
        milestone=milestone,
        status="failed",
        revision="a" * 40,
        verdict=verdict,
        summary="1 failed",
        completed_at=now,
        implementation_attempt=1,
        validator_attempt=1,
        tokens_in=120,
        tokens_out=30,
    )
    ValidatorFailure.objects.create(
        run=failed,
        feature=total,
        assertion=a1,
        assertion_key="VAL-CART-001",
        message="wrong total",
        expected="8",
        actual="7",
        evidence=[{"kind": "test-output", "text": "AssertionError: 7 != 8"}],
    )
    append(run_id=failed.pk, kind="check", key="VAL-CART-001", payload={"exit": 1})
    append(run_id=failed.pk, kind="decision", key="final", payload={"verdict": "accepted"})
    fix = MissionFeature(
        slice=slice_,
        key="cart-total-fix-1",
        title="Fix: Cart total",
        generated_from=total,
        generated_from_run=failed,
        loop_state="passed",
        status="done",
    )
    fix.save()
    fix.assertions.add(a1)
    FixLineage.objects.create(root=total, source=total, fix=fix, run=failed)
    MissionFeature.objects.filter(pk=total.pk).update(
        fix_rounds=1, last_run=failed, validator_attempts=1, implementation_attempts=1
    )
    passed = ValidatorRun.objects.create(
        mission=mission,
        feature=fix,
        milestone=milestone,
        status="passed",
        revision="b" * 40,
        completed_at=now,
        verdict={
            "status": "pass",
            "summary": "ok",
            "blocked_reason": "",
            "assertions": [
                {
                    "key": "VAL-CART-001",
                    "verdict": "pass",
                    "message": "ok",
                    "expected": "",
                    "actual": "",
                    "evidence": [{"kind": "command", "text": "OK"}],
                }
            ],
        },
    )
    milestone_rollup_refresh(milestone_ids=[milestone.pk])
    total.refresh_from_db()
    return SimpleNamespace(
        mission=mission,
        milestone=milestone,
        slice=slice_,
        total=total,
        idle=idle,
        fix=fix,
        assertion=a1,
        task=task,
        failed=failed,
        passed=passed,
    )


@pytest.fixture(autouse=True)
def _own_channel_layer_per_test(own_channel_layer):
    """The session's `asgi_server` (its own event loop) and tests that run consumers under
    `asyncio.run` (another loop each) would share one Redis layer, whose asyncio locks are
    bound to the loop that made them: each test starts and ends with a fresh layer."""
