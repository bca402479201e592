"""What a snapshot's commit holds that its files do not show: submodules left unpopulated
(gitlinks) and Git LFS pointers (docs/REPOSITORIES.md, "Submodules" and "Git LFS").

Read from the index `git read-tree` wrote for the snapshot (outside the snapshot's folder,
kept until the snapshot is removed), only when a check needs to know: most runs never
parse it. The facts are the judged commit's, not what a check left in the tree: a file
counts as an LFS pointer only while its content still hashes to the commit's blob id.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GITLINK = 0o160000
# The spec's limit: a pointer is at most this long (git-lfs never reads a longer file as one).
LFS_POINTER_MAX = 1024
LFS_PREFIXES = (b"version https://git-lfs.github.com/spec/v1\n", b"version https://hawser.github.com/spec/v1\n")


@dataclass(frozen=True)
class IndexEntry:
    path: str  # relative to the index's work tree; undecodable bytes as surrogate escapes
    mode: int
    size: int  # as checked out (0 for a gitlink)
    oid: bytes


def read_index(path: Path, hash_size: int = 20) -> list[IndexEntry]:
    """The entries of a git index of version 2 or 3 (what `snapshot` asks git to write);
    `hash_size`: 20 (SHA-1) or 32 (SHA-256). `ValueError` for anything else."""
    data = path.read_bytes()
    if len(data) < 12 or data[:4] != b"DIRC":
        raise ValueError(f"{path.name} is not a git index")
    version, count = int.from_bytes(data[4:8], "big"), int.from_bytes(data[8:12], "big")
    if version not in (2, 3):
        raise ValueError(f"{path.name} is a version {version} index")
    entries, pos = [], 12
    for _ in range(count):
        mode = int.from_bytes(data[pos + 24 : pos + 28], "big")
        size = int.from_bytes(data[pos + 36 : pos + 40], "big")
        oid = data[pos + 40 : pos + 40 + hash_size]
        flags = int.from_bytes(data[pos + 40 + hash_size : pos + 42 + hash_size], "big")
        start = pos + 42 + hash_size + (2 if flags & 0x4000 else 0)
        end = data.index(b"\0", start)
        entries.append(IndexEntry(os.fsdecode(data[start:end]), mode, size, oid))
        pos += (end - pos + 8) & ~7  # the name is padded with 1 to 8 NULs to a multiple of 8
    return entries


def is_lfs_pointer(path: Path) -> bool:
    """Whether the file at `path` is a Git LFS pointer (small, starting with the spec's
    version line). Never follows a link and never waits on a FIFO a check left there."""
    data = _read_small(path)
    return data is not None and data.startswith(LFS_PREFIXES)


def _read_small(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > LFS_POINTER_MAX:
            return None
        return os.read(fd, LFS_POINTER_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _blob_id(data: bytes, size: int) -> bytes:
    return hashlib.new("sha1" if size == 20 else "sha256", b"blob %d\0" % len(data) + data).digest()


@dataclass
class TreeFacts:
    """One snapshot's indexes: the top's, and one per populated submodule (`where`: its
    folder in the snapshot, '' for the top). `unfetched`: the gitlinks left empty and why;
    every other gitlink of the top index is empty because `default_reason` holds."""

    top: Path
    folder: str  # the mission's folder in the snapshot ('' or 'app/')
    hash_size: int  # of the repository's object ids: 20 (SHA-1) or 32 (SHA-256)
    default_reason: str
    indexes: list[tuple[str, Path]] = field(default_factory=list)
    populated: set[str] = field(default_factory=set)
    unfetched: dict[str, str] = field(default_factory=dict)
    # The service wrote into the snapshot after it was made: never kept for reuse
    # (`snapshot_reuse.mark_written`).
    written: bool = False
    # What was read once: parallel checks of one run ask the same questions.
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def _once(self, name: str, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if name not in self._memo:
                self._memo[name] = compute()
            return self._memo[name]

    def _entries(self) -> list[tuple[str, IndexEntry]]:
        return self._once("entries", self._read_entries)

    def _read_entries(self) -> list[tuple[str, IndexEntry]]:
        found = []
        for where, index in self.indexes:
            with contextlib.suppress(OSError, ValueError):  # unknown facts: nothing detected
                found += [(where + entry.path, entry) for entry in read_index(index, self.hash_size)]
        return found

    def unpopulated(self) -> dict[str, str]:
        """Each submodule folder (relative to the snapshot) that is empty, and why."""
        links = {path: self.default_reason for path, e in self._entries() if e.mode == GITLINK}
        links.update(self.unfetched)
        return {path: why for path, why in links.items() if path not in self.populated}

    def unpopulated_around(self, rel: str) -> tuple[str, str] | None:
        """The empty submodule `rel` (relative to the mission's folder) lies in, and why."""
        path = self.folder + rel
        return next(((link, why) for link, why in self.unpopulated().items() if path.startswith(link + "/")), None)

    def in_folder(self, paths: dict[str, str]) -> dict[str, str]:
        return {path: why for path, why in paths.items() if path.startswith(self.folder)}

    def lfs_pointers(self) -> list[str]:
        """The LFS pointers of the mission's folder, as committed (relative to the snapshot)."""
        return self._once("lfs", self._find_pointers)

    def _find_pointers(self) -> list[str]:
        found = []
        for path, entry in self._entries():
            if entry.mode & 0o170000 != 0o100000 or not 0 < entry.size <= LFS_POINTER_MAX:
                continue
            if not path.startswith(self.folder):
                continue
            data = _read_small(self.top / path)
            if data is not None and data.startswith(LFS_PREFIXES) and _blob_id(data, self.hash_size) == entry.oid:
                found.append(path)
        return found


# The facts of each live snapshot, by its top folder: checks find them from their checkout.
_live: dict[str, TreeFacts] = {}
_live_lock = threading.Lock()


@contextlib.contextmanager
def registered(facts: TreeFacts) -> Iterator[TreeFacts]:
    with _live_lock:
        _live[str(facts.top)] = facts
    try:
        yield facts
    finally:
        with _live_lock:
            _live.pop(str(facts.top), None)


def facts_of(checkout: Path | None) -> TreeFacts | None:
    """The facts of the snapshot `checkout` is (or is a folder of); None for any other folder."""
    if checkout is None:
        return None
    with _live_lock:
        return next((_live[str(p)] for p in (checkout, *checkout.parents) if str(p) in _live), None)
