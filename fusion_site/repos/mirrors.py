"""The repository cache of one worker (docs/REPOSITORIES.md): one bare mirror per source,
under `FUSION_REPO_CACHE`, keyed by a hash of the source's normalized URL.

- A mirror is made on first use: a partial clone (`--filter=blob:none`: commits and trees
  now, a file's content when a snapshot needs it) where the server supports it, a full one
  otherwise (git falls back by itself). It is built in a temporary folder and renamed into
  place, so no reader ever sees half a mirror.
- A mirror is fetched only when a commit it needs is missing: that commit id first, then
  every branch and tag as a fallback. The blobs a partial mirror lacks are fetched by the
  first checkout of a commit, under the lock (`filling`). A local path goes through the
  same cache, so a user's repository is only ever read.
- `<key>.lock` serializes the changes to one mirror (clone, fetch, eviction) across threads
  and processes; readers hold `<key>.use` shared, so eviction never removes a mirror a
  snapshot is reading. Past `FUSION_REPO_CACHE_BYTES`, the least recently used mirrors go.
- A mirror is trusted only as `mirror_guard` says: one that carries replace refs or grafts
  is made again, and a commit it already holds is confirmed once per worker process with
  the mission's own access before it is used.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from fusion_site.repos import mirror_guard
from fusion_site.repos.sources import (
    SnapshotError,
    Source,
    SourceRefused,
    SourceUnavailable,
    normalize,
    run_git,
    scrub,
)
from fusion_site.runtime import cachedirs

FULL_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
LOCAL_TIMEOUT = 120
MIRROR_NAME = re.compile(r"^[0-9a-f]{24}\.git$")
HEADS_AND_TAGS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
logger = logging.getLogger(__name__)


def cache_root() -> Path:
    root = Path(settings.FUSION_REPO_CACHE)
    root.mkdir(parents=True, exist_ok=True)
    return root


def mirror_dir(source: Source) -> Path:
    return cache_root() / f"{source.key}.git"


# ---------------------------------------------------------------- the source of a mission


def source_of(repository: str, credentials_env: str = "") -> Source:
    """The source a mission's `repository` names. A local path that is a sub-folder of its
    repository reads the whole repository and keeps the folder as `prefix`."""
    source = normalize(repository)
    if not source.local:
        return Source(url=source.url, local=False, credentials_env=credentials_env)
    top, prefix = _local_top(source.url)
    return Source(url=top, local=True, credentials_env=credentials_env, prefix=prefix)


def _local_top(path: str) -> tuple[str, str]:
    if not Path(path).is_dir():
        raise SnapshotError(f"repository {path} does not exist")
    return _local_top_cached(path)


@functools.lru_cache(maxsize=256)
def _local_top_cached(path: str) -> tuple[str, str]:
    # A read of the user's repository (no write): where its top is, and our folder in it.
    # Only answers are cached; an error is asked again next time.
    proc = local_git(["rev-parse", "--path-format=absolute", "--show-toplevel", "--show-prefix"], cwd=Path(path))
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) not in (1, 2):
        raise SnapshotError(f"repository {path} is not a git repository with a working tree")
    return lines[0], (lines[1] if len(lines) == 2 else "")


# ---------------------------------------------------------------- git, bounded


def local_git(
    args: list[str], *, cwd: Path | None = None, source: Source | None = None, timeout: float = LOCAL_TIMEOUT
) -> subprocess.CompletedProcess:
    try:
        return run_git(args, cwd=cwd, source=source, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        where = source.display if source else "the repository cache"
        raise SourceUnavailable(f"git {args[0]} on {where} timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise SnapshotError(f"git {args[0]} could not run: {exc}") from exc


def mirror_git(mirror: Path, *args: str, timeout: float = LOCAL_TIMEOUT) -> str:
    """A local (no network) git command in a mirror; its output, or `SnapshotError`."""
    proc = local_git(list(args), cwd=mirror, timeout=timeout)
    if proc.returncode != 0:
        raise SnapshotError(f"git {' '.join(args[:2])} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def remote_git(source: Source, args: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return local_git(args, cwd=cwd, source=source, timeout=settings.FUSION_GIT_REMOTE_TIMEOUT)


def unreachable(source: Source, proc: subprocess.CompletedProcess) -> SourceUnavailable:
    reason = scrub(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}", source)
    return SourceUnavailable(f"repository {source.display} is unreachable: {reason[:400]}")


# ---------------------------------------------------------------- locks


_flock = cachedirs.flock


def _write_lock(source: Source) -> contextlib.AbstractContextManager[None]:
    return _flock(cache_root() / f"{source.key}.lock", fcntl.LOCK_EX)


@contextlib.contextmanager
def in_use(source: Source) -> Iterator[Path]:
    """The mirror, held against eviction while the caller reads it."""
    with cachedirs.in_use(cache_root(), source.key):
        yield mirror_dir(source)


# ---------------------------------------------------------------- making and fetching


def ensure_mirror(source: Source) -> Path:
    path = mirror_dir(source)
    if (path / "HEAD").is_file() and not mirror_guard.rewritten(path):
        return path
    with _write_lock(source):
        if (path / "HEAD").is_file() and (why := mirror_guard.rewritten(path)):
            # Only a command that was given a path to the mirror writes these: the mirror is
            # made again from the source rather than trusted or repaired (docs/REPOSITORIES.md).
            logger.warning("mirror %s of %s carries %s: made again", path.name, source.display, why)
            mirror_guard.discard(cache_root(), source.key, path)
        if not (path / "HEAD").is_file():
            _clone(source, path)
    evict(keep=source.key)
    return path


def _clone(source: Source, path: Path) -> None:
    tmp = cache_root() / f".tmp-{source.key}-{uuid.uuid4().hex[:8]}.git"
    try:
        # A local path clones with hard links (git ignores the filter there): fast, and
        # read-only for the user's repository.
        proc = remote_git(source, ["clone", "--bare", "--quiet", "--filter=blob:none", "--", source.url, str(tmp)])
        if proc.returncode != 0:
            raise unreachable(source, proc)
        mirror_git(tmp, "config", "remote.origin.fetch", HEADS_AND_TAGS[0])
        mirror_git(tmp, "config", "--add", "remote.origin.fetch", HEADS_AND_TAGS[1])
        mirror_git(tmp, "config", "gc.auto", "0")  # never a surprise repack in a worker's hot path
        _count_fetch(tmp, "clone")
        os.rename(tmp, path)
        mirror_guard.cloned(source, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# What this process already knows a mirror holds: a mirror never loses an object (no gc,
# no pruning of objects; a fetch only adds), so a "yes" stays true for that mirror, and
# every snapshot after the first of a commit needs no git process to ask again. Keyed by
# the mirror folder's identity: an evicted mirror and the one cloned in its place differ.
_KNOWN_LIMIT = 50_000
_known: dict[tuple[str, int, int], set[str]] = {}
_known_lock = threading.Lock()


def _identity(mirror: Path) -> tuple[str, int, int] | None:
    try:
        st = os.stat(mirror)
    except OSError:
        return None
    return str(mirror), st.st_ino, st.st_mtime_ns


def _known_yes(mirror: Path, fact: str) -> bool:
    key = _identity(mirror)
    with _known_lock:
        return key is not None and fact in _known.get(key, ())


def _learn(mirror: Path, fact: str) -> None:
    key = _identity(mirror)
    if key is None:
        return
    with _known_lock:
        if key not in _known and len(_known) >= 1_000:
            _known.clear()  # old identities of mirrors since fetched into or replaced
        facts = _known.setdefault(key, set())
        if len(facts) >= _KNOWN_LIMIT:
            facts.clear()
        facts.add(fact)


def has_commit(mirror: Path, commit: str) -> bool:
    """Whether the mirror has `commit`, without the lazy fetch a partial clone would make
    for a missing object (`--missing=allow-any` turns it off)."""
    if _known_yes(mirror, commit):
        return True
    proc = local_git(["rev-list", "--no-walk", "--ignore-missing", "--missing=allow-any", commit, "--"], cwd=mirror)
    found = proc.returncode == 0 and proc.stdout.strip() == commit
    if found:
        _learn(mirror, commit)
    return found


def ensure_commit(source: Source, commit: str) -> Path:
    """The mirror, holding `commit`: fetched (that commit, then all heads) only when missing.
    `SourceUnavailable` when the source is unreachable or does not have it."""
    if not FULL_COMMIT.match(commit):
        raise SourceRefused(f"{commit[:80]!r} is not a full commit id")
    try:
        return _ensure_commit(source, commit)
    except SourceUnavailable as exc:
        if commit in str(exc):
            raise
        raise SourceUnavailable(f"commit {commit} cannot be fetched: {exc}") from exc


def _ensure_commit(source: Source, commit: str) -> Path:
    path = ensure_mirror(source)
    if has_commit(path, commit):
        _confirm(source, path, commit)
        return path
    with _write_lock(source):
        if has_commit(path, commit):  # another worker thread fetched it meanwhile
            _confirm(source, path, commit)
            return path
        by_id = remote_git(source, ["fetch", "--quiet", "--no-tags", "origin", commit], cwd=path)
        _count_fetch(path, f"commit {commit}")
        if not (by_id.returncode == 0 and has_commit(path, commit)):
            refresh(source, path, locked=True)
            if not has_commit(path, commit):
                raise SourceUnavailable(f"commit {commit} is not in repository {source.display}")
    mirror_guard.remember(source, commit)  # fetched just now, with this source's access
    return path


def _confirm(source: Source, mirror: Path, commit: str) -> None:
    """A commit the mirror already held, confirmed with the source's own access once per
    worker process (`mirror_guard`). One network call, counted like a fetch (`verify`)."""
    if mirror_guard.known(source, mirror, commit):
        return
    try:
        mirror_guard.ask(source, mirror, commit, timeout=settings.FUSION_GIT_REMOTE_TIMEOUT)
    finally:
        _count_fetch(mirror, f"verify {commit}")
    mirror_guard.remember(source, commit)


def _lacks_blobs(mirror: Path, commit: str) -> bool:
    """Whether the commit's tree has objects a partial mirror lacks (no lazy fetch here)."""
    if _known_yes(mirror, f"complete {commit}"):
        return False
    proc = local_git(["rev-list", "--objects", "--no-walk", "--missing=print", commit, "--"], cwd=mirror)
    lacks = proc.returncode != 0 or any(line.startswith("?") for line in proc.stdout.splitlines())
    if not lacks:
        _learn(mirror, f"complete {commit}")
    return lacks


@contextlib.contextmanager
def filling(source: Source, mirror: Path, commit: str) -> Iterator[None]:
    """Held around a checkout of `commit`, which fetches the blobs a partial mirror lacks:
    the first checkout of a commit fetches them (one batch, counted) under the mirror's
    lock, and checkouts of it at the same time wait and then read them from the mirror,
    instead of each fetching the same blobs."""
    if not _lacks_blobs(mirror, commit):
        yield
        return
    with _write_lock(source):
        if _lacks_blobs(mirror, commit):
            _count_fetch(mirror, f"blobs {commit}")
        yield


def refresh(source: Source, path: Path, *, locked: bool = False) -> None:
    """Fetch every branch and tag of the source (a force-pushed branch moves, a deleted one goes)."""
    if not locked:
        with _write_lock(source):
            return refresh(source, path, locked=True)
    proc = remote_git(source, ["fetch", "--quiet", "--prune", "--force", "origin", *HEADS_AND_TAGS], cwd=path)
    _count_fetch(path, "heads")
    if proc.returncode != 0:
        raise unreachable(source, proc)
    return None


def _count_fetch(path: Path, what: str) -> None:
    # One line per network fetch: what bench/loop_throughput.py counts per worker.
    with contextlib.suppress(OSError), open(path / "fusion-fetches", "a") as fh:
        fh.write(f"{time.time():.3f} {what}\n")


def fetch_count(source_or_path: Source | Path) -> int:
    path = mirror_dir(source_or_path) if isinstance(source_or_path, Source) else source_or_path
    try:
        return len((path / "fusion-fetches").read_text().splitlines())
    except OSError:
        return 0


# ---------------------------------------------------------------- eviction


_size = cachedirs.tree_bytes


def evict(*, keep: str = "", budget: int | None = None) -> list[str]:
    """Remove the least recently used mirrors while the cache is over its byte budget;
    never `keep`, never one a reader holds. Returns the keys removed."""
    budget = settings.FUSION_REPO_CACHE_BYTES if budget is None else budget
    root = cache_root()
    # Only finished mirrors: not a clone being made, nor one being evicted.
    folders = [(path.name[: -len(".git")], path) for path in root.iterdir() if MIRROR_NAME.match(path.name)]
    return cachedirs.evict(root, folders, budget=budget, keep=keep)
