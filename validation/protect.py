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
name that is not UTF-8 is matched, restored and removed exactly, and shown escaped. The
two commits' trees and the snapshot's writes are `validation/base_tree.py`'s.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusion_site.repos import mirrors, refs
from fusion_site.repos.sources import SnapshotError, Source
from validation.base_tree import TreeDiff, read_blobs, restore, rewrite, tree
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
    for path, (state, content) in fixes(ends, lambda oids: read_blobs(diff.repo, oids, diff.source)).items():
        if state == "whole":
            (changed if path in diff.base else added).add(path)
        elif state != "same":
            (changed if state == "changed" else added).add(path)
            rewrites.append((path, content))
    return Guard(tuple(sorted(changed)), tuple(sorted(added)), tuple(sorted(rewrites)))


def apply(root: Path, diff: TreeDiff, guarded: Guard) -> None:
    """Protect the tree at `root` as `guarded` says: whole files back as they are at the
    base revision (an added one removed), then each rewritten configuration file."""
    rewritten = dict(guarded.rewrites)
    restore(root, diff, [p for p in (*guarded.changed, *guarded.added) if p not in rewritten])
    rewrite(root, diff, rewritten)


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
