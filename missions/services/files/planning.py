"""A mission file planned before it is applied: the dry run and the apply of exactly what it
answered (docs/MISSION_FILES.md, "Plan and apply").

Decisions:
- One code path: a plan is the import itself (`importing.mission_file_import`) run in a
  transaction that is then rolled back, with the mission's contract read before and after;
  an apply is the same import, committed. So a plan reports exactly what the import would
  create, change or refuse, in its words, and writes nothing: no row, no audit entry, no
  event (the events are published on commit, the audit rows are in the transaction), no
  actor message (sent on commit).
- The plan's hash is sha256 over the canonical JSON of the file as read (keys sorted) and
  the mission's `state_version`, and is answered as `<state_version>:<sha256>`. The state
  version is a digest of the mission's contract as stored: every field a file sets on the
  mission and its milestones, assertions, slices and features, their places, links and
  dependencies, and the owner (loop states are not in it: the loop moving does not make a
  plan stale). An apply re-plans the file it is given under the mission's lock: a hash
  whose sha256 is not that of this file at its own version is `plan_mismatch`, one answered
  against another version `plan_stale` (both 409, nothing changes).
- Who may plan or apply: a file whose key is free, any signed-in user (as the API's
  create); a mission that exists, whoever may see it (its owner, a member, staff: as the
  import); a key of a mission the user may not see is `not_found`.
- A plan the import would refuse (the file's mistakes, a check only staff may set, a
  repository or a base refused) answers `applicable: false` with the import's code and
  its `path: message` lines, each also as a `refused` item; applying such a file raises
  what the import raises.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import models, transaction
from pydantic import BaseModel

from missions.errors import Conflict, DomainError, NotFound
from missions.locks import locked_mission
from missions.models import ContractAssertion, FeatureAssertion, Milestone, Mission, MissionFeature, Slice
from missions.selectors import visible_missions
from missions.services.files import yaml_io
from missions.services.files.importing import ImportResult, mission_file_import
from missions.services.files.schema import (
    MissionFileAssertion,
    MissionFileFeature,
    MissionFileMilestone,
    MissionFileMission,
    MissionFileSlice,
    columns,
)
from missions.services.files.validating import Document, invalid, validated

Key = tuple[str, str]  # (kind, key)


@dataclass
class Plan:
    """What applying the file would do. Each item is `{"kind", "key", "path", …}`."""

    mission_key: str
    state_version: str
    plan_hash: str | None
    applicable: bool
    created: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    unchanged: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    left_alone: list[dict[str, Any]] = field(default_factory=list)
    reopened: list[dict[str, Any]] = field(default_factory=list)
    code: str | None = None
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Applied:
    result: ImportResult
    plan: Plan


def mission_plan(*, document: str | dict, user, base_dir: pathlib.Path | None = None, from_api: bool = False) -> Plan:
    """The dry run of importing `document` as `user`; nothing is written. A file the import
    would refuse is answered `applicable: false` with its lines; a mission the user may not
    see is `not_found` (raised)."""
    try:
        raw = _read(document)
        doc = validated(document, base_dir, from_api=from_api)
    except DomainError as exc:
        if "errors" not in exc.fields:
            raise
        return _refused("", state_version(Contract()), exc)
    key = str(doc.mission.key)
    try:
        with transaction.atomic():
            mission = _visible_locked(key, user)
            before = contract(mission)
            version = state_version(before)
            try:
                result = mission_file_import(document=document, base_dir=base_dir, user=user, from_api=from_api)
            except DomainError as exc:
                if "errors" not in exc.fields:
                    raise
                plan = _refused(key, version, exc)
            else:
                after = contract(result.mission)
                plan = _diff(doc, before, after, key=key, version=version, plan_hash=hash_of(raw, version))
            raise _RollBack(plan)
    except _RollBack as done:
        return done.plan


def mission_apply(
    *,
    document: str | dict,
    plan_hash: str,
    user,
    base_dir: pathlib.Path | None = None,
    from_api: bool = False,
) -> Applied:
    """Import `document` as `user` if `plan_hash` is the hash a plan of it answered
    against the mission as it is now; else `plan_mismatch` or `plan_stale` and nothing changes."""
    raw = _read(document)
    doc = validated(document, base_dir, from_api=from_api)
    key = str(doc.mission.key)
    with transaction.atomic():
        mission = _visible_locked(key, user)
        before = contract(mission)
        version = state_version(before)
        if doc.errors:
            # The file's mistakes come first, as the import words them (with those that need
            # the stored mission); it raises them, and the raise below rolls back whatever
            # an import that did not would have written.
            mission_file_import(document=document, base_dir=base_dir, user=user, from_api=from_api)
            raise invalid(doc.errors)
        _check_hash(plan_hash, raw, version)
        result = mission_file_import(document=document, base_dir=base_dir, user=user, from_api=from_api)
        if result.created != (mission is None):  # a concurrent import created it meanwhile
            raise _stale()
        after = contract(result.mission)
        plan = _diff(doc, before, after, key=key, version=version, plan_hash=plan_hash)
    return Applied(result=result, plan=plan)


# ---------------------------------------------------------------- the hash


def canonical(raw: Any) -> str:
    return json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def hash_of(raw: Any, version: str) -> str:
    digest = hashlib.sha256(f"{canonical(raw)}\n{version}".encode()).hexdigest()
    return f"{version}:{digest}"


def _check_hash(given: str, raw: Any, version: str) -> None:
    answered_version, _, _ = given.partition(":")
    if hash_of(raw, answered_version) != given:
        raise Conflict(
            "this plan hash was not answered for this file: plan it again and apply what it answers",
            code="plan_mismatch",
            fields={"plan_hash": ["not the hash of a plan of this file"]},
        )
    if answered_version != version:
        raise _stale()


def _stale() -> Conflict:
    return Conflict(
        "the mission changed since this plan was answered: plan it again",
        code="plan_stale",
        fields={"plan_hash": ["answered against an earlier state of the mission"]},
    )


def _read(document: str | dict) -> Any:
    errors: list[str] = []
    raw = yaml_io.load(document, errors)
    if errors:
        raise invalid(errors)
    return raw


class _RollBack(Exception):  # noqa: N818 — not an error: it carries the plan out of the transaction
    def __init__(self, plan: Plan) -> None:
        super().__init__("dry run")
        self.plan = plan


def _visible_locked(key: str, user) -> Mission | None:
    """The mission of the file's key under its row lock (the import takes it again), if the
    user may see it; none when the key is free."""
    mission = locked_mission(key=key)
    if mission is not None and user is not None and not visible_missions(user=user).filter(pk=mission.pk).exists():
        raise NotFound(f"no mission {key!r} you may see (the key is another user's)", code="not_found")
    return mission


# ---------------------------------------------------------------- the contract as stored

_MODELS: dict[str, tuple[type[models.Model], type[BaseModel]]] = {
    "milestone": (Milestone, MissionFileMilestone),
    "assertion": (ContractAssertion, MissionFileAssertion),
    "slice": (Slice, MissionFileSlice),
    "feature": (MissionFeature, MissionFileFeature),
}
_PARENT = {"milestone": None, "assertion": "milestone__key", "slice": "milestone__key", "feature": "slice__key"}
_STATE = {"mission": "status", "milestone": "status", "slice": "status", "feature": "loop_state"}


@dataclass
class Contract:
    rows: dict[Key, dict[str, Any]] = field(default_factory=dict)
    states: dict[Key, str] = field(default_factory=dict)


def contract(mission: Mission | None) -> Contract:
    """Every value a mission file sets, by (kind, key), and each node's state."""
    out = Contract()
    if mission is None:
        return out
    mission_fields = sorted({*columns(MissionFileMission).values(), "owner_id", "base_commit"})
    row = Mission.objects.filter(pk=mission.pk).values(*mission_fields, "status").get()
    out.states[("mission", mission.key)] = row.pop("status")
    out.rows[("mission", mission.key)] = row
    for kind, (model, declared) in _MODELS.items():
        names = sorted({*columns(declared).values(), "key", "order"})
        parent = _PARENT[kind]
        extra = [parent] if parent else []
        state = [_STATE[kind]] if kind in _STATE else []
        for values in model._default_manager.filter(mission=mission).values(*names, *extra, *state):
            if state:
                out.states[(kind, values["key"])] = values.pop(state[0])
            out.rows[(kind, values["key"])] = values
    for frm, to in Milestone.dependencies.through.objects.filter(from_milestone__mission=mission).values_list(
        "from_milestone__key", "to_milestone__key"
    ):
        out.rows[("milestone", frm)].setdefault("dependencies", []).append(to)
    for feature, assertion in FeatureAssertion.objects.filter(feature__mission=mission).values_list(
        "feature__key", "assertion__key"
    ):
        out.rows[("feature", feature)].setdefault("assertions", []).append(assertion)
    for values in out.rows.values():
        for name in ("dependencies", "assertions"):
            if name in values:
                values[name] = sorted(values[name])
    return out


def state_version(stored: Contract) -> str:
    text = canonical(sorted([list(k), v] for k, v in stored.rows.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the answer


def _nodes(doc: Document) -> list[tuple[str, Any, str]]:
    """(kind, key, path) of every node of the file, in the file's order."""
    out = [("mission", doc.mission.key, "mission")]
    for m in doc.milestones:
        out.append(("milestone", m.key, m.path))
        out += [("assertion", a.key, a.path) for a in m.assertions]
        for s in m.slices:
            out.append(("slice", s.key, s.path))
            out += [("feature", f.key, f.path) for f in s.features]
    return out


def _diff(doc: Document, before: Contract, after: Contract, *, key: str, version: str, plan_hash: str) -> Plan:
    plan = Plan(mission_key=key, state_version=version, plan_hash=plan_hash, applicable=True)
    in_file = set()
    paths: dict[Key, str] = {}
    for kind, node_key, path in _nodes(doc):
        k = (kind, str(node_key))
        in_file.add(k)
        paths[k] = path
        item = {"kind": kind, "key": node_key, "path": path}
        old, new = before.rows.get(k), after.rows.get(k, {})
        if old is None:
            plan.created.append(item)
        elif fields := sorted(name for name in {*old, *new} if old.get(name) != new.get(name)):
            plan.changed.append({**item, "fields": fields})
        else:
            plan.unchanged.append(item)
    plan.left_alone = [{"kind": kind, "key": k} for kind, k in sorted(set(before.rows) - in_file)]
    for k, old_state in before.states.items():
        new_state = after.states.get(k, old_state)
        if new_state != old_state:
            plan.reopened.append({"kind": k[0], "key": k[1], "path": paths.get(k), "from": old_state, "to": new_state})
    return plan


_LAST_NODE = re.compile(r"(milestones|assertions|slices|features)\[\d+\](?!.*\[\d+\])")
_KINDS = {"milestones": "milestone", "assertions": "assertion", "slices": "slice", "features": "feature"}


def _refused(key: str, version: str, exc: DomainError) -> Plan:
    lines = [str(line) for line in exc.fields["errors"]]
    items = []
    for line in lines:
        path, _, message = line.partition(": ")
        message = message or exc.detail
        found = _LAST_NODE.search(path)
        kind = _KINDS[found.group(1)] if found else path.split(".")[0].split("[")[0]
        items.append({"kind": kind, "path": path, "message": message, "code": exc.code})
    return Plan(
        mission_key=key,
        state_version=version,
        plan_hash=None,
        applicable=False,
        refused=items,
        code=exc.code,
        errors=lines,
    )


__all__ = ["Applied", "Plan", "contract", "mission_apply", "mission_plan", "hash_of", "state_version"]
