"""The base revision's tree against the judged commit's, and the snapshot's files put back
from it: the git side and the folder side of protected paths (`validation/protect.py`
decides which paths, and what a run does about them).

Trees are read with git's bytes: a path is a `str` decoded with `os.fsdecode` (surrogate
escapes), so a file name that is not UTF-8 is compared, restored and removed exactly, and
a file's content may be binary. Only the snapshot folder is written; the repository is
only read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from fusion_site.repos import snapshot_reuse
from fusion_site.repos.mirrors import LOCAL_TIMEOUT, mirror_git
from fusion_site.repos.sources import SnapshotError, Source, git_env
from fusion_site.runtime.proc import run_nicer

# ---------------------------------------------------------------- the two trees


@dataclass(frozen=True)
class Entry:
    mode: str
    kind: str  # blob | commit (a submodule)
    oid: str


def tree(repo: Path, commit: str, prefix: str = "") -> dict[str, Entry]:
    """Every path of `commit` under the workspace folder `prefix` (relative to it, as
    protected paths are) with its mode and object id; nothing when the folder is absent.
    Read as bytes: a file name need not be UTF-8 (`os.fsdecode` keeps it exact)."""
    treeish = f"{commit}:{prefix}" if prefix else commit
    if prefix and not _has_tree(repo, treeish):
        return {}
    entries = {}
    for record in _git_bytes(repo, ["ls-tree", "-r", "-z", "--full-tree", treeish]).split(b"\0"):
        if record:
            meta, path = record.split(b"\t", 1)
            mode, kind, oid = meta.decode().split(" ")
            entries[os.fsdecode(path)] = Entry(mode, kind, oid)
    return entries


def _git_bytes(repo: Path, args: list[str], *, source: Source | None = None, input: bytes | None = None) -> bytes:
    """A local git command's output as bytes (the text adapter `mirror_git` would replace
    what is not UTF-8: a file name, a binary file's content)."""
    try:
        proc = run_nicer(["git", "-C", str(repo), *args], env=git_env(source), input=input, timeout=LOCAL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapshotError(f"git {args[0]} failed: {exc}") from exc
    if proc.returncode != 0:
        raise SnapshotError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()[:500]}")
    return proc.stdout


def _has_tree(repo: Path, treeish: str) -> bool:
    try:
        return mirror_git(repo, "cat-file", "-t", treeish).strip() == "tree"
    except SnapshotError:
        return False


class TreeDiff:
    """The paths whose entry differs between the base revision and the judged commit."""

    def __init__(self, repo: Path, base: str, commit: str, prefix: str = "", source: Source | None = None):
        self.repo = repo
        self.source = source  # what a partial mirror fetches a missing file's content from
        self.base = tree(repo, base, prefix)
        self.head = tree(repo, commit, prefix)
        self.changed = tuple(
            sorted(p for p in self.base.keys() | self.head.keys() if self.base.get(p) != self.head.get(p))
        )


def read_blobs(repo: Path, oids: list[str], source: Source | None = None) -> dict[str, bytes]:
    """Blob contents in one `git cat-file --batch`, as bytes: a protected file may be binary."""
    if not oids:
        return {}
    out = _git_bytes(repo, ["cat-file", "--batch"], source=source, input="".join(f"{oid}\n" for oid in oids).encode())
    pos, found = 0, {}
    while pos < len(out):
        end = out.index(b"\n", pos)
        header = out[pos:end].decode().split(" ")
        if len(header) != 3:  # `<oid> missing`: a repository without the object cannot restore it
            raise SnapshotError(f"git cat-file: {' '.join(header)[:200]}")
        oid, _kind, size = header
        start = end + 1
        found[oid] = out[start : start + int(size)]
        pos = start + int(size) + 1
    return found


def base_contents(diff: TreeDiff, paths: list[str]) -> dict[str, bytes]:
    """The content at the base revision of each of `paths` (files of `diff.base`)."""
    entries = {p: diff.base[p] for p in paths if p in diff.base and diff.base[p].kind == "blob"}
    blobs = read_blobs(diff.repo, sorted({e.oid for e in entries.values()}), diff.source)
    return {p: blobs.get(e.oid, b"") for p, e in entries.items()}


# ---------------------------------------------------------------- the snapshot


def restore(root: Path, diff: TreeDiff, paths: list[str]) -> None:
    """Put `paths` of the snapshot at `root` back as they are at the base revision."""
    if not paths:
        return
    snapshot_reuse.mark_written(root)  # never kept for another run's reuse
    entries = [diff.base[p] for p in paths if p in diff.base]
    blobs = read_blobs(diff.repo, sorted({e.oid for e in entries if e.kind == "blob"}), diff.source)
    for rel in paths:  # everything out of the way first: a file may have become a folder, or back
        _clear(root, rel)
    for rel in paths:
        entry = diff.base.get(rel)
        if entry is not None:
            _write(root, rel, entry, blobs.get(entry.oid, b""))
        else:
            _prune_empty(root, rel)


def rewrite(root: Path, diff: TreeDiff, files: dict[str, bytes | None]) -> None:
    """Replace each of `files` in the snapshot at `root` with the content given (None:
    remove it), keeping the judged commit's mode."""
    if not files:
        return
    snapshot_reuse.mark_written(root)  # never kept for another run's reuse
    for rel, content in sorted(files.items()):
        _clear(root, rel)
        if content is None:
            _prune_empty(root, rel)
        else:
            _write(root, rel, diff.head[rel], content)


@overload
def _inside(root: Path, rel: str, *, make: Literal[True]) -> Path: ...
@overload
def _inside(root: Path, rel: str, *, make: Literal[False]) -> Path | None: ...


def _inside(root: Path, rel: str, *, make: bool) -> Path | None:
    """`root/rel` with every folder on the way a real folder of the snapshot. A symlink or
    a file in the way is replaced when `make` (writing through it could leave the
    snapshot); otherwise there is nothing at `rel` inside the snapshot (None)."""
    current = root
    for part in rel.split("/")[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            if not make:
                return None
            current.unlink()
        if not current.exists():
            if not make:
                return None
            current.mkdir()
    return current / rel.rsplit("/", 1)[-1]


def _clear(root: Path, rel: str) -> None:
    target = _inside(root, rel, make=False)
    if target is None:
        return
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.is_symlink() or target.exists():
        target.unlink()


def _write(root: Path, rel: str, entry: Entry, content: bytes) -> None:
    target = _inside(root, rel, make=True)
    if entry.kind != "blob":  # a submodule: an empty folder, as a checkout leaves it
        target.mkdir(exist_ok=True)
    elif entry.mode == "120000":
        os.symlink(content, os.fsencode(target))
    else:
        # Read-only like every file of the snapshot.
        mode = 0o555 if entry.mode == "100755" else 0o444
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        os.chmod(target, mode)


def _prune_empty(root: Path, rel: str) -> None:
    # A folder holding only removed files is not in the base revision either. Only real
    # folders of the snapshot: through a symlink the empty folder would be another's.
    target = _inside(root, rel, make=False)
    if target is None:
        return
    parent = target.parent
    while parent != root and parent.is_dir() and not parent.is_symlink() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
