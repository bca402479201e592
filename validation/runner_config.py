"""What decides how protected tests run (docs/TRUTH.md, "Which files were protected"):
protected with a mission's protected paths unless it sets `protect_runner_config: false`.

- `RUNNER_CONFIG`: files protected whole, anywhere in the workspace.
- `test_package_inits`: the `__init__.py` of the test packages, run before their tests.
- `SECTIONS`: shared configuration files of which only the test runner's part is
  protected, so that an honest implementation may add a dependency to pyproject.toml.

How a shared file is fixed (`fix`): the runner's part is parsed at the base and at the
judged commit (tomllib, configparser) and compared; when it differs, the judged file is
written with its runner sections cut out and the base's sections' own text put back at its
end, and the result is parsed again: its runner part must equal the base's and the rest
must equal the judged file's. A file this cannot fix (a runner key outside a section
header of its own, such as a dotted `pytest.…` key under `[tool]`, text the parser reads
differently, a file that does not parse) is put back whole as the base has it, or removed
when the base has none.
"""

from __future__ import annotations

import configparser
import re
import tomllib
from collections.abc import Callable, Iterable
from typing import Any

RUNNER_CONFIG = (
    "**/conftest.py",
    "**/pytest.ini",
    "**/.pytest.ini",
    "**/pytest.toml",
    "**/.pytest.toml",
    "**/sitecustomize.py",
    "**/usercustomize.py",
    "**/*.pth",
    # Compiled modules are imported instead of their source (an unchecked-hash `.pyc`);
    # a `pyvenv.cfg` or `conda-meta/` makes pytest pass over the folder that holds it.
    "**/__pycache__/**",
    "**/*.pyc",
    "**/*.pyo",
    "**/pyvenv.cfg",
    "**/conda-meta/**",
)

# File name -> the sections that configure pytest in it (pyproject.toml: the `tool.pytest`
# table and every table below it: `[tool.pytest.ini_options]`, `[tool.pytest]`).
SECTIONS: dict[str, tuple[str, ...]] = {
    "pyproject.toml": ("tool.pytest",),
    "setup.cfg": ("tool:pytest",),
    "tox.ini": ("pytest",),
}

# What `fix` answers: nothing to do, the base's runner part put back (tampering), the
# implementation's own runner part set aside; with the content to write (None: remove).
Fix = tuple[str, bytes | None]
SAME: Fix = ("same", None)


class Unreadable(Exception):
    pass


def test_package_inits(base: Iterable[str], protected: Callable[[str], bool]) -> set[str]:
    """The `__init__.py` of every folder on the way to a protected file of the base whose
    files at the base (but `__init__.py`) are all protected: test packages, imported before
    their tests. A folder that also holds the implementation's own code is the
    implementation's, and so is its `__init__.py` (docs/TRUTH.md says what that leaves)."""
    mixed, ways = set(), set()
    for path in base:
        folders = ["/".join(path.split("/")[:i]) for i in range(path.count("/") + 1)]
        if protected(path):
            ways.update(folders)
        elif path.rsplit("/", 1)[-1] != "__init__.py":
            mixed.update(folders)
    return {f"{folder}/__init__.py" if folder else "__init__.py" for folder in ways - mixed}


def fixes(ends: dict[str, tuple[Any, Any]], read: Callable[[list[str]], dict[str, bytes]]) -> dict[str, Fix]:
    """Each shared configuration file's fix, from its (base, judged) tree entries (None:
    absent) and `read`, which gives blob contents by object id; `whole` for a file that
    is not a regular file at both ends (a symlink, a folder): it is protected whole."""
    regular = {"100644", "100755"}
    plain = {p: pair for p, pair in ends.items() if all(e is None or e.mode in regular for e in pair)}
    blobs = read(sorted({e.oid for pair in plain.values() for e in pair if e}))
    found: dict[str, Fix] = {p: ("whole", None) for p in ends if p not in plain}
    for path, (base, head) in plain.items():
        name = path.rsplit("/", 1)[-1]
        found[path] = fix(name, blobs[base.oid] if base else None, blobs[head.oid] if head else None)
    return found


def fix(name: str, base: bytes | None, head: bytes | None) -> Fix:
    """How the file `name` (a key of SECTIONS) the judged commit holds as `head` (None:
    deleted) is protected against its `base` content (None: the base has no such file)."""
    try:
        ours = _runner_part(name, base) if base is not None else None
    except Unreadable:  # the base's own file does not parse: it is protected whole
        return SAME if head == base else ("changed", base)
    if head is None:  # deleted: tampering only when it configured the runner
        return SAME if ours is None else ("changed", base)
    try:
        theirs = _runner_part(name, head)
    except Unreadable:
        theirs = _UNREADABLE
    if theirs == ours:
        return SAME
    if ours is None:
        return "added", _rewritten(name, head, b"", None) or base
    return "changed", _rewritten(name, head, _section_text(name, base or b""), ours) or base


_UNREADABLE = object()


def _runner_part(name: str, data: bytes) -> Any:
    """The runner's configuration in the file (None: none), as its parser reads it."""
    parsed = _parse(name, data)
    if name == "pyproject.toml":
        return parsed.get("tool", {}).get("pytest") if isinstance(parsed.get("tool"), dict) else None
    found = {s: parsed[s] for s in SECTIONS[name] if s in parsed}
    return found or None


def _rest(name: str, data: bytes) -> Any:
    """Everything in the file but the runner's configuration."""
    parsed = _parse(name, data)
    if name == "pyproject.toml":
        tool = parsed.get("tool")
        if isinstance(tool, dict):
            tool = {k: v for k, v in tool.items() if k != "pytest"}
            parsed = {k: v for k, v in parsed.items() if k != "tool"} | ({"tool": tool} if tool else {})
        return parsed
    return {s: v for s, v in parsed.items() if s not in SECTIONS[name]}


def _parse(name: str, data: bytes) -> dict[str, Any]:
    try:
        if name == "pyproject.toml":
            return tomllib.loads(data.decode("utf-8"))
        # No interpolation and no `[DEFAULT]` spilling into every section: pytest reads
        # each section alone.
        parser = configparser.RawConfigParser(default_section="\0none", interpolation=None)
        parser.read_string(data.decode("utf-8", "surrogateescape"))
        return {s: dict(parser.items(s)) for s in parser.sections()}
    # RecursionError, MemoryError: a file built to exhaust the parser (`x = [[[…]]]`) is
    # unreadable like any other, never a crash of the run.
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error, RecursionError, MemoryError) as exc:
        raise Unreadable(str(exc)) from exc


def _rewritten(name: str, head: bytes, sections: bytes, want: Any) -> bytes | None:
    """`head` with its runner sections cut out and `sections` appended, when the result
    reads as intended (runner part `want`, the rest as `head`'s); None otherwise."""
    blocks = _blocks(name, head)
    kept = b"".join(text for header, text in blocks if not _is_runner(name, header))
    if sections and kept and not kept.endswith(b"\n"):
        kept += b"\n"
    result = kept + sections
    try:
        if _runner_part(name, result) != want or _rest(name, result) != _rest(name, head):
            return None
    except Unreadable:
        return None
    return result


def _section_text(name: str, data: bytes) -> bytes:
    return b"".join(text for header, text in _blocks(name, data) if _is_runner(name, header))


HEADER = {
    "toml": re.compile(rb"^[ \t]*\[\[?[ \t]*([^\]\n]+?)[ \t]*\]\]?[ \t]*(?:#[^\n]*)?\r?$"),
    "ini": re.compile(rb"^[ \t]*\[([^\]\n]+)\][ \t]*\r?$"),
}


def _blocks(name: str, data: bytes) -> list[tuple[str | None, bytes]]:
    """The file as (section header or None for what precedes the first, its text)."""
    header = HEADER["toml" if name.endswith(".toml") else "ini"]
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    blocks: list[tuple[str | None, bytes]] = [(None, b"")]
    for line in lines:
        found = header.match(line)
        if found:
            blocks.append((found.group(1).decode("utf-8", "replace"), line))
        else:
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + line)
    return blocks


def _is_runner(name: str, header: str | None) -> bool:
    if header is None:
        return False
    if name == "pyproject.toml":
        key = re.sub(r"[\s\"']", "", header)
        return key == "tool.pytest" or key.startswith("tool.pytest.")
    return header.strip() in SECTIONS[name]
