"""Folders of an on-disk cache that threads and worker processes share (the repository
mirrors, the built environments): per-key file locks and least-recently-used eviction.

Each key `k` has beside its folder `k.lock` (held exclusively while the folder is made or
changed) and `k.use` (held shared while it is read; its modification time is the key's
last use). `fcntl.flock` locks belong to the open file, so two threads of one process
exclude each other as two processes do. The lock files are never removed: one removed
while another process has it open would let two holders each hold "the" lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def flock(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, mode)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def in_use(base: Path, key: str) -> Iterator[None]:
    """`key` held against eviction, and marked as used now."""
    use = base / f"{key}.use"
    with flock(use, fcntl.LOCK_SH):
        with contextlib.suppress(OSError):
            os.utime(use)
        yield


def tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def evict(
    base: Path,
    folders: list[tuple[str, Path]],
    *,
    budget: int,
    keep: str = "",
    size: Callable[[Path], int] = tree_bytes,
) -> list[str]:
    """Remove the least recently used of `folders` ((key, folder) under `base`) while they
    add up to more than `budget` bytes; never `keep`, never one held. Returns the keys removed."""
    entries = []
    for key, folder in folders:
        use = base / f"{key}.use"
        try:
            used = use.stat().st_mtime if use.exists() else folder.stat().st_mtime
        except OSError:  # removed by another worker meanwhile
            continue
        entries.append((used, key, folder, size(folder)))
    total = sum(e[3] for e in entries)
    removed = []
    for _used, key, folder, bytes_ in sorted(entries):
        if total <= budget:
            break
        if key == keep or not _try_remove(base, key, folder):
            continue
        total -= bytes_
        removed.append(key)
    return removed


def _try_remove(base: Path, key: str, folder: Path) -> bool:
    with open(base / f"{key}.lock", "a") as lock, open(base / f"{key}.use", "a") as use:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # being made or read: kept this time
        # Renamed first: whoever comes next finds no folder and makes a new one.
        doomed = base / f".evicted-{key}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(folder, doomed)
        except OSError:
            return False
    remove(doomed)
    return True


def remove(path: Path) -> None:
    """`path` removed, whatever permissions what was made in it left."""
    if not os.path.lexists(path):
        return

    def writable_again(func: Callable[..., object], name: str, _exc: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o755)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o755)
            func(name)

    shutil.rmtree(path, onerror=writable_again)
