"""Reading a mission file: the YAML, the declaration's verdict (`schema`) in the file's
wording, then the rules that need the whole file. Every error is collected: a document
that cannot be read as a mission raises one `Invalid` with them at once; otherwise they
travel with the `Document` to the importer, which adds those that need the stored mission
(`importing._link_errors`) and raises one `Invalid` with all of them."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from fusion_site.repos.sources import is_url
from missions.errors import Invalid
from missions.models import AssertionScope
from missions.services.files import yaml_io
from missions.services.files.fields import PROBLEM_LISTS
from missions.services.files.schema import (
    MISSION_FORMER_NAMES,
    MissionFile,
    MissionFileAssertion,
    MissionFileFeature,
    MissionFileMilestone,
    MissionFileMission,
    MissionFileSlice,
    columns,
    fallback,
    text_rule,
)

MAX_ERRORS = 200

Loc = tuple[int | str, ...]


@dataclass
class Node:
    path: str
    values: dict[str, Any]  # model attname -> value
    refs: list[str] = field(default_factory=list)  # dependencies, or a feature's assertion keys
    assertions: list[Node] = field(default_factory=list)
    slices: list[Node] = field(default_factory=list)
    features: list[Node] = field(default_factory=list)

    @property
    def key(self) -> Any:
        return self.values["key"]


@dataclass
class Document:
    mission: Node
    milestones: list[Node]
    # Where the file gave the repository (`mission.workspace` for its former name), for errors.
    repository_path: str = "mission.repository"
    # What is wrong with the file, as `path: message` lines, in the order the file is read.
    errors: list[str] = field(default_factory=list)
    # The `forge:` section's values (`schema.MissionFileForge`), None when the file
    # has none; read only from a file the declaration accepted.
    forge: dict[str, Any] | None = None

    def all_slices(self) -> list[Node]:
        return [s for m in self.milestones for s in m.slices]

    def all_features(self) -> list[Node]:
        return [f for s in self.all_slices() for f in s.features]

    def all_assertions(self) -> list[Node]:
        return [a for m in self.milestones for a in m.assertions]


def invalid(errors: list[str]) -> Invalid:
    if len(errors) > MAX_ERRORS:
        errors = errors[:MAX_ERRORS] + [f"document: {len(errors) - MAX_ERRORS} more errors not shown"]
    return Invalid("mission file is invalid", code="invalid_mission_file", fields={"errors": errors})


# A file sent over HTTP has no folder: relative to the server's working directory would be
# a guess, so a relative repository path is one of the file's mistakes there.
NO_FOLDER = "a file sent to the API needs a git URL or an absolute repository path"


def validated(document: str | dict, base_dir: pathlib.Path | None, *, from_api: bool = False) -> Document:
    """The file as nodes with every error it has (`Document.errors`); raises `Invalid` with
    them when there is no mission to read (unreadable text, not a mapping, no `mission`)."""
    errors: list[str] = []
    raw = yaml_io.load(document, errors)
    if not errors:
        errors += _lone_surrogates(raw)
    mission: Node | None = None
    milestones: list[Node] = []
    repository_path = "mission.repository"
    forge = None
    if not errors:
        try:
            data, failed = MissionFile.model_validate(raw).model_dump(), set()
            forge = data.pop("forge", None)
        except ValidationError as exc:
            found = exc.errors(include_url=False)
            errors += error_lines(found)
            data, failed = raw, {tuple(e["loc"]) for e in found if e["type"] not in PROBLEM_LISTS}
        if isinstance(data, dict):
            mission, milestones = _read(data, failed)
            if mission is not None:
                # the file as written: pydantic's output has every field, given or not
                repository_path = _read_former_names(raw["mission"], mission, failed, errors)
                if from_api and is_relative_path(mission.values["repository"]):
                    errors.append(f"{repository_path}: {NO_FOLDER}")
                else:
                    _resolve_repository(mission, base_dir, repository_path, errors)
                _check_protection(mission, errors)
            _cross_check(milestones, errors)
    if mission is None:
        raise invalid(errors or [_DOCUMENT])
    return Document(mission, milestones, repository_path, errors, forge)


# ---------------------------------------------------------------- errors in the file's wording

_NOT_UNICODE = "must be valid Unicode text (no lone surrogates)"


def _lone_surrogates(document: Any) -> list[str]:
    """Where the document holds half a surrogate pair (a `\\udXXX` escape of YAML or JSON):
    no answer, terminal or database can carry it, so it is refused before any rule echoes
    it. Walked with a stack, in the file's order: the readers nest deeper than a recursion."""
    lines = []
    stack: list[tuple[Loc, Any, bool]] = [((), document, False)]  # (where, value, is a field name)
    while stack:
        loc, value, name = stack.pop()
        if isinstance(value, str) and not _encodes(value):
            where = path_of(loc) or "document"
            lines.append(f"{where}: a field name {_NOT_UNICODE}" if name else f"{where}: {_NOT_UNICODE}")
        elif isinstance(value, list):
            stack += [((*loc, i), item, False) for i, item in reversed(list(enumerate(value)))]
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                # under a name that cannot be written, its value is not looked at
                bad = isinstance(key, str) and not _encodes(key)
                stack.append((loc, key, True) if bad else ((*loc, key), item, False))
    return lines


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_WORDING = {
    "missing": "required",
    "extra_forbidden": "unknown field",
    "invalid_key": "unknown field",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
}
_UNKNOWN = ("extra_forbidden", "invalid_key")
_DOCUMENT = "document: must be a mapping with `mission` and `milestones`"


def path_of(loc: tuple[int | str, ...]) -> str:
    """`("milestones", 0, "slices", 1, "key")` -> `milestones[0].slices[1].key`."""
    path = ""
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else f"{path}.{part}" if path else str(part)
    return path


def error_lines(errors: list[ErrorDetails]) -> list[str]:
    """pydantic's errors as `path: message` lines, in the order the file is read: a
    mapping's unknown fields first, then its fields in their declared order."""
    lines = []
    for error in unknown_first(errors):
        loc = tuple(error["loc"])
        if error["type"] in _UNKNOWN:
            # the field's name as written, even when YAML read it as a number or a date
            name = error["input"] if error["type"] == "invalid_key" else loc[-1]
            parent = path_of(loc[:-1])
            lines.append(f"{parent}.{name}: unknown field" if parent else f"{name}: unknown field")
        elif not loc:
            lines.append(_DOCUMENT)
        elif error["type"] in PROBLEM_LISTS:
            lines += [f"{path_of(loc)}{suffix}" for suffix in error.get("ctx", {})["suffixes"]]
        else:
            lines.append(f"{path_of(loc)}: {_WORDING.get(error['type'], error['msg'])}")
    return lines


def unknown_first(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """pydantic reports a mapping's unknown fields after its fields; put them, in the order
    written, before the first error inside that mapping (outer mappings' first)."""
    # pydantic lists the errors of one mapping together: `starts[d]` is where the errors
    # under the current location's first d parts began.
    before: dict[int, list[tuple[int, int]]] = {}
    starts: list[int] = []
    previous: tuple = ()
    for n, error in enumerate(errors):
        loc = tuple(error["loc"])
        same = 0
        while same < min(len(loc), len(previous)) and loc[same] == previous[same]:
            same += 1
        starts = starts[: min(same, len(loc) - 1) + 1] if loc else []
        starts += [n] * (len(loc) - len(starts))
        if error["type"] in _UNKNOWN:
            before.setdefault(starts[len(loc) - 1], []).append((len(loc), n))
        previous = loc
    if not before:
        return errors
    out = []
    for n, error in enumerate(errors):
        out += [errors[m] for _, m in sorted(before.get(n, ()))]
        if error["type"] not in _UNKNOWN:
            out.append(error)
    return out


# ---------------------------------------------------------------- the file as nodes


def _read(data: dict, failed: set[Loc]) -> tuple[Node | None, list[Node]]:
    """The nodes the rules below and the import work on. Read from pydantic's output when
    the file is valid; otherwise from the file itself, where a value that failed reads as
    its default and a node that is not a mapping is left out, so that every rule still
    reports what it finds."""
    mission = _node(data.get("mission"), ("mission",), MissionFileMission, failed)
    milestones = []
    for i, raw in _items(data, "milestones"):
        loc = ("milestones", i)
        if (m := _node(raw, loc, MissionFileMilestone, failed)) is None:
            continue
        milestones.append(m)
        m.refs = _keys(raw, "dependencies", loc, failed)
        for j, item in _items(raw, "assertions"):
            if (a := _node(item, (*loc, "assertions", j), MissionFileAssertion, failed)) is not None:
                m.assertions.append(a)
        for j, item in _items(raw, "slices"):
            slice_loc = (*loc, "slices", j)
            if (s := _node(item, slice_loc, MissionFileSlice, failed)) is None:
                continue
            m.slices.append(s)
            for k, fitem in _items(item, "features"):
                feature_loc = (*slice_loc, "features", k)
                if (f := _node(fitem, feature_loc, MissionFileFeature, failed)) is not None:
                    f.refs = _keys(fitem, "assertions", feature_loc, failed)
                    s.features.append(f)
    return mission, milestones


def _node(raw: Any, loc: Loc, model: type[BaseModel], failed: set[Loc]) -> Node | None:
    if not isinstance(raw, dict):
        return None
    values = {}
    for name, attname in columns(model).items():
        value = raw.get(name)
        values[attname] = fallback(model, name) if value is None or (*loc, name) in failed else value
    return Node(path_of(loc), values)


def _items(raw: dict, name: str) -> list[tuple[int, Any]]:
    items = raw.get(name)
    return list(enumerate(items)) if isinstance(items, list) else []


def _keys(raw: dict, name: str, loc: Loc, failed: set[Loc]) -> list[str]:
    return [item for i, item in _items(raw, name) if (*loc, name, i) not in failed]


# ---------------------------------------------------------------- rules of the whole file


def _read_former_names(raw: dict, mission: Node, failed: set[Loc], errors: list[str]) -> str:
    """A former name (`workspace`) given alone, or with the same value as its new name, is
    read as the new name; with another value it is an error. Returns where the
    repository was read (for the importer's errors)."""
    path = "mission.repository"
    for old, new in MISSION_FORMER_NAMES.items():
        value = raw.get(old)
        if value is None or ("mission", old) in failed:
            continue
        given = raw.get(new)
        if given is not None and ("mission", new) not in failed and given != value:
            errors.append(f"mission.{old}: the former name of {new}, whose value differs: give only {new}")
        elif given is None:
            mission.values[columns(MissionFileMission)[new]] = value
            path = f"mission.{old}"
    return path


def is_relative_path(text: str) -> bool:
    """A relative local path (`./repo`, `../code`): not a URL, not absolute, and not text the
    repository check refuses anyway (a leading `-`, a control character, or a `:` before
    any `/`, which git reads as `host:path`)."""
    text = (text or "").strip()
    if not text or is_url(text) or os.path.isabs(text) or text.startswith("-") or not text.isprintable():
        return False
    return ":" not in text.split("/", 1)[0]


def _resolve_repository(mission: Node, base_dir: pathlib.Path | None, path: str, errors: list[str]) -> None:
    """A relative local path is relative to the file's folder: stored absolute. Without a
    folder it is kept as written, and the importer's repository check refuses it."""
    repository = mission.values["repository"]
    if base_dir is None or not is_relative_path(repository):
        return
    resolved = os.path.normpath(os.path.join(os.path.abspath(base_dir), repository.strip()))
    limit = text_rule(MissionFileMission, "repository").max_length or 0
    if len(resolved) > limit:
        errors.append(f"{path}: must be at most {limit} characters once resolved ({resolved})")
    mission.values["repository"] = resolved


def _check_protection(mission: Node, errors: list[str]) -> None:
    # Protected paths are restored from the base revision: without one there is nothing to restore.
    if mission.values["protected_paths"] and not mission.values["base_revision"].strip():
        errors.append(
            "mission.base_revision: required when protected_paths is set (protected files are restored from it)"
        )


def _cross_check(milestones: list[Node], errors: list[str]) -> None:
    slices = [s for m in milestones for s in m.slices]
    features = [f for s in slices for f in s.features]
    assertions = [a for m in milestones for a in m.assertions]
    for group in (milestones, slices, features, assertions):
        seen: set[str] = set()
        for node in group:
            if isinstance(node.key, str) and node.key:
                if node.key in seen:
                    errors.append(f"{node.path}.key: duplicate key {node.key}")
                seen.add(node.key)
    _check_dependencies(milestones, errors)
    scopes: dict[str, str] = {}
    for a in assertions:
        scopes.setdefault(a.key, a.values["scope"])
    for f in features:
        path = f"{f.path}.assertions"
        for key in _dedupe(f.refs, path, "assertion key", errors):
            if key not in scopes:
                errors.append(f"{path}: unknown assertion key {key}")
            elif scopes[key] == AssertionScope.MILESTONE:
                errors.append(f"{path}: milestone-scoped assertion {key} cannot be linked to a feature")


def _dedupe(refs: list[str], path: str, what: str, errors: list[str]) -> list[str]:
    out: list[str] = []
    for ref in refs:
        if ref in out:
            errors.append(f"{path}: duplicate {what} {ref}")
        else:
            out.append(ref)
    return out


def _check_dependencies(milestones: list[Node], errors: list[str]) -> None:
    known = {m.key for m in milestones}
    edges: dict[str, list[str]] = {}
    for m in milestones:
        path = f"{m.path}.dependencies"
        for ref in _dedupe(m.refs, path, "milestone", errors):
            if ref == m.key:
                errors.append(f"{path}: a milestone cannot depend on itself")
            elif ref not in known:
                errors.append(f"{path}: unknown milestone {ref}")
            else:
                edges.setdefault(m.key, []).append(ref)
    paths = {m.key: m.path for m in milestones}
    state: dict[str, int] = {}  # 1 = on the current walk, 2 = finished

    def walk(key: str, trail: list[str]) -> None:
        state[key] = 1
        for nxt in edges.get(key, []):
            if state.get(nxt) == 1:
                cycle = trail[trail.index(nxt) :] + [nxt]
                errors.append(f"{paths[nxt]}.dependencies: dependency cycle {' -> '.join(cycle)}")
            elif nxt not in state:
                walk(nxt, trail + [nxt])
        state[key] = 2

    for m in milestones:
        if m.key not in state:
            walk(m.key, [m.key])
