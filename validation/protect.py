"""Protected paths (README, "Mission files"): files an implementation must not change to
make its checks pass, typically its own tests.

Before a check runs, every protected path of the snapshot is put back as it is at the
base revision: a file the implementation changed gets its base content back, a file it
added is removed, a file it deleted returns. Which protected files it changed is kept,
so that every verdict of a check can say so (and fail, unless the mission chose
`restore`). Only the snapshot folder is written; the repository is only read.

Patterns are globs relative to the workspace folder, matched against whole paths: `*`
and `?` stay within one folder, `**` crosses folders (`tests/**`, `**/test_*.py`), and a
pattern ending in `/` covers everything under that folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from fusion_site.base import mirrors
from fusion_site.base.mirrors import LOCAL_TIMEOUT, mirror_git
from fusion_site.base.proc import run_nicer
from fusion_site.base.sources import SnapshotError, Source, git_env
from validation.verdict import escape_invisible

NOTE = "the implementation changed protected files: "
NOTE_FILES = 50  # named in a note; the rest are counted


# ---------------------------------------------------------------- patterns


def _translate(pattern: str) -> str:
    if pattern.startswith("./"):
        pattern = pattern[2:]
    if pattern.endswith("/"):
        pattern += "**"
    out, i, n = [], 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")  # zero or more folders
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            piece, i = _char_class(pattern, i)
            out.append(piece)
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _char_class(pattern: str, i: int) -> tuple[str, int]:
    """`[abc]`, `[!abc]` as fnmatch reads them; an unclosed `[` is a literal."""
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    if j >= len(pattern):
        return r"\[", i + 1
    body = pattern[i + 1 : j].replace("\\", "\\\\")
    if body[0] in "!^":
        body = "^/" + body[1:]
    return f"[{body}]", j + 1


def compile_patterns(patterns: Iterable[str]) -> re.Pattern | None:
    parts = [_translate(p) for p in patterns]
    return re.compile("|".join(f"(?:{p})" for p in parts) + r"\Z", re.S) if parts else None


def matches(path: str, patterns: Iterable[str]) -> bool:
    rx = compile_patterns(patterns)
    return rx is not None and rx.match(path) is not None


# ---------------------------------------------------------------- trees


@dataclass(frozen=True)
class Entry:
    mode: str
    kind: str  # blob | commit (a submodule)
    oid: str


def tree(repo: Path, commit: str, prefix: str = "") -> dict[str, Entry]:
    """Every path of `commit` under the workspace folder `prefix` (relative to it, as
    protected paths are) with its mode and object id; nothing when the folder is absent."""
    treeish = f"{commit}:{prefix}" if prefix else commit
    if prefix and not _has_tree(repo, treeish):
        return {}
    entries = {}
    for record in mirror_git(repo, "ls-tree", "-r", "-z", "--full-tree", treeish).split("\0"):
        if record:
            meta, path = record.split("\t", 1)
            mode, kind, oid = meta.split(" ")
            entries[path] = Entry(mode, kind, oid)
    return entries


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
        head = tree(repo, commit, prefix)
        self.changed = tuple(sorted(p for p in self.base.keys() | head.keys() if self.base.get(p) != head.get(p)))

    def under(self, patterns: Iterable[str]) -> list[str]:
        rx = compile_patterns(patterns)
        return [p for p in self.changed if rx is not None and rx.match(p)]


def _blobs(repo: Path, oids: list[str], source: Source | None = None) -> dict[str, bytes]:
    """Blob contents in one `git cat-file --batch`, as bytes: a protected file may be binary,
    which the text adapter `git()` would mangle."""
    if not oids:
        return {}
    env = git_env(source)
    try:
        proc = run_nicer(
            ["git", "-C", str(repo), "cat-file", "--batch"],
            env=env,
            input="".join(f"{oid}\n" for oid in oids).encode(),
            timeout=LOCAL_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapshotError(f"git cat-file failed: {exc}") from exc
    if proc.returncode != 0:
        raise SnapshotError(f"git cat-file failed: {proc.stderr.decode(errors='replace').strip()[:500]}")
    out, pos, found = proc.stdout, 0, {}
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


# ---------------------------------------------------------------- restoring


def restore(root: Path, diff: TreeDiff, paths: list[str]) -> None:
    """Put `paths` of the snapshot at `root` back as they are at the base revision."""
    if not paths:
        return
    entries = [diff.base[p] for p in paths if p in diff.base]
    blobs = _blobs(diff.repo, sorted({e.oid for e in entries if e.kind == "blob"}), diff.source)
    for rel in paths:  # everything out of the way first: a file may have become a folder, or back
        _clear(root, rel)
    for rel in paths:
        entry = diff.base.get(rel)
        if entry is not None:
            _write(root, rel, entry, blobs.get(entry.oid, b""))
        else:
            _prune_empty(root, rel)


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
    # A folder holding only removed files is not in the base revision either.
    parent = (root / rel).parent
    while parent != root and parent.is_dir() and not parent.is_symlink() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


# ---------------------------------------------------------------- one run's protection


@dataclass
class Protection:
    """What a run judges under: the mission's patterns, what to do when they were changed,
    the base revision, and the mission-protected files the implementation changed (set
    once the snapshot is restored)."""

    paths: tuple[str, ...] = ()
    on_change: str = "fail"
    base: str = ""
    source: Source | None = None
    revision: str = ""
    changed: tuple[str, ...] = ()
    _diff: TreeDiff | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def diff(self) -> TreeDiff:
        """Computed once per run, by whichever check needs it first."""
        with self._lock:
            if self._diff is None:
                if not self.base:
                    raise SnapshotError("protected paths need the mission's base revision, and it has none")
                if self.source is None:
                    raise SnapshotError("protected paths need the mission's repository, and it has none")
                # Both commits from the worker's mirror: the user's repository is never read for it.
                base = mirrors.resolve(self.source, self.base)
                with mirrors.in_use(self.source):
                    mirrors.ensure_commit(self.source, base)
                    repo = mirrors.ensure_commit(self.source, self.revision)
                    self._diff = TreeDiff(repo, base, self.revision, self.source.prefix, self.source)
            return self._diff


def prepare(checkout: Path, *, source: Source | None, revision: str, frozen: dict[str, Any]) -> Protection:
    """The run's protection (`frozen` on the run at admission), with the mission's protected
    paths of `checkout` restored."""
    protection = Protection(
        paths=tuple(frozen.get("paths") or ()),
        on_change=frozen.get("on_change") or "fail",
        base=frozen.get("base") or "",
        source=source,
        revision=revision,
    )
    if protection.paths:
        diff = protection.diff()
        protection.changed = tuple(diff.under(protection.paths))
        restore(checkout, diff, list(protection.changed))
    return protection


def changed_note(files: Iterable[str]) -> str:
    """`the implementation changed protected files: a, b (and 3 more)`, sorted."""
    files = sorted(set(files))
    shown = ", ".join(escape_invisible(f) for f in files[:NOTE_FILES])
    more = f" (and {len(files) - NOTE_FILES} more)" if len(files) > NOTE_FILES else ""
    return NOTE + shown + more


# ---------------------------------------------------------------- patterns against a tree


def unmatched_patterns(patterns: Iterable[str], paths: Iterable[str]) -> list[str]:
    """The patterns (in their order) that match none of `paths` (a tree's paths, as `tree`
    lists them): a protected path that names nothing at the base protects nothing, which a
    writer refuses rather than let it pass unnoticed (docs/TRUTH.md)."""
    wanted = list(dict.fromkeys(patterns))
    compiled = {pattern: compile_patterns([pattern]) for pattern in wanted}
    left = set(wanted)
    for path in paths:
        left -= {pattern for pattern in left if (rx := compiled[pattern]) is not None and rx.match(path)}
        if not left:
            break
    return [pattern for pattern in wanted if pattern in left]


def unmatched_at(source: Source, commit: str, patterns: Iterable[str]) -> list[str]:
    """`unmatched_patterns` against the files of `commit` in the source's folder, read from
    the worker's mirror (`SnapshotError` when the commit cannot be read)."""
    with mirrors.in_use(source):
        repo = mirrors.ensure_commit(source, commit)
        return unmatched_patterns(patterns, tree(repo, commit, source.prefix))
