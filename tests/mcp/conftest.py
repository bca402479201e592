"""Fixtures for the MCP tests: the project's real `manage.py serve` in a subprocess on a
free port (Daphne, which runs no ASGI lifespan, with its in-process workers) over the test
database, users with API tokens, and the SDK's own client over streamable HTTP and stdio.

The server is a separate process, as in production: everything it knows comes from the
database, and the review's models are scripted OpenAI-compatible servers on 127.0.0.1
(tests/support/openai_server.py) that the server reaches over real HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.support.users import PASSWORDS, _fast_password_hashing, _user, alice, bob, free_port, staff  # noqa: F401
from tests.support.workers import WorkerProcesses, child_database_url, clear_namespace

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "MCP_TEST_LLM_KEY"


class Serve:
    """`manage.py serve` on a free port over the test database."""

    def __init__(self, tmp_path: Path, env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"serve-{self.port}.log"
        child_env = {
            **os.environ,
            "DATABASE_URL": child_database_url(),
            "FUSION_DATA_DIR": str(tmp_path / "server-data"),
            "FUSION_SNAPSHOT_DIR": str(tmp_path / "server-snapshots"),
            "FUSION_REPO_CACHE": str(tmp_path / "server-repos"),
            "FUSION_RETRY_BACKOFF_MS": "0",
            "FUSION_SWEEP_INTERVAL": "3600",
            "DJANGO_SETTINGS_MODULE": "fusion_site.settings",
            "PYTHONUNBUFFERED": "1",
            # The same key as this process: sessions the tests sign in with verify there.
            "SECRET_KEY": settings.SECRET_KEY,
            **env,
        }
        self.workers: WorkerProcesses | None = None
        if settings.REDIS_URL:
            child_env.update(REDIS_URL=settings.REDIS_URL, FUSION_EVENTS_PREFIX=settings.EVENTS_PREFIX)
            # The production shape: `serve` runs no workers; a `rundramatiq` beside it judges.
            clear_namespace()
            self.workers = WorkerProcesses(tmp_path)
            self.workers.start(**child_env)  # the same environment: profiles, model keys, folders
        self.env = child_env
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "serve", f"127.0.0.1:{self.port}", "--no-migrate"],
                cwd=ROOT,
                env=child_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"serve did not start:\n{self.logs()}") from exc
                time.sleep(0.1)

    def mcp(self, mission: str | None = None) -> str:
        return f"{self.url}/mcp/missions/{mission}/" if mission else f"{self.url}/mcp/"

    def logs(self) -> str:
        own = self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""
        return own + (f"\n{self.workers.logs()}" if self.workers else "")

    def stop(self) -> None:
        if self.workers is not None:
            self.workers.stop_all()
            clear_namespace()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def serve(transactional_db, tmp_path):
    """`serve(**env)` starts the server (once per test) with extra environment."""
    started: list[Serve] = []

    def start(**env: str) -> Serve:
        server = Serve(tmp_path, {k: str(v) for k, v in env.items()})
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def api(server: Serve, method: str, path: str, *, token: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@asynccontextmanager
async def http_client(url: str, *, token: str | None, scheme: str = "Bearer", mode: str = "auto", **kwargs):
    """The SDK's client over streamable HTTP, signed in with an API token."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"{scheme} {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60, read=120)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, **kwargs) as client,
    ):
        yield client


@asynccontextmanager
async def stdio_client(user: str, *, mission: str | None = None, env: dict[str, str] | None = None, **kwargs):
    """The SDK's client over stdio: `manage.py mcp --user NAME` as a child process."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    args = [str(ROOT / "manage.py"), "mcp", "--user", user] + (["--mission", mission] if mission else [])
    params = StdioServerParameters(command=sys.executable, args=args, env={**os.environ, **(env or {})}, cwd=str(ROOT))
    async with Client(params, **kwargs) as client:
        yield client


def child_env(tmp_path: Path) -> dict[str, str]:
    return {
        "DATABASE_URL": child_database_url(),
        "FUSION_DATA_DIR": str(tmp_path / "stdio-data"),
        "FUSION_SNAPSHOT_DIR": str(tmp_path / "stdio-snapshots"),
        "FUSION_REPO_CACHE": str(tmp_path / "stdio-repos"),
        "DJANGO_SETTINGS_MODULE": "fusion_site.settings",
    }


@pytest.fixture
def stdio_judges(transactional_db, tmp_path):
    """What judges the work a stdio server starts: its own in-process workers (embedded),
    or in the production shape (REDIS_URL) a `rundramatiq` beside it."""
    if not settings.REDIS_URL:
        yield None
        return
    clear_namespace()
    workers = WorkerProcesses(tmp_path)
    workers.start(**child_env(tmp_path))
    try:
        yield workers
    finally:
        workers.stop_all()
        clear_namespace()


@pytest.fixture
def shop(git_repo, alice):
    """alice's mission over a real repository: one milestone, one slice, one feature with
    a check the host runs."""
    from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice

    git_repo.commit({"app.py": "def hello():\n    return 'hello'\n"}, "add hello")
    mission = Mission.objects.create(
        key="shop", title="Shop", status="active", owner=alice, repository=str(git_repo.path), executor="manual"
    )
    milestone = Milestone.objects.create(mission=mission, key="m1", title="Milestone 1")
    slice_ = Slice(milestone=milestone, key="s1", title="Slice 1")
    slice_.save()
    feature = MissionFeature(slice=slice_, key="greet", title="Greeting", description="Say hi.")
    feature.save()
    assertion = ContractAssertion(
        milestone=milestone,
        key="VAL-GREET-001",
        title="hello says hi",
        statement="app.py returns 'hi'",
        check_spec={"file": "app.py", "contains": "return 'hi'"},
    )
    assertion.save()
    feature.assertions.add(assertion)
    return SimpleNamespace(mission=mission, feature=feature, assertion=assertion, repo=git_repo)


def structured(result) -> dict:
    assert result.structured_content is not None, result
    return result.structured_content
