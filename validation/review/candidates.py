"""The reviewers' answers, as the host reads them: strict JSON (no duplicate keys, no
NaN, no lone surrogate), the closed candidate contract, and the host's ids for the
findings the evaluator then accounts for (`accounting`).

Pure functions. `parse_candidate` accepts one bare JSON object, or (the one narrow
recovery) a single ```json fence after at most a short prose preamble with nothing after
it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CANDIDATE_SCHEMA = "fusion-missions.review-candidate.v1"
SEVERITIES = ("critical", "high", "minor")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
FINDING_KEYS = ("severity", "location", "evidence", "impact", "summary")
LABELS = ("A", "B", "C")
MAX_PREAMBLE_BYTES = 2000
FENCE = re.compile(r"\A(?P<preamble>.*?)```json[ \t]*\r?\n(?P<body>.*?)\r?\n```[ \t]*\s*\Z", re.DOTALL)


class Unparseable(ValueError):
    pass


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated:
        raise Unparseable(f"duplicate keys {duplicated}")
    return dict(pairs)


def _no_constants(name):
    raise Unparseable(f"{name} is not JSON")


def strict_json(text: str) -> Any:
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except json.JSONDecodeError as exc:
        raise Unparseable(f"not a JSON document: {exc}") from exc
    except UnicodeEncodeError as exc:
        raise Unparseable("the JSON holds a lone surrogate (\\ud800-\\udfff escape): not valid Unicode") from exc
    return doc


@dataclass
class ParsedCandidate:
    ok: bool
    report: dict[str, Any] = field(default_factory=lambda: {"findings": [], "verified": [], "limitations": []})
    recovered: bool = False
    recovery: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _strings(value: Any, path: str, problems: list[str]) -> list[str]:
    if not isinstance(value, list):
        problems.append(f"{path} must be an array of strings")
        return []
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            problems.append(f"{path}[{i}] must be a non-blank string")
        else:
            out.append(item.strip())
    return out


def candidate_problems(doc: Any) -> tuple[dict[str, Any], list[str]]:
    """Validate the closed candidate contract; return the normalized report and problems."""
    problems: list[str] = []
    if not isinstance(doc, dict):
        return {}, ["the answer must be one JSON object"]
    for key in sorted(set(doc) - {"schema_version", "findings", "verified", "limitations"}):
        problems.append(f"unknown key {key!r}")
    if "schema_version" in doc and doc["schema_version"] != CANDIDATE_SCHEMA:
        problems.append(f"schema_version must be {CANDIDATE_SCHEMA!r}")
    for key in ("findings", "verified", "limitations"):
        if key not in doc:
            problems.append(f"{key} is required")
    findings = _findings(doc.get("findings", []), problems)
    report = {
        "findings": findings,
        "verified": _strings(doc.get("verified", []), "verified", problems),
        "limitations": _strings(doc.get("limitations", []), "limitations", problems),
    }
    return report, problems


def _findings(raw: Any, problems: list[str]) -> list[dict[str, str]]:
    if not isinstance(raw, list):
        problems.append("findings must be an array")
        return []
    findings = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            problems.append(f"findings[{i}] must be an object")
            continue
        findings.append(_finding(item, f"findings[{i}]", problems))
    return findings


def _finding(item: dict[str, Any], where: str, problems: list[str]) -> dict[str, str]:
    for key in sorted(set(item) - set(FINDING_KEYS)):
        problems.append(f"{where} has unknown key {key!r}")
    finding = {}
    for key in FINDING_KEYS:
        value = item.get(key)
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{where}.{key} must be a non-blank string")
        else:
            finding[key] = value.strip()
    if finding.get("severity") is not None and finding["severity"] not in SEVERITIES:
        problems.append(f"{where}.severity must be one of {', '.join(SEVERITIES)}")
    return finding


def parse_candidate(text: str | None, *, max_bytes: int) -> ParsedCandidate:
    if text is None:
        return ParsedCandidate(False, problems=["the reviewer gave no answer"])
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        return ParsedCandidate(False, problems=[f"the answer is {size} bytes, more than {max_bytes}"])
    recovered, recovery = False, {}
    try:
        doc = strict_json(text)
    except Unparseable as strict_error:
        match = FENCE.match(text)
        if match is None or "```" in match["preamble"] or "```" in match["body"]:
            return ParsedCandidate(False, problems=[str(strict_error)])
        preamble_bytes = len(match["preamble"].encode("utf-8"))
        if preamble_bytes > MAX_PREAMBLE_BYTES:
            return ParsedCandidate(
                False,
                problems=[f"the prose before the JSON fence is {preamble_bytes} bytes, more than {MAX_PREAMBLE_BYTES}"],
            )
        try:
            doc = strict_json(match["body"])
        except Unparseable as exc:
            return ParsedCandidate(False, problems=[f"the fenced block: {exc}"])
        recovered = True
        recovery = {
            "rule": "single ```json fence",
            "preamble_bytes": preamble_bytes,
            "body_bytes": len(match["body"].encode("utf-8")),
        }
    report, problems = candidate_problems(doc)
    if problems:
        return ParsedCandidate(False, problems=problems)
    return ParsedCandidate(True, report=report, recovered=recovered, recovery=recovery)


def source_findings(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Host-assigned ids `<label>-F<nnn>` (1-based position), collected in label order."""
    out = []
    for label in LABELS:
        for n, finding in enumerate(reports[label]["findings"], 1):
            out.append({"source_id": f"{label}-F{n:03d}", **{k: finding[k] for k in FINDING_KEYS}})
    return out
