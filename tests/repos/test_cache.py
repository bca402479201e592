"""The worker's mirror cache (fusion_site/repos/mirrors.py): one mirror per source and
worker host, one fetch per new commit per host whatever the number of runs reading it,
clones and fetches serialized across threads and processes, eviction of the least
recently used mirror but never of one being read."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from fusion_site.repos import mirrors
from fusion_site.repos.snapshots import as_source, snapshot
from validation.models import RunStatus, ValidatorRun

from .conftest import WAIT, complete, fetch_lines, loop_state, run_script, url_mission

HOST_SCRIPT = r"""
import json, os, sys, threading, time
import django
django.setup()
from django.conf import settings
from fusion_site.repos import mirrors
from fusion_site.repos.snapshots import as_source, snapshot
url, go, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
source = as_source(url)
mirrors.ensure_mirror(source)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
commit = open(go).read().strip()
barrier = threading.Barrier(threads)
seen = [None] * threads
def read(i):
    try:
        barrier.wait()
        with snapshot(source, commit, label=f"run-{i}") as folder:
            seen[i] = (folder / "f1.txt").read_text()
    except BaseException as exc:
        seen[i] = repr(exc)
workers = [threading.Thread(target=read, args=(i,)) for i in range(threads)]
for t in workers:
    t.start()
for t in workers:
    t.join()
path = mirrors.mirror_dir(source)
print(json.dumps({
    "seen": seen,
    "mirror": str(path),
    "fetches": [l.split(" ", 1)[1] for l in (path / "fusion-fetches").read_text().splitlines()],
    "snapshots_left": os.listdir(settings.FUSION_SNAPSHOT_DIR),
}))
"""

CLONE_SCRIPT = r"""
import os, sys, time
import django
django.setup()
from fusion_site.repos import mirrors
from fusion_site.repos.snapshots import as_source
url, go = sys.argv[1], sys.argv[2]
source = as_source(url)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
print(mirrors.ensure_mirror(source), flush=True)
"""


def host_env(root: Path) -> dict[str, str]:
    """A worker host of its own: data, cache and snapshot folders nobody else uses."""
    return {
        "FUSION_DATA_DIR": str(root),
        "FUSION_REPO_CACHE": str(root / "repos"),
        "FUSION_SNAPSHOT_DIR": str(root / "snapshots"),
    }


def release(go: Path, text: str) -> None:
    """Let the waiting processes go: the file appears at once with its content (a rename)."""
    tmp = go.with_name(go.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(go)


def wait_ready(proc) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"{line!r} {proc.stderr.read() if proc.poll() is not None else ''}"


def finish(proc) -> str:
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err[-3000:]
    return out


@pytest.mark.django_db(transaction=True)
def test_two_worker_hosts_each_judge_from_a_cache_of_their_own(worker, served, alice, settings, tmp_path):
    mission = url_mission(alice, served.url, ("f1", "f2"))
    revision = served.commit({"f1.txt": "done f1\n", "f2.txt": "done f2\n"}, "implement")
    hosts = {name: tmp_path / f"host-{name}" for name in "ab"}
    for name, key in (("a", "f1"), ("b", "f2")):  # host a judges f1, host b judges f2
        settings.FUSION_REPO_CACHE = hosts[name] / "repos"
        settings.FUSION_SNAPSHOT_DIR = hosts[name] / "snapshots"
        complete(alice, mission, key, revision)
        worker.drain()
        assert loop_state(mission, key) == "passed"
    assert set(ValidatorRun.objects.filter(mission=mission).values_list("status", flat=True)) == {RunStatus.PASSED}
    for root in hosts.values():
        mirror = root / "repos" / mirrors.mirror_dir(mission.source()).name
        assert (mirror / "HEAD").is_file() and fetch_lines(mirror) == ["clone", f"blobs {revision}"]
        assert not list((root / "snapshots").iterdir())


def test_concurrent_snapshots_of_a_new_commit_make_one_fetch_per_host(served, tmp_path):
    served.commit({"f1.txt": "old\n"}, "before")
    go = tmp_path / "go"
    hosts = [
        run_script(HOST_SCRIPT, env=host_env(tmp_path / f"host-{i}"), args=[served.url, str(go), "6"]) for i in range(2)
    ]
    for proc in hosts:
        wait_ready(proc)  # each host has its mirror, without the new commit
    new = served.commit({"f1.txt": "new\n"}, "after")
    connected = served.daemon.connections()
    release(go, new)
    results = [json.loads(finish(proc).splitlines()[-1]) for proc in hosts]

    assert len({r["mirror"] for r in results}) == 2  # two caches
    for result in results:
        assert result["seen"] == ["new\n"] * 6
        # six snapshots, one fetch of the commit and one of its files (a partial mirror)
        assert result["fetches"] == ["clone", f"commit {new}", f"blobs {new}"]
        assert result["snapshots_left"] == []
    assert served.daemon.connections() - connected == 2 * 2  # and nothing else asked the server


def test_threads_snapshotting_a_new_commit_make_one_fetch(served):
    source = as_source(served.url)
    mirror = mirrors.ensure_mirror(source)
    new = served.commit({"f1.txt": "done f1\n"}, "new")
    barrier, seen = threading.Barrier(8), []

    def read():
        barrier.wait()
        with snapshot(source, new, label="run-1") as folder:
            seen.append((folder / "f1.txt").read_text())

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT)
    assert seen == ["done f1\n"] * 8
    assert fetch_lines(mirror) == ["clone", f"commit {new}", f"blobs {new}"]


def test_processes_making_the_same_mirror_at_once_make_one(served, tmp_path, settings):
    go = tmp_path / "go"
    env = host_env(tmp_path / "host")  # one host, four worker processes
    procs = [run_script(CLONE_SCRIPT, env=env, args=[served.url, str(go)]) for _ in range(4)]
    for proc in procs:
        wait_ready(proc)
    connected = served.daemon.connections()
    release(go, "go")
    paths = {finish(proc).splitlines()[-1] for proc in procs}

    cache = tmp_path / "host" / "repos"
    assert len(paths) == 1 and Path(paths.pop()).parent == cache
    assert [p.name for p in cache.glob("*.git")] == [f"{as_source(served.url).key}.git"]
    assert not list(cache.glob(".tmp-*"))
    assert fetch_lines(next(cache.glob("*.git"))) == ["clone"]
    assert served.daemon.connections() - connected == 1


# ------------------------------------------------------------------------------ eviction


@pytest.fixture
def three_sources(daemon, tmp_path):
    """Three served repositories, each mirrored and read once (oldest use first)."""
    from tests.conftest import Repo

    sources = []
    for i, name in enumerate(("a", "b", "c")):
        src = Repo(tmp_path / f"src-{name}")
        src.path.mkdir()
        src.git("init", "-q", "-b", "main")
        src.commit({"data.bin": os.urandom(64 * 1024).hex()}, name)
        daemon.bare(f"{name}.git", source=src.path)
        source = as_source(daemon.url(f"{name}.git"))
        commit = src.git("rev-parse", "HEAD").strip()
        with snapshot(source, commit, label="run-1") as folder:
            assert (folder / "data.bin").is_file()
        age(source, 300 - 100 * i)
        sources.append(source)
    return sources


def age(source, seconds: float) -> None:
    """Last used `seconds` ago (what the LRU order reads)."""
    moment = time.time() - seconds
    os.utime(mirrors.cache_root() / f"{source.key}.use", (moment, moment))


def present(source) -> bool:
    return (mirrors.mirror_dir(source) / "HEAD").is_file()


def test_eviction_removes_the_least_recently_used_mirror_first(three_sources):
    a, b, c = three_sources
    total = sum(mirrors._size(mirrors.mirror_dir(s)) for s in three_sources)
    assert mirrors.evict(budget=total - 1) == [a.key]
    assert (present(a), present(b), present(c)) == (False, True, True)
    assert not list(mirrors.cache_root().glob(".evicted-*"))
    # A reader that comes next makes the mirror again.
    with mirrors.in_use(a):
        mirrors.ensure_mirror(a)
    assert present(a) and fetch_lines(mirrors.mirror_dir(a)) == ["clone"]


def test_eviction_never_removes_a_mirror_being_read(three_sources):
    a, b, c = three_sources
    with mirrors.in_use(a) as held:
        age(a, 1000)  # held *and* the least recently used
        assert mirrors.evict(budget=0) == [b.key, c.key]
        assert present(a) and (held / "HEAD").is_file()
    assert mirrors.evict(budget=0) == [a.key]


def test_a_snapshot_is_read_from_its_own_files_so_evicting_its_mirror_meanwhile_is_safe(served):
    # The mirror is held only while the snapshot is filled: the checks read the snapshot.
    source = as_source(served.url)
    commit = served.commit({"f1.txt": "done f1\n"}, "work")
    with snapshot(source, commit, label="run-1") as folder:
        assert mirrors.evict(budget=0) == [source.key]
        assert not present(source) and (folder / "f1.txt").read_text() == "done f1\n"
    with snapshot(source, commit, label="run-2") as folder:  # made again on the next use
        assert (folder / "f1.txt").read_text() == "done f1\n"
    assert fetch_lines(mirrors.mirror_dir(source)) == ["clone", f"blobs {commit}"]


def test_a_new_mirror_past_the_budget_evicts_the_others_but_never_itself(three_sources, daemon, tmp_path, settings):
    settings.FUSION_REPO_CACHE_BYTES = 1  # every other mirror is over budget
    daemon.bare("d.git", source=tmp_path / "src-a")
    d = as_source(daemon.url("d.git"))
    mirrors.ensure_mirror(d)
    assert present(d) and not any(present(s) for s in three_sources)
