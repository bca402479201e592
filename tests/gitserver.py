"""A real git server for tests and benchmarks: `git daemon` serving the repositories under
a temporary base path on a free port of 127.0.0.1, with `receive-pack` (push) enabled.

    with GitDaemon(base) as server:
        url = server.url("shop.git")      # git://127.0.0.1:<port>/shop.git
        server.stop(); server.start()     # a server that goes away and comes back (same port)
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GitDaemon:
    def __init__(self, base: Path, port: int | None = None):
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.base.parent / f"git-daemon-{self.port}.log"

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def start(self, timeout: float = 30) -> GitDaemon:
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                f"--base-path={self.base}",
                "--export-all",
                "--enable=receive-pack",
                "--reuseaddr",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                "--verbose",
                str(self.base),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "ab"),  # noqa: SIM115 — the daemon's log, closed with it
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"git daemon exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("git daemon did not start listening")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def connections(self) -> int:
        """How many clients connected so far (every fetch, clone, ls-remote, push is one)."""
        try:
            return self.log.read_text().count("Connection from")
        except OSError:
            return 0

    def bare(self, name: str, *, source: Path | None = None) -> Path:
        """A bare repository served as `name` (a clone of `source` when given); partial
        clones of it are allowed (`uploadpack.allowFilter`)."""
        path = self.base / name
        if source is not None:
            subprocess.run(["git", "clone", "--bare", "-q", str(source), str(path)], check=True)
        else:
            subprocess.run(["git", "init", "--bare", "-q", "-b", "main", str(path)], check=True)
        for key, value in (("uploadpack.allowFilter", "true"), ("receive.denyNonFastForwards", "false")):
            subprocess.run(["git", "-C", str(path), "config", key, value], check=True)
        return path

    def __enter__(self) -> GitDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
