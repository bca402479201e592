"""Fixtures of the repository tests (docs/REPOSITORIES.md): a real `git daemon`
(tests/gitserver.py) serving a bare repository that the workers know only by its URL,
the agent's own clone that pushes to it, a mirror cache of this test's own, missions over
the URL, and readers for what a user would notice (states, runs, stored text)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from fusion_site.repos import mirrors
from missions.models import Mission, MissionFeature, Task
from missions.services.tasks import task_complete, task_create
from tests.conftest import GIT_ENV, Repo
from tests.gitserver import GitDaemon
from tests.missions.loop_helpers import add_slice, make_mission

ROOT = Path(__file__).resolve().parents[2]
WAIT = float(os.environ.get("FUSION_REPO_TEST_TIMEOUT", "180"))


@pytest.fixture(autouse=True)
def _repo_cache(settings, tmp_path):
    # Every test gets its own worker cache: nothing is shared with another test's mirrors.
    settings.FUSION_REPO_CACHE = tmp_path / "cache"
    settings.FUSION_GIT_REMOTE_TIMEOUT = 60


@pytest.fixture
def daemon(tmp_path):
    server = GitDaemon(tmp_path / "served").start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Served:
    """A repository that exists only under the daemon's base path, and the agent's clone."""

    daemon: GitDaemon
    bare: Path
    url: str
    clone: Repo

    def push(self, ref: str = "HEAD:refs/heads/main", *, force: bool = False) -> None:
        self.clone.git("push", "-q", *(["--force"] if force else []), "origin", ref)

    def commit(self, files: dict[str, str], message: str = "change", *, push: bool = True) -> str:
        revision = self.clone.commit(files, message)
        if push:
            self.push()
        return revision


def git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.fixture
def served(daemon, tmp_path) -> Served:
    bare = daemon.bare("shop.git")
    url = daemon.url("shop.git")
    path = tmp_path / "agent"  # the agent's checkout: the workers are never told about it
    git("clone", "-q", url, str(path))
    clone = Repo(path)
    clone.git("symbolic-ref", "HEAD", "refs/heads/main")
    clone.commit({"README.md": "# shop\n"}, "initial")
    served = Served(daemon=daemon, bare=bare, url=url, clone=clone)
    served.push()
    return served


def url_mission(owner, repository: str, keys=("f1",), *, key: str = "shop", **fields) -> Mission:
    """An active mission over `repository` whose feature `<k>` passes when `<k>.txt` says
    `done <k>` (tests/missions/loop_helpers.py)."""
    mission = make_mission(owner, repository, key=key, status="active", **fields)
    add_slice(mission, "m1", "s1", keys)
    return mission


def feature(mission: Mission, key: str) -> MissionFeature:
    return MissionFeature.objects.get(mission=mission, key=key)


def complete(user, mission: Mission, key: str, revision: str) -> Task:
    """A task for feature `key`, completed at `revision` (pinned by the service)."""
    task = task_create(user=user, feature=feature(mission, key))
    return task_complete(user=user, task=task, revision=revision, summary=f"landed {key}")


def wait_for(predicate, *, timeout: float = WAIT, message: str = "the expected state"):
    """Poll until `predicate()` is truthy (its value is returned): a state, never a speed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(0.05)


def loop_state(mission: Mission, key: str) -> str:
    return feature(mission, key).loop_state


def mirror_of(mission: Mission) -> Path:
    return mirrors.mirror_dir(mission.source())


def fetches(mission: Mission) -> int:
    return mirrors.fetch_count(mission.source())


def fetch_lines(path: Path) -> list[str]:
    """What `<mirror>/fusion-fetches` recorded, without the time stamps."""
    try:
        return [line.split(" ", 1)[1] for line in (path / "fusion-fetches").read_text().splitlines()]
    except OSError:
        return []


def tree_digest(root: Path) -> dict[str, str]:
    """Every file, link and folder under `root` (`root` included): its mode, its time of
    last change, and the sha256 of a file's bytes or a link's target. A folder's time
    changes when anything is made or removed in it, even a lock file gone again."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            path = os.path.normpath(os.path.join(dirpath, name))
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                what = f"link {os.readlink(path)}"
            elif os.path.isdir(path):
                what = "dir"
            else:
                with open(path, "rb") as fh:
                    what = hashlib.sha256(fh.read()).hexdigest()
            out[rel] = f"{st.st_mode:o} {st.st_mtime_ns} {what}"
    return out


def stored_text() -> str:
    """Every value of every column of every table of the database, as text: what a
    secret must never be found in (runs, journal, events, tasks, the event stream…)."""
    chunks = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                for value in row:
                    if isinstance(value, memoryview):
                        value = bytes(value)
                    if isinstance(value, bytes):
                        chunks.append(value.decode("utf-8", "replace"))
                    elif isinstance(value, (dict, list)):
                        chunks.append(json.dumps(value))
                    elif value is not None:
                        chunks.append(str(value))
    return "\n".join(chunks)


def run_script(code: str, *, env: dict[str, str], args: list[str]) -> subprocess.Popen:
    """A Python process with the project's settings and `env` (e.g. a worker host's own
    folders); `args` are its `sys.argv[1:]`."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "fusion_site.settings", "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
