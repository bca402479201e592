"""Two worker hosts judging a mission served by `git daemon` (docs/REPOSITORIES.md), in the
production shape: PostgreSQL, Redis and two `manage.py rundramatiq` processes, each with
a data folder, a mirror cache and a snapshot folder of its own. The repository exists
only as a bare repository under the daemon's base path, which no worker is told about:
they know the mission's `git://` URL, nothing else. The agent's clone pushes to it.

Afterwards every invariant of the fault scenarios holds (`assert_invariants` of
test_faults.py), both caches hold the mirror, no snapshot is left on either host, and
each host fetched the commit's files once for all the runs it judged.

Skipped unless DATABASE_URL is PostgreSQL and REDIS_URL is set (CI's second pass).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pytest
from django.conf import settings

from fusion_site.repos import mirrors
from missions.models import Mission
from tests.conftest import Repo, is_postgres
from tests.gitserver import GitDaemon
from tests.reliability.test_faults import (
    LEASE_SECONDS,
    ROOT,
    Workers,
    assert_invariants,
    build,
    child_database_url,
    clear_namespace,
    drive,
    start_all,
)
from validation.models import RunStatus, ValidatorRun

pytestmark = [
    pytest.mark.skipif(
        not (settings.REDIS_URL and is_postgres()),
        reason="production shape only: needs DATABASE_URL=postgres://… and REDIS_URL "
        "(the PostgreSQL + Redis pass of .ci/run)",
    ),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.postgres,
]

FEATURES = int(os.environ.get("FUSION_TWO_HOSTS_FEATURES", os.environ.get("FUSION_FAULT_FEATURES", "200")))
READY_TIMEOUT = 120


class Hosts(Workers):
    """`rundramatiq` processes that share only the database and the broker."""

    def __init__(self, tmp_path: Path):
        super().__init__(tmp_path)
        self.roots: dict[str, Path] = {}

    def start(self, name: str) -> subprocess.Popen:
        root = self.roots.setdefault(name, self.tmp_path / f"host-{name}")
        log = self.tmp_path / f"worker-{name}-{len(self.procs)}.log"
        env = {
            **os.environ,
            "DATABASE_URL": child_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "FUSION_EVENTS_PREFIX": settings.EVENTS_PREFIX,
            "SECRET_KEY": settings.SECRET_KEY,  # one deployment: one key
            "FUSION_DATA_DIR": str(root),
            "FUSION_REPO_CACHE": str(root / "repos"),
            "FUSION_SNAPSHOT_DIR": str(root / "snapshots"),
            "FUSION_RETRY_BACKOFF_MS": "0",
            "FUSION_RUN_LEASE_SECONDS": str(LEASE_SECONDS),
            "FUSION_CHECK_PARALLELISM": "1",
            "DJANGO_SETTINGS_MODULE": "fusion_site.settings",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
        }
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "rundramatiq", "--processes", "1", "--threads", "2"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append((proc, log))
        return proc

    def wait_consuming(self, count: int) -> None:
        """Until `count` worker processes have asked Redis for messages (their heartbeats):
        both hosts take part from the first message on."""
        broker = dramatiq.get_broker()
        key = f"{broker.namespace}:__heartbeats__"
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            others = [m for m in broker.client.zrange(key, 0, -1) if m.decode() != broker.broker_id]
            if len(others) >= count:
                return
            assert all(proc.poll() is None for proc, _ in self.procs), self.logs()
            time.sleep(0.2)
        pytest.fail(f"the worker hosts did not start consuming in {READY_TIMEOUT}s\n{self.logs()}")


@pytest.fixture
def hosts(transactional_db, tmp_path, settings):
    settings.FUSION_REDRIVE_GRACE = 15  # as in test_faults: re-send only what was clearly lost
    settings.FUSION_REPO_CACHE = tmp_path / "web-cache"  # the web tier's own (it should need none)
    clear_namespace()
    handle = Hosts(tmp_path)
    try:
        yield handle
    finally:
        handle.stop_all()
        clear_namespace()


@pytest.fixture
def daemon(tmp_path):
    server = GitDaemon(tmp_path / "served").start()
    try:
        yield server
    finally:
        server.stop()


def test_two_hosts_with_their_own_caches_judge_a_mission_served_by_git_daemon(hosts, daemon, tmp_path, alice, capsys):
    daemon.bare("shop.git")
    url = daemon.url("shop.git")
    clone = Repo(tmp_path / "agent")  # the agent's checkout, the only working copy there is
    subprocess.run(["git", "clone", "-q", url, str(clone.path)], check=True, capture_output=True)
    clone.git("symbolic-ref", "HEAD", "refs/heads/main")
    clone.commit({"README.md": "# shop\n"}, "initial")
    mission, revision, expected = build(clone, alice, FEATURES)
    clone.git("push", "-q", "origin", "HEAD:refs/heads/main")
    Mission.objects.filter(pk=mission.pk).update(repository=url)  # the URL is all the workers get
    mission.refresh_from_db()
    source = mission.source()
    assert not source.local

    for name in ("a", "b"):
        hosts.start(name)
    hosts.wait_consuming(2)
    connected = daemon.connections()
    started = time.monotonic()
    start_all(mission, alice, revision)
    sweeps = drive(mission, expected, hosts)
    elapsed = time.monotonic() - started

    figures = assert_invariants(mission, expected, clone)
    assert not ValidatorRun.objects.filter(mission=mission, status=RunStatus.ERROR).exists()
    fetched = {}
    for name, root in hosts.roots.items():
        mirror = root / "repos" / mirrors.mirror_dir(source).name
        assert (mirror / "HEAD").is_file(), f"host {name} has no mirror"
        lines = [line.split(" ", 1)[1] for line in (mirror / "fusion-fetches").read_text().splitlines()]
        # The commit came with the clone, its files with the first snapshot: once per host.
        assert lines == ["clone", f"blobs {revision}"], f"host {name} fetched {lines}"
        assert not list((root / "snapshots").iterdir()), f"host {name} left snapshots"
        fetched[name] = len(lines)
    assert not mirrors.mirror_dir(source).exists()  # the web tier pinned full ids: no network
    with capsys.disabled():
        print(
            f"\n[two hosts] {FEATURES} features over {url}, settled in {elapsed:.1f}s; fetches per host {fetched}; "
            f"{daemon.connections() - connected} connections to the server; sweeps {sweeps}; {figures}"
        )
