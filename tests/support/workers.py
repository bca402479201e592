"""Real `manage.py rundramatiq` processes on Redis, pointed at the test database."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import dramatiq
import pytest
from django.conf import settings

from fusion_site.repos.snapshots import snapshot_root

ROOT = Path(__file__).resolve().parents[2]


def child_database_url() -> str:
    db = settings.DATABASES["default"]
    if settings.IS_SQLITE:
        return "sqlite:///" + str(Path(db["NAME"]).resolve())
    user, password = quote(db.get("USER") or "", safe=""), quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}{port}/{quote(db['NAME'], safe='')}"


def clear_namespace() -> None:
    broker = dramatiq.get_broker()
    for key in list(broker.client.scan_iter(match=f"{broker.namespace}*", count=500)):
        broker.client.delete(key)


class WorkerProcesses:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, **env: str) -> subprocess.Popen:
        log = self.tmp_path / f"worker-{len(self.procs)}.log"
        child_env = {
            **os.environ,
            "DATABASE_URL": child_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "FUSION_EVENTS_PREFIX": settings.EVENTS_PREFIX,
            "FUSION_DATA_DIR": str(settings.DATA_DIR),
            "FUSION_SNAPSHOT_DIR": str(snapshot_root()),
            "FUSION_RETRY_BACKOFF_MS": "0",
            "DJANGO_SETTINGS_MODULE": "fusion_site.settings",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "rundramatiq", "--processes", "1", "--threads", "1"],
                cwd=ROOT,
                env=child_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append((proc, log))
        return proc

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        for _ in range(2):  # the master, then forked workers that outlived it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig if proc.poll() is None else signal.SIGKILL)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                sig = signal.SIGKILL

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for _, log in self.procs)

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            self.kill(proc, signal.SIGTERM)


@pytest.fixture
def worker_processes(transactional_db, tmp_path):
    clear_namespace()
    handle = WorkerProcesses(tmp_path)
    try:
        yield handle
    finally:
        handle.stop_all()
        clear_namespace()


def wait_until(predicate, *, timeout: float, what: str, logs=lambda: "", interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{logs()}")
