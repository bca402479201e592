"""Verdict documents and scripted model turns for validator tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def item(key: str, verdict: str = "pass", *, evidence: list[dict] | None = None, **fields: str) -> dict[str, Any]:
    doc = {
        "key": key,
        "verdict": verdict,
        "message": fields.get("message", f"{key} {verdict}"),
        "expected": fields.get("expected", ""),
        "actual": fields.get("actual", ""),
        "evidence": evidence if evidence is not None else [{"kind": "other", "text": f"looked at {key}"}],
    }
    if verdict == "fail":
        doc["expected"] = doc["expected"] or "the behaviour"
        doc["actual"] = doc["actual"] or "something else"
    return doc


def verdict(*items: dict[str, Any], status: str | None = None, summary: str = "judged") -> dict[str, Any]:
    verdicts = {i["verdict"] for i in items}
    status = status or ("blocked" if "blocked" in verdicts else "fail" if "fail" in verdicts else "pass")
    return {"status": status, "summary": summary, "blocked_reason": "", "assertions": list(items)}


def passing(*keys: str) -> dict[str, Any]:
    return verdict(*(item(k) for k in keys))


# A scripted turn is either ("tool", name, args) or ("verdict", document) or a callable
# (messages) -> one of those.
Turn = tuple | Callable


def as_json(doc: Any) -> str:
    return json.dumps(doc)


def host_rejections() -> dict[str, tuple[dict[str, Any], str]]:
    """For assertions VAL-1 and VAL-2: one bad candidate per host validator (and the schema),
    with the key (or schema location) it offends."""
    return {
        "keys_accounted": (verdict(item("VAL-1")), "VAL-2"),
        "failures_explained": (verdict(item("VAL-1"), {**item("VAL-2", "fail"), "expected": " "}), "VAL-2"),
        "evidence_present": (verdict(item("VAL-1", evidence=[]), item("VAL-2")), "VAL-1"),
        "file_evidence_exists": (
            verdict(item("VAL-1"), item("VAL-2", evidence=[{"kind": "file", "text": "nope.py:3"}])),
            "VAL-2",
        ),
        "no_invisible_characters": (verdict(item("VAL-1", message="fine\u200b"), item("VAL-2")), "VAL-1"),
        "schema": (verdict(item("VAL-1"), {**item("VAL-2"), "verdict": "maybe"}), "assertions.1.verdict"),
    }
