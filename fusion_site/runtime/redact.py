"""Secret redaction for anything shown to people or models: evidence, events, fix
descriptions, journal views."""

from __future__ import annotations

import os
import re

REDACTED = "[REDACTED]"
PATTERNS = [
    re.compile(
        r"(?i)\b(api[_-]?key|secret|token|password|passwd|authorization)\b(\s*[:=]\s*|\s+)(['\"]?)[^\s'\"]{6,}\3"
    ),
    # Compound names (DB_PASSWORD=…, db_password: …, "client_secret": "…"): `\b` does not
    # separate `_` from a word, so the pattern above never sees them.
    re.compile(
        r"(?i)\b([\w.-]*(?:api[_-]?key|secret|token|password|passwd|pwd|credentials?)[\w.-]*)"
        r"(['\"]?\s*[:=]\s*)(['\"]?)[^\s'\",}]{6,}\3"
    ),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}\b"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bxox[abpr]-[A-Za-z0-9-]{10,}\b"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"(?i)\b(postgres(?:ql)?|mysql|redis|amqp)://[^\s:/@]+:[^\s@/]+@"),
]
SECRET_ENV_HINTS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "DATABASE_URL", "REDIS_URL")
# One search per variable name; a loop over the hints per name was most of the cost.
_SECRET_NAME = re.compile("|".join(map(re.escape, SECRET_ENV_HINTS)), re.IGNORECASE)
# The secrets of the environment as it was last read, by a copy of its raw items. The
# environment is compared on every call (a secret set later is redacted too), but a
# comparison of raw items is C work, where reading `os.environ` decodes every variable in
# Python: about four thousand calls per judged feature.
_seen: tuple[tuple[object, ...] | None, list[str]] = (None, [])


def _env_secrets() -> list[str]:
    global _seen
    raw = getattr(os.environ, "_data", None)  # CPython's mapping of the encoded variables
    snapshot = tuple(raw.items()) if isinstance(raw, dict) else None
    seen_snapshot, secrets = _seen
    if snapshot is None or snapshot != seen_snapshot:
        secrets = [value for name, value in os.environ.items() if len(value) >= 8 and _SECRET_NAME.search(name)]
        _seen = (snapshot, secrets)
    return secrets


def redact(text: str) -> str:
    if not text:
        return text
    for value in _env_secrets():
        text = text.replace(value, REDACTED)
    for pattern in PATTERNS:
        text = pattern.sub(_replacement, text)
    return text


def _replacement(match: re.Match) -> str:
    if match.re.groups >= 2 and match.group(2) is not None:
        return f"{match.group(1)}{match.group(2)}{REDACTED}"
    return REDACTED


def bounded(text: str, limit: int = 4000) -> str:
    text = redact(text or "")
    return text if len(text) <= limit else text[: limit - 20] + "\n[… truncated]"
