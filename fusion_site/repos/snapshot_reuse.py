"""A worker's recent snapshots, kept read-only for its next runs of the same repository:
the next revision's snapshot is the nearest kept one brought to that revision by
`git read-tree -m -u` (the files that changed, not the whole tree). On a 20,000-file
repository a snapshot from scratch took about 2 s and one made so about 0.1 s
(bench/sandbox.py, docs/BENCHMARKS.md "Sandbox").

Only where no check can write a snapshot (`sandbox.layers_work()`: every run check runs
over it with a private overlay), never with submodules, and only a snapshot nothing of
the service wrote after it was made (`TreeFacts.written`, set by every writer of a
snapshot: restored protected files, a run check in the snapshot itself without an
overlay) after a run that ended normally. Before it is used again, git checks it against
its index (`diff-files`: contents, modes, types, deletions; `ls-files -o`: anything
added); any difference, or any failure of git, and the snapshot is made from scratch.

Each kept snapshot belongs to one process (`keep-<pid>-<hex>` in the snapshot folder)
and to one run at a time: a run takes it by renaming it to its own name, with its index,
so no two runs ever share one. The sweep removes a dead process's (`sweep`), renaming it
away first, so that a sweep and a take never work on the same folder."""

from __future__ import annotations

import atexit
import os
import re
import stat
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from fusion_site.repos import mirrors
from fusion_site.repos.sources import SnapshotError, Source, run_git
from fusion_site.repos.trees import INDEX_FORMAT, MIRROR_MODES, READ_ONLY_UMASK, remove_tree
from fusion_site.runtime import sandbox
from fusion_site.runtime.proc import run_nicer

# A smaller snapshot is made from scratch: its one `git read-tree` costs about what the
# three git calls of a reuse cost, and its removal is cheap (bench/sandbox.py).
KEEP_MIN_FILES = 1000
KEPT_NAME = re.compile(r"^keep-(\d+)-[0-9a-f]{12}(?:\.idx(?:\.lock)?)?$")


@dataclass(frozen=True)
class Kept:
    folder: Path
    index: Path
    commit: str


_kept: dict[str, list[Kept]] = {}  # source key -> its kept snapshots, oldest first
_order: list[str] = []  # source keys, least recently used first
_lock = threading.Lock()


def possible(*, submodules: bool) -> bool:
    """Whether a snapshot may be kept for reuse here."""
    return settings.FUSION_SNAPSHOTS_KEPT > 0 and not submodules and sandbox.layers_work()


def take(key: str, *, folder: Path, index: Path) -> str | None:
    """The commit of the most recent snapshot kept for source `key`, now at `folder` with
    its index at `index` (this run's alone); None when there is none."""
    while True:
        with _lock:
            kept = _kept.get(key)
            if not kept:
                return None
            entry = kept.pop()
        try:
            os.rename(entry.index, index)
            os.rename(entry.folder, folder)
        except OSError:  # removed meanwhile (a sweep that took this process for dead): the next one
            _discard(entry.folder, entry.index)
            _discard(folder, index)
            continue
        return entry.commit


def made_from_kept(source: Source, mirror: Path, commit: str, target: Path, index: Path) -> bool:
    """Whether `target` (with its index) now holds `commit`, made from a snapshot this
    process kept of the same repository: taken (renamed to `target`), checked against its
    index, then brought to `commit` by `git read-tree -m -u` (the files that differ
    only). False, with nothing left at `target`, when there is none or anything is off."""
    older = take(source.key, folder=target, index=index)
    if older is None:
        return False
    timeout = settings.FUSION_GIT_REMOTE_TIMEOUT
    env = {"GIT_INDEX_FILE": str(index)}
    tree = ["--git-dir", str(mirror), "--work-tree", str(target)]
    try:
        # Anything that differs from what git checked out (a file's contents, mode or type,
        # a file gone, anything added): the snapshot is made from scratch.
        for check in (["diff-files", "--quiet"], ["ls-files", "-z", "--others", "--directory"]):
            done = run_git([*INDEX_FORMAT, *tree, *check], cwd=target, timeout=timeout, extra_env=env)
            if done.returncode != 0 or done.stdout:
                raise SnapshotError(f"kept snapshot differs from its index ({check[0]})")
        with mirrors.filling(source, mirror, commit):
            move = [*MIRROR_MODES, *INDEX_FORMAT, *tree, "read-tree", "-m", "-u", older, commit]
            done = run_git(move, cwd=target, timeout=timeout, extra_env=env, umask=READ_ONLY_UMASK)
        if done.returncode != 0:
            raise SnapshotError(f"read-tree -m -u failed: {done.stderr.strip()[:300]}")
        _writable_added_folders(mirror, target, older, commit)
    except (SnapshotError, OSError, subprocess.TimeoutExpired):
        index.unlink(missing_ok=True)
        remove_tree(target)
        return False
    return True


def _writable_added_folders(mirror: Path, target: Path, older: str, commit: str) -> None:
    """The folders `read-tree -m -u` made (read-only, its umask), writable as in a snapshot
    made from scratch (`_writable_folders`): those of the files added since `older`."""
    done = run_nicer(
        ["git", "--git-dir", str(mirror), "diff-tree", "-r", "-z", "--name-only", "--diff-filter=A", older, commit]
    )
    if done.returncode != 0:
        raise SnapshotError("git diff-tree failed")
    folders = {os.fsdecode(name).rpartition("/")[0] for name in done.stdout.split(b"\0") if b"/" in name}
    for folder in sorted({parent for f in folders for parent in _with_parents(f)}):
        path = target / folder
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IWUSR:
            os.chmod(path, st.st_mode | stat.S_IWUSR)


def _with_parents(folder: str) -> list[str]:
    parts = folder.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def keep(key: str, *, folder: Path, index: Path, commit: str) -> bool:
    """Keep the snapshot at `folder` (its index at `index`) of `commit` for this process's
    next runs of source `key`; the least recently used beyond the bounds are removed."""
    name = f"keep-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    entry = Kept(folder=folder.with_name(name), index=folder.with_name(name + ".idx"), commit=commit)
    try:
        os.rename(index, entry.index)
        os.rename(folder, entry.folder)
    except OSError:
        _discard(entry.folder, entry.index)
        return False
    evicted: list[Kept] = []
    with _lock:
        _kept.setdefault(key, []).append(entry)
        if key in _order:
            _order.remove(key)
        _order.append(key)
        evicted += _bound()
    for old in evicted:
        _discard(old.folder, old.index)
    return True


def _bound() -> list[Kept]:
    per_source, total = settings.FUSION_SNAPSHOTS_KEPT, settings.FUSION_SNAPSHOTS_KEPT_TOTAL
    evicted: list[Kept] = []
    for key in list(_order):
        kept = _kept[key]
        while len(kept) > per_source:
            evicted.append(kept.pop(0))
    while sum(len(k) for k in _kept.values()) > total:
        key = next(k for k in _order if _kept[k])
        evicted.append(_kept[key].pop(0))
    for key in [k for k in _order if not _kept[k]]:
        _order.remove(key)
        del _kept[key]
    return evicted


def forget() -> None:
    """Remove every snapshot this process keeps (at its exit; in tests)."""
    with _lock:
        entries = [entry for kept in _kept.values() for entry in kept]
        _kept.clear()
        _order.clear()
    for entry in entries:
        _discard(entry.folder, entry.index)


atexit.register(forget)


def _discard(folder: Path, index: Path) -> None:
    index.unlink(missing_ok=True)
    remove_tree(folder)


def sweep(root: Path) -> int:
    """Remove the kept snapshots (and index files) of processes that are gone. Each is
    renamed to a dead owner's name first: a rename succeeds once, so either its owner
    takes it for a run or the sweep removes it, never both."""
    removed = 0
    for child in list(root.iterdir()):
        named = KEPT_NAME.match(child.name)
        if named is None or _alive(int(named.group(1))):
            continue
        if child.is_symlink() or not child.is_dir():
            child.unlink(missing_ok=True)
            continue
        trash = child.with_name(f"keep-0-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(child, trash)
        except OSError:
            continue
        _discard(trash, Path(str(child) + ".idx"))
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def mark_written(path: Path) -> None:
    """Say that the service wrote into the snapshot `path` is (or is a folder of): it is
    not kept for reuse."""
    from fusion_site.repos.tree_index import facts_of

    facts = facts_of(path)
    if facts is not None:
        facts.written = True
