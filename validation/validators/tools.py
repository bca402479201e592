"""Read-only tools the agent validator may use, confined to the run's checkout.

Every path is resolved (symlinks followed) and must stay inside the checkout; walks never
follow symlinked directories, and a symlinked file is only read when its target is inside.
Outputs are bounded and secret-redacted: the checkout is data for the model, and a file
that holds a key must not carry it into a prompt. Refusals are answers ("refused: …"),
not exceptions, so a probing model learns nothing and the run goes on.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from fusion_site.runtime.redact import redact
from validation.validators.checks import judge_isolated
from validation.verdict import escape_undecodable

MAX_OUTPUT = 16_000  # characters of one tool answer
MAX_LINES = 400  # lines `read` returns at once
MAX_ENTRIES = 300  # names `ls` / `find` list
MAX_MATCHES = 200  # lines `grep` reports
MAX_FILE_BYTES = 2_000_000  # larger files are not grepped
HIDDEN = {".git"}


class Refused(Exception):
    """The request leaves the checkout or names something that is not there."""


def _root(root: Path) -> Path:
    return root.resolve()


def confine(root: Path, rel: str) -> Path:
    """The resolved path of `rel` inside `root`, or Refused."""
    if not isinstance(rel, str) or "\x00" in rel:
        raise Refused("refused: not a path")
    base = _root(root)
    rel = rel.strip() or "."
    if os.path.isabs(rel):
        raise Refused(f"refused: {rel!r} is absolute; paths are relative to the checkout")
    try:
        target = (base / rel).resolve()
    except (OSError, RuntimeError):  # symlink loops
        raise Refused(f"refused: {rel!r} cannot be resolved") from None
    if not target.is_relative_to(base):
        raise Refused(f"refused: {rel!r} leaves the checkout")
    if HIDDEN & set(target.relative_to(base).parts):
        raise Refused(f"refused: {rel!r} is repository metadata, not content")
    return target


def _bounded(text: str) -> str:
    text = redact(escape_undecodable(text))  # a file name that is not UTF-8, shown as `\xNN`
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT] + f"\n[… output truncated at {MAX_OUTPUT} characters]"


def _answer(fn, *args) -> str:
    try:
        return _bounded(fn(*args))
    except Refused as exc:
        return str(exc)


def read(root: Path, path: str, offset: int = 1, limit: int = 200) -> str:
    return _answer(_read, root, path, offset, limit)


def _read(root: Path, path: str, offset: int, limit: int) -> str:
    target = confine(root, path)
    if not target.is_file():
        raise Refused(f"refused: {path!r} is not a file in the checkout")
    offset, limit = max(int(offset), 1), min(max(int(limit), 1), MAX_LINES)
    with open(target, "rb") as fh:
        lines = fh.read(MAX_FILE_BYTES).decode("utf-8", errors="replace").splitlines()
    chunk = lines[offset - 1 : offset - 1 + limit]
    body = "\n".join(f"{offset + i}: {line[:500]}" for i, line in enumerate(chunk))
    more = len(lines) - (offset - 1 + len(chunk))
    return body + (f"\n[… {more} more lines; read with offset={offset + len(chunk)}]" if more > 0 else "")


def ls(root: Path, path: str = ".") -> str:
    return _answer(_ls, root, path)


def _ls(root: Path, path: str) -> str:
    target = confine(root, path)
    if not target.is_dir():
        raise Refused(f"refused: {path!r} is not a directory in the checkout")
    names = []
    for child in sorted(target.iterdir(), key=lambda p: p.name):
        if child.name in HIDDEN:
            continue
        if child.is_symlink():
            names.append(f"{child.name} -> (symlink)")
        else:
            names.append(child.name + ("/" if child.is_dir() else ""))
    extra = f"\n[… {len(names) - MAX_ENTRIES} more]" if len(names) > MAX_ENTRIES else ""
    return "\n".join(names[:MAX_ENTRIES]) + extra if names else "(empty directory)"


def _walk(root: Path, start: Path):
    """Relative paths of regular files under `start`, never through symlinked directories
    and never a symlinked file whose target leaves the checkout."""
    base = _root(root)
    for dirpath, dirs, files in os.walk(start, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in HIDDEN and not Path(dirpath, d).is_symlink())
        for name in sorted(files):
            full = Path(dirpath, name)
            if full.is_symlink() and not full.resolve().is_relative_to(base):
                continue
            yield full, full.relative_to(base).as_posix()


def find(root: Path, pattern: str, path: str = ".") -> str:
    return _answer(_find, root, pattern, path)


def _find(root: Path, pattern: str, path: str) -> str:
    start = confine(root, path)
    if not start.is_dir():
        raise Refused(f"refused: {path!r} is not a directory in the checkout")
    found = [
        rel
        for _full, rel in _walk(root, start)
        if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(rel.rsplit("/", 1)[-1], pattern)
    ]
    extra = f"\n[… {len(found) - MAX_ENTRIES} more]" if len(found) > MAX_ENTRIES else ""
    return "\n".join(found[:MAX_ENTRIES]) + extra if found else "(no match)"


def grep(root: Path, pattern: str, path: str = ".", glob: str = "*") -> str:
    return _answer(_grep, root, pattern, path, glob)


def _grep(root: Path, pattern: str, path: str, glob: str) -> str:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise Refused(f"refused: invalid regular expression: {exc}") from None
    start = confine(root, path)
    files = [(start, start.relative_to(_root(root)).as_posix())] if start.is_file() else _walk(root, start)
    hits: list[str] = []
    for full, rel in files:
        if not fnmatch.fnmatch(rel.rsplit("/", 1)[-1], glob or "*") or full.stat().st_size > MAX_FILE_BYTES:
            continue
        text = full.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if regex.search(line):
                hits.append(f"{rel}:{number}: {line[:300]}")
                if len(hits) > MAX_MATCHES:
                    return "\n".join(hits[:MAX_MATCHES]) + "\n[… more matches; narrow the pattern or path]"
    return "\n".join(hits) if hits else "(no match)"


def run_check(ctx, key: str) -> str:
    """Run the declared check of one linked assertion; nothing else can be executed. It is
    judged as the host judges it (its own copy, the protected files restored)."""
    spec = next((a for a in ctx.assertions if a.key == key), None)
    if spec is None:
        return f"refused: {key!r} is not a linked assertion (linked: {', '.join(a.key for a in ctx.assertions)})"
    if not spec.check:
        return f"refused: {key} has no declared check; judge it from the code"
    verdict = judge_isolated(ctx, spec)
    return _bounded(json.dumps(verdict.model_dump(), indent=1))


TOOL_FUNCTIONS: dict[str, Callable[..., str]] = {"read": read, "ls": ls, "find": find, "grep": grep}
