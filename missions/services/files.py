"""Missions as code: import and export the mission file (DESIGN §8).

Decisions (what the file means):
- The whole document is validated before anything is written; every error is reported
  as `path: message` (`milestones[0].slices[1].key: duplicate key s1`) in one
  `Invalid(code="invalid_mission_file")`. Then the import runs in one transaction.
- Entities are matched by key: the mission by `key`, milestones, slices, features and
  assertions by their key within the mission. A matched entity may move (a slice to
  another milestone, a feature to another slice, an assertion to another milestone).
- The file is declarative: an omitted field means the model default, so re-importing a
  file without `description` clears a stored description. Order comes from list
  positions; stored orders are only renumbered when the file's order differs from the
  stored relative order (so re-importing an export never rewrites anything).
- Entities that are in the database but not in the file are LEFT ALONE, never deleted:
  the database holds work the file knows nothing about (tasks, runs, failures, fix
  features the loop generated after the last export). Delete through the API or admin.
  References in the file (milestone `dependencies`, a feature's `assertions`) must name
  entities of the file; links of a file entity are made to match the file exactly.
- States are not imported: they change through the services. The mission `status` is
  applied to a NEW mission only and ignored when the mission exists.
- A `check` (it executes code) or an `executor_command` may only be set or changed by
  staff or from the CLI (`user=None`); an unchanged value is allowed for anyone.
- Relative `workspace` paths are resolved against `base_dir` (the file's folder) and
  stored absolute; export writes the workspace as stored.
- The validator profile name is not checked against the configured profiles: they
  depend on the environment, and a missing one is reported when a run needs it.
"""

from __future__ import annotations

import enum
import os
import pathlib
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from missions.checks_spec import check_spec_problems, pattern_problems
from missions.errors import Forbidden, Invalid, StaffOnly
from missions.events import publish_on_commit
from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionFeature,
    Slice,
)
from missions.services.rollup import milestone_rollup_refresh

MAX_DOCUMENT_CHARS = 5_000_000
MAX_ERRORS = 200
_SLUG = re.compile(r"^[-a-zA-Z0-9_]+\Z")

MISSION_FIELDS = (
    "key",
    "title",
    "description",
    "status",
    "workspace",
    "base_revision",
    "protected_paths",
    "on_protected_change",
    "validator",
    "executor",
    "executor_command",
    "autopilot",
    "auto_fix",
    "retry_budget",
)
MILESTONE_FIELDS = ("key", "title", "description")
ASSERTION_FIELDS = ("key", "title", "statement", "scope", "check")
SLICE_FIELDS = ("key", "title", "description")
FEATURE_FIELDS = ("key", "title", "description", "acceptance_criteria")

# Export writes a check's keys in this order (then any other key, sorted).
_CHECK_KEY_ORDER = (
    "run",
    "shell",
    "expect_exit",
    "expect_output",
    "timeout",
    "file",
    "exists",
    "contains",
    "not_contains",
    "protect",
)


@dataclass
class ImportResult:
    mission: Mission
    created: bool
    changed: bool


def mission_import(*, document: str | dict, base_dir: pathlib.Path | None = None, user=None) -> tuple[Mission, bool]:
    """Create or update the mission a mission file describes; returns (mission, changed)."""
    result = mission_file_import(document=document, base_dir=base_dir, user=user)
    return result.mission, result.changed


def mission_file_import(*, document: str | dict, base_dir: pathlib.Path | None = None, user=None) -> ImportResult:
    doc = _validated(document, base_dir)
    try:
        return _apply(doc, user)
    except _MissionRace:
        # A concurrent import created the same mission between our lookup and insert;
        # run again: this time we find it and update (or leave) it.
        return _apply(doc, user)


def mission_export(*, mission: Mission) -> str:
    """The mission as a mission file: deterministic, every field written, re-importable."""
    milestones = list(Milestone.objects.filter(mission=mission).order_by("order", "id"))
    ms_pos = {m.pk: i for i, m in enumerate(milestones)}
    ms_key = {m.pk: m.key for m in milestones}
    deps: dict[int, list[int]] = defaultdict(list)
    for frm, to in Milestone.dependencies.through.objects.filter(from_milestone__mission=mission).values_list(
        "from_milestone_id", "to_milestone_id"
    ):
        if to in ms_pos:
            deps[frm].append(to)
    assertions = sorted(
        ContractAssertion.objects.filter(mission=mission), key=lambda a: (ms_pos[a.milestone_id], a.order, a.pk)
    )
    as_pos = {a.pk: i for i, a in enumerate(assertions)}
    as_key = {a.pk: a.key for a in assertions}
    by_ms: dict[int, list] = defaultdict(list)
    for a in assertions:
        by_ms[a.milestone_id].append(a)
    slices: dict[int, list] = defaultdict(list)
    for s in Slice.objects.filter(mission=mission).order_by("order", "id"):
        slices[s.milestone_id].append(s)
    features: dict[int, list] = defaultdict(list)
    for f in MissionFeature.objects.filter(mission=mission).order_by("order", "id"):
        features[f.slice_id].append(f)
    links: dict[int, list[int]] = defaultdict(list)
    for feature_id, assertion_id in FeatureAssertion.objects.filter(feature__mission=mission).values_list(
        "feature_id", "assertion_id"
    ):
        links[feature_id].append(assertion_id)

    def feature_data(f: MissionFeature) -> dict[str, Any]:
        data = {name: getattr(f, name) for name in FEATURE_FIELDS}
        data["assertions"] = _KeyList(as_key[a] for a in sorted(links[f.pk], key=as_pos.__getitem__))
        return data

    def assertion_data(a: ContractAssertion) -> dict[str, Any]:
        data = {name: _plain(getattr(a, name)) for name in ASSERTION_FIELDS if name != "check"}
        data["check"] = _canonical_check(a.check_spec)
        return data

    document = {
        "mission": {name: _plain(getattr(mission, name)) for name in MISSION_FIELDS},
        "milestones": [
            {
                **{name: getattr(m, name) for name in MILESTONE_FIELDS},
                "dependencies": _KeyList(ms_key[d] for d in sorted(deps[m.pk], key=ms_pos.__getitem__)),
                "assertions": [assertion_data(a) for a in by_ms[m.pk]],
                "slices": [
                    {
                        **{name: getattr(s, name) for name in SLICE_FIELDS},
                        "features": [feature_data(f) for f in features[s.pk]],
                    }
                    for s in slices[m.pk]
                ],
            }
            for m in milestones
        ],
    }
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False)


# ---------------------------------------------------------------- YAML in and out


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)):
            continue
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


class _KeyList(list):
    """A list of keys, written inline (`assertions: [VAL-1, VAL-2]`) as in DESIGN §8."""


def _represent_keys(dumper: _Dumper, value: _KeyList) -> yaml.SequenceNode:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)


def _represent_str(dumper: _Dumper, value: str) -> yaml.ScalarNode:
    # Multi-line text reads best as a literal block; the emitter falls back to a quoted
    # style by itself when the text cannot be a block (trailing spaces, tabs...).
    # Other line breaks (NEL, LS, PS, CR) are normalized to "\n" by a reader of a block
    # or a quoted line fold: only the double-quoted style keeps them, as escapes.
    if any(c in value for c in _OTHER_BREAKS):
        style = '"'
    else:
        style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_OTHER_BREAKS = ("\r", "\x85", "\u2028", "\u2029")


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(_KeyList, _represent_keys)


def _plain(value: Any) -> Any:
    """A choices enum (a model default not yet reloaded) written as its plain value."""
    return value.value if isinstance(value, enum.Enum) else value


def _canonical_check(check: Any) -> Any:
    if not isinstance(check, dict):
        return check
    known = [k for k in _CHECK_KEY_ORDER if k in check]
    return {k: check[k] for k in known + sorted(k for k in check if k not in _CHECK_KEY_ORDER)}


# ---------------------------------------------------------------- validation


@dataclass(frozen=True)
class _Spec:
    attr: str
    kind: str  # slug | str | choice | bool | int | check | patterns
    required: bool
    nonblank: bool
    default: Any
    max_length: int | None
    choices: tuple[str, ...]
    minimum: int | None
    maximum: int | None


def _specs(model: type[models.Model], names: tuple[str, ...]) -> dict[str, _Spec]:
    """Types, defaults and limits come from the model, so the file follows the schema."""
    specs = {}
    for name in names:
        f = model._meta.get_field("check_spec" if name == "check" else name)
        if isinstance(f, models.JSONField):
            kind = "check" if name == "check" else "patterns"
        elif isinstance(f, models.BooleanField):
            kind = "bool"
        elif isinstance(f, models.IntegerField):
            kind = "int"
        elif f.choices:
            kind = "choice"
        else:
            kind = "slug" if isinstance(f, models.SlugField) else "str"
        maxima = [v.limit_value for v in f.validators if isinstance(v, MaxValueValidator)]
        minima = [v.limit_value for v in f.validators if isinstance(v, MinValueValidator)]
        specs[name] = _Spec(
            attr=f.attname,
            kind=kind,
            required=not f.has_default() and not f.blank and not f.null,
            nonblank=not f.blank,
            default=_plain(f.get_default()),
            max_length=f.max_length if kind != "check" else None,
            choices=tuple(str(c) for c, _ in f.choices or ()),
            minimum=max(minima) if minima else None,
            maximum=min(maxima) if maxima else None,
        )
    return specs


_MISSION_SPECS = _specs(Mission, MISSION_FIELDS)
_MILESTONE_SPECS = _specs(Milestone, MILESTONE_FIELDS)
_ASSERTION_SPECS = _specs(ContractAssertion, ASSERTION_FIELDS)
_SLICE_SPECS = _specs(Slice, SLICE_FIELDS)
_FEATURE_SPECS = _specs(MissionFeature, FEATURE_FIELDS)


@dataclass
class _Node:
    path: str
    values: dict[str, Any]
    refs: list[str] = field(default_factory=list)  # dependencies, or a feature's assertion keys
    assertions: list[_Node] = field(default_factory=list)
    slices: list[_Node] = field(default_factory=list)
    features: list[_Node] = field(default_factory=list)

    @property
    def key(self) -> Any:
        return self.values["key"]


@dataclass
class _Document:
    mission: _Node | None  # None only while errors are being collected
    milestones: list[_Node]

    def all_slices(self) -> list[_Node]:
        return [s for m in self.milestones for s in m.slices]

    def all_features(self) -> list[_Node]:
        return [f for s in self.all_slices() for f in s.features]

    def all_assertions(self) -> list[_Node]:
        return [a for m in self.milestones for a in m.assertions]


def _invalid(errors: list[str]) -> Invalid:
    if len(errors) > MAX_ERRORS:
        errors = errors[:MAX_ERRORS] + [f"document: {len(errors) - MAX_ERRORS} more errors not shown"]
    return Invalid("mission file is invalid", code="invalid_mission_file", fields={"errors": errors})


def _join(path: str, name: Any) -> str:
    return f"{path}.{name}" if path else str(name)


def _validated(document: str | dict, base_dir: pathlib.Path | None) -> _Document:
    errors: list[str] = []
    raw = _parse(document, errors)
    doc = _structure(raw, errors) if not errors else None
    if doc is not None:
        if doc.mission is not None:
            _resolve_workspace(doc.mission, base_dir, errors)
            _check_protection(doc.mission, errors)
        _cross_check(doc, errors)
    if errors or doc is None or doc.mission is None:
        raise _invalid(errors or ["document: must be a mapping with `mission` and `milestones`"])
    return doc


def _parse(document: str | dict, errors: list[str]) -> Any:
    if isinstance(document, dict):
        return document
    if isinstance(document, bytes):
        document = document.decode("utf-8", errors="replace")
    if not isinstance(document, str):
        errors.append("document: must be YAML text or a mapping")
        return None
    if len(document) > MAX_DOCUMENT_CHARS:
        errors.append(f"document: too large (at most {MAX_DOCUMENT_CHARS} characters)")
        return None
    try:
        return yaml.load(document, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        errors.append(f"document: invalid YAML: {problem}{where}")
        return None


def _structure(raw: Any, errors: list[str]) -> _Document | None:
    if not isinstance(raw, dict):
        errors.append("document: must be a mapping with `mission` and `milestones`")
        return None
    for name in raw:
        if name not in ("mission", "milestones"):
            errors.append(f"{name}: unknown field")
    if raw.get("mission") is None:
        errors.append("mission: required")
        mission = None
    else:
        mission = _node(raw["mission"], "mission", _MISSION_SPECS, (), errors)
    milestones = [
        m
        for i, item in enumerate(_items(raw.get("milestones"), "milestones", errors))
        if (m := _milestone(item, f"milestones[{i}]", errors)) is not None
    ]
    return _Document(mission, milestones)


def _milestone(raw: Any, path: str, errors: list[str]) -> _Node | None:
    node = _node(raw, path, _MILESTONE_SPECS, ("dependencies", "assertions", "slices"), errors)
    if node is None:
        return None
    node.refs = _strings(raw.get("dependencies"), f"{path}.dependencies", errors)
    for i, item in enumerate(_items(raw.get("assertions"), f"{path}.assertions", errors)):
        if (a := _node(item, f"{path}.assertions[{i}]", _ASSERTION_SPECS, (), errors)) is not None:
            node.assertions.append(a)
    for i, item in enumerate(_items(raw.get("slices"), f"{path}.slices", errors)):
        slice_path = f"{path}.slices[{i}]"
        if (s := _node(item, slice_path, _SLICE_SPECS, ("features",), errors)) is None:
            continue
        node.slices.append(s)
        for j, fitem in enumerate(_items(item.get("features"), f"{slice_path}.features", errors)):
            feature_path = f"{slice_path}.features[{j}]"
            if (f := _node(fitem, feature_path, _FEATURE_SPECS, ("assertions",), errors)) is not None:
                f.refs = _strings(fitem.get("assertions"), f"{feature_path}.assertions", errors)
                s.features.append(f)
    return node


def _node(raw: Any, path: str, specs: dict[str, _Spec], lists: tuple[str, ...], errors: list[str]) -> _Node | None:
    if not isinstance(raw, dict):
        errors.append(f"{path}: must be a mapping")
        return None
    for name in raw:
        if name not in specs and name not in lists:
            errors.append(f"{_join(path, name)}: unknown field")
    values = {spec.attr: _value(spec, raw.get(name), _join(path, name), errors) for name, spec in specs.items()}
    return _Node(path, values)


def _items(raw: Any, path: str, errors: list[str]) -> list:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.append(f"{path}: must be a list")
        return []
    return raw


def _strings(raw: Any, path: str, errors: list[str]) -> list[str]:
    out = []
    for i, item in enumerate(_items(raw, path, errors)):
        if isinstance(item, str) and item:
            out.append(item)
        else:
            errors.append(f"{path}[{i}]: must be a key (a non-empty string)")
    return out


def _value(spec: _Spec, value: Any, path: str, errors: list[str]) -> Any:
    if value is None:
        if spec.required:
            errors.append(f"{path}: required")
        return list(spec.default) if isinstance(spec.default, list) else spec.default  # never one shared list
    problem = _problem(spec, value)
    if problem:
        errors.append(f"{path}: {problem}")
        return spec.default
    if spec.kind == "check":
        problems = _check_problems(value)
        errors.extend(f"{path}{p}" for p in problems)
    if spec.kind == "patterns":
        errors.extend(pattern_problems(value, path))
    return value


def _problem(spec: _Spec, value: Any) -> str | None:
    kind = spec.kind
    if kind == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            return "must be an integer"
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            return f"must be between {spec.minimum} and {spec.maximum}"
        return None
    if kind == "check":
        return None if isinstance(value, dict) else "must be a mapping (a check, DESIGN §5.1) or null"
    if kind == "patterns":
        return None if isinstance(value, list) else "must be a list of glob patterns"
    if not isinstance(value, str):
        return "must be a string"
    if "\x00" in value:
        return "must not contain NUL characters"
    if kind == "choice" and value not in spec.choices:
        return f"must be one of {', '.join(spec.choices)}"
    if spec.nonblank and not value.strip():
        return "must not be blank"
    if kind == "slug" and not _SLUG.match(value):
        return "must be a slug (letters, digits, hyphens and underscores)"
    if spec.max_length is not None and len(value) > spec.max_length:
        return f"must be at most {spec.max_length} characters"
    return None


def _check_problems(check: dict) -> list[str]:
    """The shared shape rules of a check (§5.1), as suffixes to the check's path."""
    problems = [f": {p}" for p in check_spec_problems(check)]
    if any(isinstance(v, str) and "\x00" in v for v in check.values()):
        problems.append(": must not contain NUL characters")
    return problems


def _resolve_workspace(mission: _Node, base_dir: pathlib.Path | None, errors: list[str]) -> None:
    workspace = mission.values["workspace"]
    if not workspace or base_dir is None or os.path.isabs(workspace):
        return
    resolved = os.path.normpath(os.path.join(os.path.abspath(base_dir), workspace))
    limit = _MISSION_SPECS["workspace"].max_length
    if len(resolved) > limit:
        errors.append(f"mission.workspace: must be at most {limit} characters once resolved ({resolved})")
    mission.values["workspace"] = resolved


def _check_protection(mission: _Node, errors: list[str]) -> None:
    # Protected paths are restored from the base revision: without one there is nothing to restore.
    if mission.values["protected_paths"] and not mission.values["base_revision"].strip():
        errors.append(
            "mission.base_revision: required when protected_paths is set (protected files are restored from it)"
        )


def _cross_check(doc: _Document, errors: list[str]) -> None:
    for group in (doc.milestones, doc.all_slices(), doc.all_features(), doc.all_assertions()):
        seen: set[str] = set()
        for node in group:
            if isinstance(node.key, str) and node.key:
                if node.key in seen:
                    errors.append(f"{node.path}.key: duplicate key {node.key}")
                seen.add(node.key)
    _check_dependencies(doc.milestones, errors)
    scopes: dict[str, str] = {}
    for a in doc.all_assertions():
        scopes.setdefault(a.key, a.values["scope"])
    for f in doc.all_features():
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


def _check_dependencies(milestones: list[_Node], errors: list[str]) -> None:
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


# ---------------------------------------------------------------- writing


class _MissionRace(Exception):
    """The mission insert lost a race with a concurrent import of the same key."""


@dataclass
class _Existing:
    milestones: dict[str, Milestone] = field(default_factory=dict)
    assertions: dict[str, ContractAssertion] = field(default_factory=dict)
    slices: dict[str, Slice] = field(default_factory=dict)
    features: dict[str, MissionFeature] = field(default_factory=dict)
    dependencies: set[tuple[int, int]] = field(default_factory=set)
    links: set[tuple[int, int]] = field(default_factory=set)

    @classmethod
    def load(cls, mission: Mission | None) -> _Existing:
        if mission is None:
            return cls()
        return cls(
            milestones={m.key: m for m in Milestone.objects.filter(mission=mission)},
            assertions={a.key: a for a in ContractAssertion.objects.filter(mission=mission)},
            slices={s.key: s for s in Slice.objects.filter(mission=mission)},
            features={f.key: f for f in MissionFeature.objects.filter(mission=mission)},
            dependencies=set(
                Milestone.dependencies.through.objects.filter(from_milestone__mission=mission).values_list(
                    "from_milestone_id", "to_milestone_id"
                )
            ),
            links=set(
                FeatureAssertion.objects.filter(feature__mission=mission).values_list("feature_id", "assertion_id")
            ),
        )


def _guard_links(doc: _Document, existing: _Existing) -> None:
    """A milestone-scoped assertion must not stay linked from a feature the file leaves alone."""
    file_features = {existing.features[f.key].pk for f in doc.all_features() if f.key in existing.features}
    feature_keys = {f.pk: f.key for f in existing.features.values()}
    errors = []
    for a in doc.all_assertions():
        current = existing.assertions.get(a.key)
        if current is None or a.values["scope"] != AssertionScope.MILESTONE:
            continue
        stray = sorted(
            feature_keys[fid] for fid, aid in existing.links if aid == current.pk and fid not in file_features
        )
        if stray:
            errors.append(
                f"{a.path}.scope: milestone-scoped assertion {a.key} is linked to features not in the file: "
                f"{', '.join(stray)}"
            )
    if errors:
        raise _invalid(errors)


def _guard_staff(doc: _Document, mission: Mission | None, existing: _Existing, user) -> None:
    if user is None or getattr(user, "is_staff", False):
        return
    paths = []
    command = doc.mission.values["executor_command"]
    if (mission is None and command) or (mission is not None and mission.executor_command != command):
        paths.append("mission.executor_command")
    for a in doc.all_assertions():
        current = existing.assertions.get(a.key)
        stored = current.check_spec if current is not None else None
        if a.values["check_spec"] != stored:
            paths.append(f"{a.path}.check")
    if paths:
        raise StaffOnly("only staff may set checks or executor commands", fields={"errors": paths})


class _Writer:
    """Saves only what differs, so an unchanged file leaves every `updated_at` alone."""

    def __init__(self) -> None:
        self.changed = False
        self.saved: set[tuple[type, int]] = set()

    def upsert(self, model: type[models.Model], current: models.Model | None, values: dict[str, Any]) -> Any:
        if current is None:
            obj = model(**values)
            obj.save()
            self._mark(obj)
            return obj
        dirty = [name for name, value in values.items() if getattr(current, name) != value]
        if dirty:
            for name in dirty:
                setattr(current, name, values[name])
            current.save(update_fields=[*dirty, "updated_at"])
            self._mark(current)
        return current

    def touch(self, obj: models.Model) -> None:
        """A many-to-many change is a write of its owner: bump `updated_at` once."""
        if (type(obj), obj.pk) not in self.saved:
            type(obj).objects.filter(pk=obj.pk).update(updated_at=timezone.now())
            self._mark(obj)

    def _mark(self, obj: models.Model) -> None:
        self.changed = True
        self.saved.add((type(obj), obj.pk))


def _orders(nodes: list[_Node], current: dict[str, Any], parent_attr: str, parent_id: int | None) -> list[int]:
    """List positions, unless the stored rows already sort (order, id) the way the file lists them."""
    objs = [current.get(n.key) for n in nodes]
    if parent_id is not None and all(o is not None and getattr(o, parent_attr) == parent_id for o in objs):
        if [o.pk for o in sorted(objs, key=lambda o: (o.order, o.pk))] == [o.pk for o in objs]:
            return [o.order for o in objs]
    return list(range(len(nodes)))


def _locked_mission(key: str) -> Mission | None:
    # The row lock serializes concurrent imports of an existing mission (PostgreSQL;
    # SQLite's IMMEDIATE transactions already serialize writers).
    return Mission.objects.select_for_update().filter(key=key).first()


def _guard_visible(mission: Mission | None, user) -> None:
    """Checked under the row lock: a key another user's import took a moment ago is not
    theirs to update (a check before the transaction would race with that import)."""
    if mission is None or user is None:  # a new mission, or the command line (trusted)
        return
    from missions.selectors import visible_missions

    if not visible_missions(user=user).filter(pk=mission.pk).exists():
        raise Forbidden("a mission with this key exists and is not yours", code="mission_key_taken")


def _apply(doc: _Document, user) -> ImportResult:
    with transaction.atomic():
        mission = _locked_mission(doc.mission.key)
        _guard_visible(mission, user)
        existing = _Existing.load(mission)
        _guard_links(doc, existing)
        _guard_staff(doc, mission, existing, user)
        writer = _Writer()
        created = mission is None
        mission = _write_mission(doc.mission, mission, user, writer)
        milestones = _write_milestones(doc, mission, existing, writer)
        assertions = _write_assertions(doc, milestones, existing, writer)
        _write_slices_and_features(doc, milestones, assertions, existing, writer)
        if writer.changed:
            milestone_rollup_refresh(
                milestone_ids=Milestone.objects.filter(mission=mission).values_list("id", flat=True)
            )
            actor_id = user.pk if user is not None and getattr(user, "is_authenticated", False) else None
            payload = {"mission": mission.pk, "status": mission.status, "change": "imported", "created": created}
            publish_on_commit(mission, "mission:updated", payload, actor_id=actor_id)
        return ImportResult(mission=mission, created=created, changed=writer.changed)


def _write_mission(node: _Node, mission: Mission | None, user, writer: _Writer) -> Mission:
    values = dict(node.values)
    if mission is not None:
        values.pop("status")  # states change through services, not files
        return writer.upsert(Mission, mission, values)
    if user is not None and getattr(user, "is_authenticated", False):
        values["owner"] = user
    try:
        with transaction.atomic():
            return writer.upsert(Mission, None, values)
    except IntegrityError as exc:
        if Mission.objects.filter(key=values["key"]).exists():
            raise _MissionRace from exc
        raise


def _write_milestones(doc: _Document, mission: Mission, existing: _Existing, writer: _Writer) -> dict[str, Milestone]:
    orders = _orders(doc.milestones, existing.milestones, "mission_id", mission.pk)
    saved = {}
    for node, order in zip(doc.milestones, orders, strict=True):
        values = {**node.values, "mission_id": mission.pk, "order": order}
        saved[node.key] = writer.upsert(Milestone, existing.milestones.get(node.key), values)
    through = Milestone.dependencies.through
    for node in doc.milestones:
        ms = saved[node.key]
        wanted = {saved[k].pk for k in node.refs}
        have = {to for frm, to in existing.dependencies if frm == ms.pk}
        if wanted != have:
            through.objects.filter(from_milestone_id=ms.pk, to_milestone_id__in=have - wanted).delete()
            through.objects.bulk_create(
                [through(from_milestone_id=ms.pk, to_milestone_id=to) for to in sorted(wanted - have)]
            )
            writer.touch(ms)
    return saved


def _write_assertions(
    doc: _Document, milestones: dict[str, Milestone], existing: _Existing, writer: _Writer
) -> dict[str, ContractAssertion]:
    saved = {}
    for m in doc.milestones:
        parent = milestones[m.key]
        orders = _orders(m.assertions, existing.assertions, "milestone_id", parent.pk)
        for node, order in zip(m.assertions, orders, strict=True):
            values = {**node.values, "milestone_id": parent.pk, "order": order}
            saved[node.key] = writer.upsert(ContractAssertion, existing.assertions.get(node.key), values)
    return saved


def _write_slices_and_features(
    doc: _Document,
    milestones: dict[str, Milestone],
    assertions: dict[str, ContractAssertion],
    existing: _Existing,
    writer: _Writer,
) -> None:
    for m in doc.milestones:
        parent = milestones[m.key]
        slice_orders = _orders(m.slices, existing.slices, "milestone_id", parent.pk)
        for s_node, s_order in zip(m.slices, slice_orders, strict=True):
            values = {**s_node.values, "milestone_id": parent.pk, "order": s_order}
            slice_ = writer.upsert(Slice, existing.slices.get(s_node.key), values)
            orders = _orders(s_node.features, existing.features, "slice_id", slice_.pk)
            for f_node, f_order in zip(s_node.features, orders, strict=True):
                values = {**f_node.values, "slice_id": slice_.pk, "order": f_order}
                feature = writer.upsert(MissionFeature, existing.features.get(f_node.key), values)
                _write_links(feature, {assertions[k].pk for k in f_node.refs}, existing, writer)


def _write_links(feature: MissionFeature, wanted: set[int], existing: _Existing, writer: _Writer) -> None:
    have = {aid for fid, aid in existing.links if fid == feature.pk}
    if wanted == have:
        return
    FeatureAssertion.objects.filter(feature_id=feature.pk, assertion_id__in=have - wanted).delete()
    for assertion_id in sorted(wanted - have):
        FeatureAssertion.objects.create(feature_id=feature.pk, assertion_id=assertion_id)
    writer.touch(feature)
