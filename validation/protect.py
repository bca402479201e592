"""Protected paths (docs/MISSION_FILES.md): files an implementation must not change to
make its checks pass, typically its own tests.

Before a check runs, every protected path of the snapshot is put back as it is at the
base revision: a file the implementation changed gets its base content back, a file it
deleted returns, and a file it added is set aside (removed from the tree the checks see).
Tampering is changing or deleting what the base holds: which protected files the
implementation changed is kept, so that every verdict of a check can say so (and fail,
unless the mission chose `restore`); the files it added are only reported. Only the
snapshot folder is written; the repository is only read.

With `runner_config` (the mission's `protect_runner_config`, frozen on the run), what
decides how the protected tests run is protected the same way (validation/runner_config.py).

Patterns are globs relative to the workspace folder, matched against whole paths: `*`
and `?` stay within one folder, `**` crosses folders (`tests/**`, `**/test_*.py`), and a
pattern that names a folder covers everything under it (`tests`, `tests/`).

Paths are `str` decoded from git's bytes with `os.fsdecode` (surrogate escapes): a file
name that is not UTF-8 is matched, restored and removed exactly, and shown escaped.
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

from fusion_site.repos import mirrors, refs, snapshot_reuse
from fusion_site.repos.mirrors import LOCAL_TIMEOUT, mirror_git
from fusion_site.repos.sources import SnapshotError, Source, git_env
from fusion_site.runtime.proc import run_nicer
from validation.runner_config import RUNNER_CONFIG, SECTIONS, fixes, test_package_inits
from validation.verdict import escape_invisible

NOTE = "the implementation changed protected files: "
NOTE_FILES = 50  # named in a note; the rest are counted

# RUNNER_CONFIG: the files that decide how the protected tests run, protected with them
# (`runner_config`): validation/runner_config.py, listed in docs/TRUTH.md.
__all__ = ["RUNNER_CONFIG", "Guard", "Protection", "compile_patterns", "matches", "prepare"]


# ---------------------------------------------------------------- patterns


def _translate(pattern: str) -> str:
    if pattern.startswith("./"):
        pattern = pattern[2:]
    if pattern.endswith("/"):  # a folder only, never a file of that name
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
    """One regular expression for all `patterns`. A pattern also covers everything under
    what it names, as in `.gitignore`: `tests` is the folder `tests` whole (matching only a
    file of that name would silently protect nothing)."""
    parts = [_translate(p) for p in patterns]
    return re.compile("|".join(f"(?:{p})" for p in parts).join(("(?:", r")(?:/.*)?\Z")), re.S) if parts else None


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


def _blobs(repo: Path, oids: list[str], source: Source | None = None) -> dict[str, bytes]:
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
    blobs = _blobs(diff.repo, sorted({e.oid for e in entries.values()}), diff.source)
    return {p: blobs.get(e.oid, b"") for p, e in entries.items()}


# ---------------------------------------------------------------- what a run protects


@dataclass(frozen=True)
class Guard:
    """What protection does to one tree: `changed`, the protected files of the base the
    implementation modified or deleted (tampering: restored); `added`, the files it added
    under protection (set aside: removed, reported, never a reason to fail); `rewrites`,
    shared configuration files whose test-runner part is put back (path -> the content
    written, None to remove the file), each also in `changed` or `added`."""

    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    rewrites: tuple[tuple[str, bytes | None], ...] = ()

    def touches(self, path: str) -> bool:
        return path in self.changed or path in self.added


def guard(diff: TreeDiff, patterns: Iterable[str], *, runner_config: bool) -> Guard:
    """What protecting `patterns` (and, with `runner_config`, what decides how they run)
    does to the judged commit's tree."""
    rx = compile_patterns(patterns)
    if rx is None:
        return Guard()
    whole = {p for p in diff.changed if rx.match(p)}
    sections: list[str] = []
    if runner_config:
        config = compile_patterns(RUNNER_CONFIG)
        assert config is not None
        inits = test_package_inits(diff.base, lambda p: bool(rx.match(p) or config.match(p)))
        for p in diff.changed:
            if p in whole:
                continue
            if config.match(p) or p in inits:
                whole.add(p)
            elif p.rsplit("/", 1)[-1] in SECTIONS:
                sections.append(p)
    changed = {p for p in whole if p in diff.base}
    added = whole - changed
    rewrites = []
    ends = {p: (diff.base.get(p), diff.head.get(p)) for p in sections}
    for path, (state, content) in fixes(ends, lambda oids: _blobs(diff.repo, oids, diff.source)).items():
        if state == "whole":
            (changed if path in diff.base else added).add(path)
        elif state != "same":
            (changed if state == "changed" else added).add(path)
            rewrites.append((path, content))
    return Guard(tuple(sorted(changed)), tuple(sorted(added)), tuple(sorted(rewrites)))


# ---------------------------------------------------------------- restoring


def restore(root: Path, diff: TreeDiff, paths: list[str]) -> None:
    """Put `paths` of the snapshot at `root` back as they are at the base revision."""
    if not paths:
        return
    snapshot_reuse.mark_written(root)  # never kept for another run's reuse
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


def apply(root: Path, diff: TreeDiff, guarded: Guard) -> None:
    """Protect the tree at `root` as `guarded` says: whole files back as they are at the
    base revision (an added one removed), then each rewritten configuration file."""
    rewritten = dict(guarded.rewrites)
    if rewritten:
        snapshot_reuse.mark_written(root)  # never kept for another run's reuse
    restore(root, diff, [p for p in (*guarded.changed, *guarded.added) if p not in rewritten])
    for rel, content in sorted(rewritten.items()):
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


# ---------------------------------------------------------------- one run's protection


@dataclass
class Protection:
    """What a run judges under: the mission's patterns, what to do when they were changed,
    the base revision, whether the runner's configuration is protected with them, and what
    protecting the mission's patterns did (`changed`, `added`: set once the snapshot is
    restored)."""

    paths: tuple[str, ...] = ()
    on_change: str = "fail"
    base: str = ""
    source: Source | None = None
    revision: str = ""
    runner_config: bool = False
    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
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
                base = refs.resolve(self.source, self.base)
                with mirrors.in_use(self.source):
                    mirrors.ensure_commit(self.source, base)
                    repo = mirrors.ensure_commit(self.source, self.revision)
                    self._diff = TreeDiff(repo, base, self.revision, self.source.prefix, self.source)
            return self._diff

    def guard(self, patterns: Iterable[str]) -> Guard:
        """What protecting `patterns` (the mission's, or a check's own) does to this run's tree."""
        return guard(self.diff(), patterns, runner_config=self.runner_config)


def prepare(checkout: Path, *, source: Source | None, revision: str, frozen: dict[str, Any]) -> Protection:
    """The run's protection (`frozen` on the run at admission), with the mission's protected
    paths of `checkout` restored."""
    protection = Protection(
        paths=tuple(frozen.get("paths") or ()),
        on_change=frozen.get("on_change") or "fail",
        base=frozen.get("base") or "",
        source=source,
        revision=revision,
        # A run frozen before the runner's configuration was protected is judged (and
        # replayed) as it was.
        runner_config=frozen.get("runner_config") is True,
    )
    if protection.paths:
        guarded = protection.guard(protection.paths)
        protection.changed, protection.added = guarded.changed, guarded.added
        apply(checkout, protection.diff(), guarded)
    return protection


def changed_note(files: Iterable[str]) -> str:
    """`the implementation changed protected files: a, b (and 3 more)`, sorted."""
    return NOTE + _listed(files)


def added_note(files: Iterable[str]) -> str:
    """`set aside 2 files the implementation added under protected paths: a, b`, sorted:
    evidence, never a reason to fail."""
    count = len(set(files))
    return f"set aside {count} file{'s' if count != 1 else ''} the implementation added under protected paths: " + (
        _listed(files)
    )


def _listed(files: Iterable[str]) -> str:
    # Escaped: a name may hold invisible characters or bytes that are not UTF-8.
    files = sorted(set(files))
    shown = ", ".join(escape_invisible(f) for f in files[:NOTE_FILES])
    return shown + (f" (and {len(files) - NOTE_FILES} more)" if len(files) > NOTE_FILES else "")


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
