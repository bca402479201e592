"""The review request (seed `fusion_validate`): a closed body, validated and normalized.

Rules, in the order they are applied:
1. the body must be a JSON object;
2. a body with a `prompt` key is the legacy shape: it is refused first, alone, with an
   error that shows the new shape;
3. every other problem is collected (unknown keys, missing keys, wrong types, blank
   strings, empty required arrays, size caps, the verification cross-field rule) and
   reported at once, each under its path (`scope[2]`, `verification.evidence[0].check`).

Normalization trims every string, fills omitted optional arrays with `[]`, and writes
verification as `{status, evidence}` (provided) or `{status, evidence: [], reason}`
(not_run). Keys come out in one fixed order; the canonical form is RFC 8785 anyway.
"""

from __future__ import annotations

from typing import Any

from missions.errors import Invalid
from validation.journal import canonical, sha256_of

MAX_STRING = 20_000
MAX_ITEMS = 100
MAX_CANONICAL_BYTES = 256 * 1024
MAX_REVISION = 80
MAX_ID = 2**63 - 1

CORE_KEYS = (
    "objective",
    "background",
    "changeSummary",
    "scope",
    "acceptanceCriteria",
    "verification",
    "knownLimitations",
    "exclusions",
)
REFERENCE_KEYS = ("mission", "feature", "revision")
ALLOWED_KEYS = frozenset(CORE_KEYS + REFERENCE_KEYS)
STATUSES = ("provided", "not_run")

EXPECTED_SHAPE: dict[str, Any] = {
    "objective": "What the change is meant to achieve (non-empty string).",
    "background": ["Context a reviewer needs (strings; may be empty)."],
    "changeSummary": "What was changed (non-empty string).",
    "scope": ["What to review: paths, modules or behaviours (at least one)."],
    "acceptanceCriteria": ["What must hold for the change to be right (at least one)."],
    "verification": {"status": "provided", "evidence": [{"check": "pytest -q", "outcome": "41 passed"}]},
    "knownLimitations": ["Optional."],
    "exclusions": ["Optional: what not to review."],
}
NOT_RUN_EXAMPLE = {"status": "not_run", "reason": "Why nothing was verified."}


class ReviewRequestInvalid(Invalid):
    code = "invalid_review_request"


class LegacyPromptRequest(Invalid):
    code = "legacy_prompt_request"


def legacy_prompt_error() -> LegacyPromptRequest:
    return LegacyPromptRequest(
        "The {prompt} request shape is no longer accepted: send the structured review request instead, "
        "{objective, background[], changeSummary, scope[], acceptanceCriteria[], "
        "verification {status: provided|not_run, evidence[{check, outcome}] | reason}, knownLimitations[], "
        "exclusions[]}. Put the goal in objective, the change in changeSummary and what to look at in scope.",
        fields={"prompt": ["no longer accepted; use the shape in expected_shape"]},
        extra={"expected_shape": EXPECTED_SHAPE, "verification_not_run_example": NOT_RUN_EXAMPLE},
    )


class _Errors:
    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def as_fields(self) -> dict[str, list[str]]:
        fields: dict[str, list[str]] = {}
        for path, message in self.items:
            fields.setdefault(path, []).append(message)
        return fields


def _string(value: Any, path: str, errors: _Errors) -> str | None:
    if not isinstance(value, str):
        errors.add(path, "must be a string")
        return None
    text = value.strip()
    if not text:
        errors.add(path, "must not be blank")
        return None
    if "\x00" in text:
        errors.add(path, "must not contain NUL characters")
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        errors.add(path, "must be valid Unicode text (no lone surrogates)")
        return None
    if len(text) > MAX_STRING:
        errors.add(path, f"must be at most {MAX_STRING} characters")
        return None
    return text


def _strings(value: Any, path: str, errors: _Errors, *, min_items: int = 0) -> list[str] | None:
    if not isinstance(value, list):
        errors.add(path, "must be an array of strings")
        return None
    if len(value) < min_items:
        errors.add(path, "must have at least one item")
        return None
    if len(value) > MAX_ITEMS:
        errors.add(path, f"must have at most {MAX_ITEMS} items")
        return None
    out = [_string(item, f"{path}[{i}]", errors) for i, item in enumerate(value)]
    return None if any(item is None for item in out) else out  # type: ignore[return-value]


def _unknown(body: dict, allowed, prefix: str, errors: _Errors) -> None:
    for key in sorted(k for k in body if k not in allowed):
        errors.add(f"{prefix}{key}", "unknown field")


def _evidence(value: Any, errors: _Errors) -> list[dict[str, str]] | None:
    path = "verification.evidence"
    if not isinstance(value, list):
        errors.add(path, "must be an array of {check, outcome} objects")
        return None
    if len(value) > MAX_ITEMS:
        errors.add(path, f"must have at most {MAX_ITEMS} items")
        return None
    out: list[dict[str, str]] = []
    ok = True
    for i, item in enumerate(value):
        item_path = f"{path}[{i}]"
        if not isinstance(item, dict):
            errors.add(item_path, "must be an object with check and outcome")
            ok = False
            continue
        _unknown(item, ("check", "outcome"), f"{item_path}.", errors)
        entry: dict[str, str] = {}
        for key in ("check", "outcome"):
            if key not in item:
                errors.add(f"{item_path}.{key}", "is required")
                ok = False
                continue
            text = _string(item[key], f"{item_path}.{key}", errors)
            ok = ok and text is not None
            if text is not None:
                entry[key] = text
        out.append(entry)
    return out if ok else None


def _verification(value: Any, errors: _Errors) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        errors.add("verification", "must be an object with status and evidence or reason")
        return None
    before = len(errors.items)
    _unknown(value, ("status", "evidence", "reason"), "verification.", errors)
    status = value.get("status")
    if "status" not in value:
        errors.add("verification.status", "is required")
    elif status not in STATUSES:
        errors.add("verification.status", "must be 'provided' or 'not_run'")
        status = None
    evidence = _evidence(value["evidence"], errors) if "evidence" in value else []
    reason = _string(value["reason"], "verification.reason", errors) if "reason" in value else None
    if status == "provided":
        if "evidence" in value and evidence is not None and not evidence:
            errors.add("verification.evidence", "must not be empty when status is 'provided'")
        elif "evidence" not in value:
            errors.add("verification.evidence", "is required when status is 'provided'")
        if "reason" in value:
            errors.add("verification.reason", "is not allowed when status is 'provided'")
    elif status == "not_run":
        if "reason" not in value:
            errors.add("verification.reason", "is required when status is 'not_run'")
        if isinstance(value.get("evidence"), list) and value["evidence"]:
            errors.add("verification.evidence", "must be empty when status is 'not_run'")
    if len(errors.items) > before:
        return None
    if status == "provided":
        return {"status": "provided", "evidence": evidence}
    return {"status": "not_run", "evidence": [], "reason": reason}


def _reference(key: str, value: Any, errors: _Errors) -> Any:
    if key == "revision":
        text = _string(value, key, errors)
        if text is not None and (len(text) > MAX_REVISION or text.startswith("-") or any(c.isspace() for c in text)):
            errors.add(key, f"must be a commit-ish without spaces, at most {MAX_REVISION} characters")
            return None
        return text
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        errors.add(key, "must be an id (integer) or a key (string)")
        return None
    if isinstance(value, int):
        if not 1 <= value <= MAX_ID:
            errors.add(key, "must be a positive id")
            return None
        return value
    return _string(value, key, errors)


def normalize_request(body: Any) -> dict[str, Any]:
    """Validate and normalize a review request; raise with every problem at once."""
    if not isinstance(body, dict):
        raise ReviewRequestInvalid("the review request must be a JSON object", fields={"": ["must be a JSON object"]})
    if "prompt" in body:
        raise legacy_prompt_error()
    errors = _Errors()
    _unknown(body, ALLOWED_KEYS, "", errors)
    out: dict[str, Any] = {}
    for key in ("objective", "changeSummary"):
        if key not in body:
            errors.add(key, "is required")
        else:
            out[key] = _string(body[key], key, errors)
    for key, minimum in (("background", 0), ("scope", 1), ("acceptanceCriteria", 1)):
        if key not in body:
            errors.add(key, "is required")
        else:
            out[key] = _strings(body[key], key, errors, min_items=minimum)
    if "verification" not in body:
        errors.add("verification", "is required")
    else:
        out["verification"] = _verification(body["verification"], errors)
    for key in ("knownLimitations", "exclusions"):
        out[key] = _strings(body[key], key, errors) if key in body else []
    for key in REFERENCE_KEYS:
        if key in body:
            out[key] = _reference(key, body[key], errors)
    if errors.items:
        raise _invalid(errors)
    ordered = {key: out[key] for key in (*CORE_KEYS, *REFERENCE_KEYS) if key in out}
    if len(canonical(ordered)) > MAX_CANONICAL_BYTES:
        raise ReviewRequestInvalid(
            f"the review request is larger than {MAX_CANONICAL_BYTES} bytes",
            code="review_request_too_large",
            fields={"": ["too large"]},
        )
    return ordered


def _invalid(errors: _Errors) -> ReviewRequestInvalid:
    listed = "; ".join(f"{path}: {message}" for path, message in errors.items)
    return ReviewRequestInvalid(
        f"the review request is invalid: {listed}",
        fields=errors.as_fields(),
        extra={"errors": [{"path": p, "message": m} for p, m in errors.items]},
    )


def review_subject(request: dict[str, Any]) -> dict[str, Any]:
    """What the reviewers are asked about: the normalized core fields only."""
    return {key: request[key] for key in CORE_KEYS}


def canonical_text(value: Any) -> str:
    return canonical(value).decode("utf-8")


def request_digest(request: dict[str, Any]) -> tuple[str, str]:
    """(RFC 8785 canonical JSON, its sha256)."""
    return canonical_text(request), sha256_of(request)
