"""The product's processes as a benchmark starts them: `manage.py serve` on a free port
(embedded: Daphne with the Dramatiq worker threads in the same process, StubBroker, the
shared SQLite file), or `serve` plus separate `manage.py rundramatiq` workers (the
production shape: PostgreSQL and Redis). Each process is a "host" of its own: its own
repository cache, snapshot folder and, in the production shape, data folder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """One product process, its output in `<home>/<name>.log`, in a session of its own."""

    def __init__(self, name: str, argv: list[str], home: Path, env: dict[str, str]):
        self.name = name
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / f"{name}.log"
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float, procs: list[Proc], poll: float = 0.05):
    """Poll `predicate` until true; exit with the log's tail when a process died, or on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in procs:
            if p.popen.poll() is not None:
                sys.exit(f"{p.name} exited with {p.popen.returncode}:\n{p.text()[-3000:]}")
        time.sleep(poll)
    sys.exit(f"timed out waiting for {what}")


def host_env(home: Path, *, threads: int, own_data: bool) -> dict[str, str]:
    env = {
        **os.environ,
        "FUSION_WORKER_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "FUSION_REPO_CACHE": str(home / "repos"),
        "FUSION_SNAPSHOT_DIR": str(home / "snapshots"),
    }
    if own_data:
        env["FUSION_DATA_DIR"] = str(home / "data")
    return env


def start(port: int, home: Path, *, redis: bool, threads: int, worker_processes: int) -> list[Proc]:
    """`serve` (with its worker threads when embedded) and, with Redis, the workers; once
    `serve` listens and every worker said it is ready."""
    py = sys.executable
    argv = [py, "manage.py", "serve", f"127.0.0.1:{port}", "--no-migrate"]
    if not redis:
        argv += ["--workers", str(threads)]
    procs = [Proc("serve", argv, home / "serve", host_env(home / "serve", threads=threads, own_data=redis))]
    for i in range(worker_processes if redis else 0):
        worker_argv = [py, "manage.py", "rundramatiq", "--processes", "1", "--threads", str(threads)]
        worker_argv += ["--worker-shutdown-timeout", "10000"]  # within `Proc.stop`'s 20 s
        worker_home = home / f"worker-{i}"
        procs.append(
            Proc(f"worker-{i}", worker_argv, worker_home, host_env(worker_home, threads=threads, own_data=True))
        )

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, "serve to listen", 60, procs)
        wait_until(lambda: all("ready for action" in p.text() for p in procs[1:]), "the workers to boot", 60, procs)
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs
