"""Shared fixtures: real git repositories, a real Dramatiq worker, users, a mission."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import dramatiq
import pytest
from django.conf import settings

os.environ.setdefault("FUSION_RETRY_BACKOFF_MS", "0")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


class Repo:
    def __init__(self, path: Path):
        self.path = path

    def git(self, *args: str) -> str:
        env = {**os.environ, **GIT_ENV}
        return subprocess.run(
            ["git", "-C", str(self.path), *args], check=True, capture_output=True, text=True, env=env
        ).stdout

    def write(self, rel: str, text: str) -> None:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def commit(self, files: dict[str, str] | None = None, message: str = "change") -> str:
        for rel, text in (files or {}).items():
            self.write(rel, text)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD").strip()


@pytest.fixture
def git_repo(tmp_path) -> Repo:
    path = tmp_path / "repo"
    path.mkdir()
    repo = Repo(path)
    repo.git("init", "-q", "-b", "main")
    repo.commit({"README.md": "# project\n"}, "initial")
    return repo


@pytest.fixture(scope="session")
def check_python() -> str:
    """The `python` the suite's checks get without an environment: the service's base
    interpreter (docs/SANDBOX.md), which must hold pytest for the suite's pytest checks.
    Where it does not (Debian's python3, say), a virtualenv made once from it, with the
    pytest the suite runs (from the package index)."""
    from fusion_site.runtime import sandbox

    base = str(sandbox.check_interpreter())
    if subprocess.run([base, "-c", "import pytest"], capture_output=True).returncode == 0:
        return ""
    import sys

    folder = Path.home() / ".cache" / "fusion-missions" / f"check-python-{sys.version_info[0]}.{sys.version_info[1]}"
    python = folder / "bin" / "python"
    if subprocess.run([str(python), "-c", "import pytest"], capture_output=True).returncode != 0:
        subprocess.run([base, "-m", "venv", "--clear", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"pytest=={pytest.__version__}"], check=True)
    return str(python)


@pytest.fixture(autouse=True)
def _settings_for_tests(settings, tmp_path, check_python):
    if check_python:
        settings.FUSION_CHECK_PYTHON = check_python
    settings.FUSION_SNAPSHOT_DIR = tmp_path / "snapshots"
    settings.FUSION_REPO_CACHE = tmp_path / "repos"  # each test a worker with a cold cache
    settings.FUSION_ENV_CACHE = tmp_path / "environments"
    settings.FUSION_RETRY_BACKOFF_MS = 0
    settings.FUSION_REDRIVE_GRACE = 0
    settings.FUSION_STRICT = True  # an event off the catalogue or a step without its lock fails the test


@pytest.fixture
def synthetic_events(settings):
    """For tests of the transport, which publish payloads of their own making: the event
    catalogue's check (missions/event_catalogue.py) logs them instead of failing."""
    settings.FUSION_STRICT = False


@pytest.fixture(scope="session", autouse=True)
def _no_channel_groups_of_earlier_runs():
    """On Redis, the Channels groups an earlier run of the suite left (a WebSocket a test
    never closed: channels_redis keeps a member for a day) would hold members for this
    run's missions, whose ids a fresh test database gives again: a test that asks whether
    anyone watches its mission would hear yes. Removed once, before the first test."""
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            stale = list(client.scan_iter(match=f"{settings.EVENTS_PREFIX}-asgi:group:*", count=1000))
            if stale:
                client.delete(*stale)
        finally:
            client.close()
    yield


class WorkerHandle:
    def __init__(self, broker, worker):
        self.broker = broker
        self.worker = worker

    def drain(self, timeout: float = 60) -> None:
        """Wait until every queue is empty and stays empty (actors enqueue follow-ups)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for queue in list(self.broker.get_declared_queues()):
                self.broker.join(queue, timeout=int(max(deadline - time.monotonic(), 1) * 1000))
            self.worker.join()
            if all(self._size(q) == 0 for q in self.broker.get_declared_queues()):
                time.sleep(0.05)
                if all(self._size(q) == 0 for q in self.broker.get_declared_queues()):
                    return
        raise AssertionError("the worker did not drain in time")

    def _size(self, queue: str) -> int:
        queues = getattr(self.broker, "queues", None)
        if isinstance(queues, dict):  # StubBroker: queued plus in flight
            q = queues.get(queue)
            return q.unfinished_tasks if q is not None else 0
        return 0  # RedisBroker.join already waited for queued and unacked messages


@pytest.fixture
def worker(transactional_db):
    """A real Dramatiq worker on the configured broker (StubBroker embedded, Redis in CI)."""
    broker = dramatiq.get_broker()
    broker.flush_all()
    w = dramatiq.Worker(broker, worker_threads=4, worker_timeout=50)
    w.start()
    handle = WorkerHandle(broker, w)
    try:
        yield handle
    finally:
        w.stop()
        broker.flush_all()


@pytest.fixture
def idle_broker():
    """No worker: what the services enqueue stays queued; the test runs runs by hand."""
    broker = dramatiq.get_broker()
    broker.flush_all()
    yield broker
    broker.flush_all()


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("staff", password="pw-staff-123", is_staff=True, is_superuser=True)


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def api_for():
    from rest_framework.test import APIClient

    def make(user=None):
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make


def is_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


@pytest.fixture
def own_channel_layer():
    """A channel layer of this test's own, for a test that runs its consumer under
    `asyncio.run`: a new event loop each time, while the process's Redis layer keeps
    asyncio locks bound to the loop it last ran in (a clean-up task that a closed loop never
    ran leaves one held: "bound to a different event loop" in the next test)."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()
