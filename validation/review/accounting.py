"""The evaluator's accounting, as the host checks it: every source finding copied
exactly, decided once (included in a group, or excluded), and every group made of exactly
the findings that name it, at their highest severity.

Pure functions. `check_evaluation` collects every violation of the accounting rules,
bounded in count and length, so that one repair turn can fix them all; the evaluator's
answer is read as strictly as a candidate's (`candidates`).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from validation.journal import canonical
from validation.review.candidates import (
    FENCE,
    LABELS,
    MAX_PREAMBLE_BYTES,
    SEVERITIES,
    SEVERITY_RANK,
    Unparseable,
    strict_json,
)

MAX_ERRORS = 24
MAX_ERROR_CHARS = 500
MAX_ERRORS_TOTAL = 4000


class _Collector:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)

    def bounded(self) -> list[str]:
        out: list[str] = []
        total = 0
        for message in self.items:
            message = message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"
            if len(out) >= MAX_ERRORS or total + len(message) > MAX_ERRORS_TOTAL:
                out.append(f"… and {len(self.items) - len(out)} more violations")
                break
            out.append(message)
            total += len(message)
        return out


def _key(finding: Any) -> bytes:
    try:
        return canonical(finding)
    except Exception:  # noqa: BLE001 — a non-JSON value never equals a host finding
        return repr(finding).encode()


def _nonblank(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip())


def _check_findings(acc: dict, host: list[dict], errors: _Collector) -> None:
    copied = acc.get("findings")
    if not isinstance(copied, list):
        errors.add("validation_accounting.findings must be the array of source findings, copied exactly")
        return
    host_by_id = {f["source_id"]: f for f in host}
    seen: set[str] = set()
    for i, item in enumerate(copied):
        sid = item.get("source_id") if isinstance(item, dict) else None
        if not isinstance(sid, str) or sid not in host_by_id:
            errors.add(f"validation_accounting.findings[{i}] is not a source finding (source_id {sid!r} is unknown)")
        elif sid in seen:
            errors.add(f"validation_accounting.findings lists {sid} more than once")
        elif _key(item) != _key(host_by_id[sid]):
            fields = sorted(k for k in set(item) | set(host_by_id[sid]) if item.get(k) != host_by_id[sid].get(k))
            errors.add(
                f"validation_accounting.findings[{i}] ({sid}) is not an exact copy of the source finding "
                f"(differs in {', '.join(map(str, fields))})"
            )
        if isinstance(sid, str):
            seen.add(sid)
    for sid in host_by_id:
        if sid not in seen:
            errors.add(f"validation_accounting.findings is missing source finding {sid}")


def _check_decisions(acc: dict, known: set[str], errors: _Collector) -> dict[str, dict]:
    decisions = acc.get("decisions")
    if not isinstance(decisions, list):
        errors.add("validation_accounting.decisions must be an array with one decision per source finding")
        return {}
    decided: dict[str, dict] = {}
    for i, item in enumerate(decisions):
        where = f"validation_accounting.decisions[{i}]"
        if not isinstance(item, dict):
            errors.add(f"{where} must be an object")
            continue
        for key in sorted(set(item) - {"source_id", "decision", "group_id", "rationale"}):
            errors.add(f"{where} has unknown key {key!r}")
        sid = item.get("source_id")
        if not isinstance(sid, str) or sid not in known:
            errors.add(f"{where} decides an unknown source finding {sid!r}")
            continue
        if sid in decided:
            errors.add(f"{where} decides {sid} a second time: decide every source finding exactly once")
            continue
        decided[sid] = item
        decision = item.get("decision")
        if decision not in ("include", "exclude"):
            errors.add(f"{where} ({sid}): decision must be 'include' or 'exclude'")
        elif decision == "include" and not _nonblank(item.get("group_id")):
            errors.add(f"{where} ({sid}) is included without a group_id: an included finding names its group")
        elif decision == "exclude" and item.get("group_id") is not None:
            errors.add(
                f"{where} ({sid}) is excluded but names group {item.get('group_id')!r}: "
                "an excluded finding has no group_id"
            )
        if not _nonblank(item.get("rationale")):
            errors.add(f"{where} ({sid}) needs a non-blank rationale")
    for sid in sorted(known - set(decided)):
        errors.add(f"validation_accounting.decisions has no decision for {sid}")
    return decided


def _check_groups(
    acc: dict, known: set[str], decided: dict[str, dict], host: dict[str, dict], errors: _Collector
) -> None:
    groups = acc.get("groups")
    if not isinstance(groups, list):
        errors.add("validation_accounting.groups must be an array")
        return
    members = _group_members(decided)
    seen: set[str] = set()
    for i, group in enumerate(groups):
        where = f"validation_accounting.groups[{i}]"
        gid = _group_id(group, where, seen, errors)
        if gid is None:
            continue
        seen.add(gid)
        _check_group_fields(group, where, errors)
        _check_group_sources(group, where, gid, known, sorted(members.get(gid, [])), host, errors)
    for gid in sorted(set(members) - seen):
        errors.add(f"included findings {sorted(members[gid])} name group {gid!r}, which is not in groups")


def _group_members(decided: dict[str, dict]) -> dict[str, list[str]]:
    """The included findings of each group the decisions name."""
    members: dict[str, list[str]] = {}
    for sid, item in decided.items():
        if item.get("decision") == "include" and _nonblank(item.get("group_id")):
            members.setdefault(item["group_id"], []).append(sid)
    return members


def _group_id(group: Any, where: str, seen: set[str], errors: _Collector) -> str | None:
    """The group's id, or None for a group that is not an object, has no id or repeats one."""
    if not isinstance(group, dict):
        errors.add(f"{where} must be an object")
        return None
    for key in sorted(
        set(group) - {"group_id", "source_ids", "severity", "summary", "location", "evidence", "impact", "rationale"}
    ):
        errors.add(f"{where} has unknown key {key!r}")
    gid = group.get("group_id")
    if not _nonblank(gid):
        errors.add(f"{where} needs a non-blank group_id")
        return None
    if gid in seen:
        errors.add(f"{where}: group_id {gid!r} is used twice")
        return None
    return gid


def _check_group_sources(
    group: dict, where: str, gid: str, known: set[str], expected: list[str], host: dict[str, dict], errors: _Collector
) -> None:
    ids = group.get("source_ids")
    if not isinstance(ids, list) or not ids:
        errors.add(f"{where} ({gid}): source_ids must be a non-empty array")
        return
    unknown = [s for s in ids if not isinstance(s, str) or s not in known]
    if unknown:
        errors.add(f"{where} ({gid}): unknown source ids {unknown}")
    if len(set(map(str, ids))) != len(ids):
        errors.add(f"{where} ({gid}): source_ids repeat an id")
    if sorted(map(str, ids)) != expected:
        errors.add(
            f"{where} ({gid}): source_ids {sorted(map(str, ids))} must be exactly the included findings "
            f"that name this group, {expected}"
        )
    elif expected and group.get("severity") in SEVERITIES:
        worst = min((host[s]["severity"] for s in expected), key=SEVERITY_RANK.__getitem__)
        if group["severity"] != worst:
            errors.add(f"{where} ({gid}): severity must be {worst!r}, the highest severity of its findings")


def _check_group_fields(group: dict, where: str, errors: _Collector) -> None:
    if group.get("severity") not in SEVERITIES:
        errors.add(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
    for key in ("summary", "location", "evidence", "impact", "rationale"):
        if not _nonblank(group.get(key)):
            errors.add(f"{where}: {key} must be a non-blank string")


def _check_envelope(doc: dict, labels: tuple[str, ...], errors: _Collector) -> None:
    for key in sorted(
        set(doc) - {"candidate_assessments", "agreements", "conflicts", "synthesis_plan", "validation_accounting"}
    ):
        errors.add(f"unknown top-level key {key!r}")
    assessments = doc.get("candidate_assessments")
    if not isinstance(assessments, list):
        errors.add("candidate_assessments must be an array with one assessment per candidate")
    else:
        ids = [a.get("candidate_id") if isinstance(a, dict) else None for a in assessments]
        if sorted(map(str, ids)) != sorted(labels):
            errors.add(f"candidate_assessments must assess each of {', '.join(labels)} exactly once, got {ids}")
    if not isinstance(doc.get("agreements", []), list):
        errors.add("agreements must be an array")
    conflicts = doc.get("conflicts", [])
    if not isinstance(conflicts, list):
        errors.add("conflicts must be an array")
    else:
        for i, conflict in enumerate(conflicts):
            named = conflict.get("candidate_ids") if isinstance(conflict, dict) else None
            if not isinstance(named, list) or len({c for c in named if isinstance(c, str) and c in labels}) < 2:
                errors.add(f"conflicts[{i}] must name at least two distinct candidates in candidate_ids")
    if "synthesis_plan" in doc and not isinstance(doc["synthesis_plan"], (str, list)):
        errors.add("synthesis_plan must be a string or an array of strings")


def check_evaluation(doc: Any, host: list[dict], *, labels: tuple[str, ...] = LABELS) -> list[str]:
    """Every violation of the evaluator contract, bounded; [] when the output is accepted."""
    errors = _Collector()
    if not isinstance(doc, dict):
        return ["the answer must be one JSON object"]
    _check_envelope(doc, labels, errors)
    acc = doc.get("validation_accounting")
    if not isinstance(acc, dict):
        errors.add("validation_accounting is required: an object with findings, decisions and groups")
        return errors.bounded()
    for key in sorted(set(acc) - {"findings", "decisions", "groups"}):
        errors.add(f"validation_accounting has unknown key {key!r}")
    known = {f["source_id"] for f in host}
    _check_findings(acc, host, errors)
    decided = _check_decisions(acc, known, errors)
    _check_groups(acc, known, decided, {f["source_id"]: f for f in host}, errors)
    return errors.bounded()


def parse_evaluation(text: str | None) -> tuple[Any, list[str]]:
    """The evaluator's JSON (bare, or in the same single-fence form candidates may use)."""
    if text is None:
        return None, ["the evaluator gave no answer"]
    try:
        return strict_json(text), []
    except Unparseable as exc:
        match = FENCE.match(text)
        if (
            match
            and "```" not in match["preamble"] + match["body"]
            and len(match["preamble"].encode()) <= MAX_PREAMBLE_BYTES
        ):
            try:
                return strict_json(match["body"]), []
            except Unparseable as inner:
                return None, [f"the answer is not one JSON object: {inner}"]
        return None, [f"the answer is not one JSON object: {exc}"]
