"""What a worker checks before it trusts its mirror of a source (docs/REPOSITORIES.md).

- **Nothing in the mirror rewrites what a commit id means.** Replace refs
  (`refs/replace/`) and an `info/grafts` file make git read another tree or another
  history for a commit id. Every git call of the host ignores them (`git_env`), and a
  mirror that carries them is made again from the source: a check that found the mirror
  must not be able to change what a later run of any mission judges.
- **The mission's own access reads the commit.** A mirror is shared only by missions that
  read the same URL with the same credentials variable (`Source.key`). Before a commit that
  the mirror already holds is used, the source is asked once per worker process whether it
  has that commit, with the mission's credentials: a token revoked or rotated since the
  commit was fetched reads nothing. A commit this process fetched, saw at a branch or tag
  of the source, or found in a mirror it cloned itself, was read from the source with that
  access already. A local path needs no question: the mirror read is the check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from fusion_site.repos.sources import SnapshotError, Source, SourceUnavailable, run_git, scrub

_LIMIT = 50_000
_lock = threading.Lock()
# (source key, commit): the source answered, with that source's access, that it has it.
_confirmed: set[tuple[str, str]] = set()
# (source key, mirror inode): a mirror this process cloned from the source itself.
_cloned: set[tuple[str, int]] = set()
# packed-refs identity (path, inode, size, mtime) -> whether it holds a replace ref.
_packed: dict[tuple[str, int, int, int], bool] = {}


# ---------------------------------------------------------------- rewritten objects


def rewritten(mirror: Path) -> str:
    """What in `mirror` rewrites a commit id's meaning ('' for nothing): a few `lstat`s,
    and a read of `packed-refs` only when it changed."""
    if os.path.lexists(mirror / "info" / "grafts"):
        return "an info/grafts file"
    replace = mirror / "refs" / "replace"
    if os.path.lexists(replace):
        try:
            if replace.is_symlink() or any(replace.iterdir()):
                return "replace refs (refs/replace/)"
        except OSError:  # not a folder
            return "replace refs (refs/replace/)"
    if _packed_replace(mirror / "packed-refs"):
        return "replace refs (refs/replace/ in packed-refs)"
    return ""


def _packed_replace(path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _packed:
            return _packed[key]
    try:
        with open(path, "rb") as fh:
            found = any(b" refs/replace/" in line for line in fh)
    except OSError:
        found = True  # unreadable: never trusted
    with _lock:
        if len(_packed) >= 1_000:
            _packed.clear()
        _packed[key] = found
    return found


def discard(root: Path, key: str, mirror: Path) -> None:
    """Move `mirror` out of the way and remove it (its writer lock held by the caller).
    Renamed first: a reader that comes next finds no mirror and waits for the new one."""
    doomed = root / f".evicted-{key}-{os.urandom(4).hex()}"
    try:
        os.rename(mirror, doomed)
    except OSError as exc:
        raise SnapshotError(f"the mirror {mirror.name} carries rewritten objects and cannot be removed: {exc}") from exc
    shutil.rmtree(doomed, ignore_errors=True)


# ---------------------------------------------------------------- the mission's access


def _inode(mirror: Path) -> int:
    try:
        return os.stat(mirror).st_ino
    except OSError:
        return -1


def cloned(source: Source, mirror: Path) -> None:
    """`mirror` was just cloned from the source by this process, with its access."""
    with _lock:
        if len(_cloned) >= 10_000:
            _cloned.clear()
        _cloned.add((source.key, _inode(mirror)))


def remember(source: Source, commit: str) -> None:
    """The source showed `commit` with the source's access (a fetch of it, a ref)."""
    with _lock:
        if len(_confirmed) >= _LIMIT:
            _confirmed.clear()
        _confirmed.add((source.key, commit))


def known(source: Source, mirror: Path, commit: str) -> bool:
    """Whether this process needs not ask the source about `commit` (docstring above)."""
    if source.local:
        return True
    with _lock:
        if (source.key, commit) in _confirmed:
            return True
    return (source.key, _inode(mirror)) in _cloned


def forget() -> None:
    """What a new worker process knows: nothing (tests use it for a worker's restart)."""
    with _lock:
        _confirmed.clear()
        _cloned.clear()


def ask(source: Source, mirror: Path, commit: str, *, timeout: float) -> None:
    """Ask the source, with the source's credentials, whether it has `commit`;
    `SourceUnavailable` when it says no or cannot be read. First without transferring
    anything (`fetch --negotiate-only`: the server acknowledges the commits it has); a
    server without that (protocol v2's `wait-for-done`) gets a fetch of the commit object
    alone (`--depth=1 --filter=tree:0`) into a throwaway repository."""
    try:
        proc = run_git(
            ["fetch", "--quiet", "--negotiate-only", f"--negotiation-tip={commit}", "--", source.url],
            cwd=mirror,
            source=source,
            timeout=timeout,
        )
        if proc.returncode == 0:
            if commit in proc.stdout.split():
                return
            raise SourceUnavailable(f"commit {commit} is not in repository {source.display} (asked with its access)")
        _probe(source, commit, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise SourceUnavailable(f"asking {source.display} for commit {commit} timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise SnapshotError(f"git fetch could not run: {exc}") from exc


def _probe(source: Source, commit: str, *, timeout: float) -> None:
    with tempfile.TemporaryDirectory(prefix="fusion-probe-") as tmp:
        init = run_git(["init", "--bare", "--quiet", "--template=", tmp], timeout=timeout)
        if init.returncode != 0:
            raise SnapshotError(f"git init failed: {init.stderr.strip()[:300]}")
        proc = run_git(
            ["fetch", "--quiet", "--depth=1", "--filter=tree:0", "--no-tags", "--", source.url, commit],
            cwd=Path(tmp),
            source=source,
            timeout=timeout,
        )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        reason = scrub(lines[-1] if lines else f"exit {proc.returncode}", source)
        raise SourceUnavailable(
            f"commit {commit} cannot be read from repository {source.display} with its access: {reason[:400]}"
        )
