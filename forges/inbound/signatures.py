"""What each provider sends to prove a request is its own, and to name it.

GitHub and the generic form sign the body with HMAC-SHA256 (`X-Hub-Signature-256:
sha256=<hex>`), Gitea and Forgejo too (`X-Gitea-Signature` or `X-Forgejo-Signature`:
`<hex>`), GitLab sends the secret itself (`X-Gitlab-Token`). Every comparison is
`hmac.compare_digest`: its time does not tell how much of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from forges.models import Provider

# The header naming a delivery, by provider; the generic form names it in its body.
DELIVERY_HEADERS = {
    Provider.GITHUB: ("X-GitHub-Delivery",),
    Provider.GITEA: ("X-Gitea-Delivery", "X-Forgejo-Delivery"),
    Provider.GITLAB: ("X-Gitlab-Event-UUID",),
}
EVENT_HEADERS = {
    Provider.GITHUB: ("X-GitHub-Event",),
    Provider.GITEA: ("X-Gitea-Event", "X-Forgejo-Event"),
    Provider.GITLAB: ("X-Gitlab-Event",),
}
_HEX_SIGNATURE = {
    Provider.GITHUB: ("X-Hub-Signature-256", "sha256="),
    Provider.GENERIC: ("X-Hub-Signature-256", "sha256="),
}
_GITEA_SIGNATURES = ("X-Gitea-Signature", "X-Forgejo-Signature")
MAX_ID_CHARS = 200


def _header(headers: Mapping[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        value = headers.get(name)
        if value:
            return value.strip()
    return ""


def hmac_hex(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_ok(*, provider: str, secret: str, headers: Mapping[str, str], body: bytes) -> bool:
    """Whether the request carries `secret`'s signature of `body` (or, from GitLab, the
    secret itself). A missing header is a wrong one."""
    if provider == Provider.GITLAB:
        given = _header(headers, ("X-Gitlab-Token",))
        return bool(given) and hmac.compare_digest(given.encode(), secret.encode())
    if provider == Provider.GITEA:
        given, prefix = _header(headers, _GITEA_SIGNATURES), ""
    else:
        name, prefix = _HEX_SIGNATURE[Provider(provider)]
        given = _header(headers, (name,))
    if not given.startswith(prefix):
        return False
    expected = prefix + hmac_hex(secret, body)
    return hmac.compare_digest(given.lower().encode(), expected.encode())


def delivery_id(*, provider: str, headers: Mapping[str, str], payload: Any, body: bytes) -> str:
    """The forge's id of this delivery; without one, the sha256 of the body (the same
    body delivered again is the same delivery)."""
    if provider == Provider.GENERIC:
        given = payload.get("delivery") if isinstance(payload, dict) else None
        given = str(given).strip() if isinstance(given, (str, int)) else ""
    else:
        given = _header(headers, DELIVERY_HEADERS[Provider(provider)])
    return given[:MAX_ID_CHARS] if given else "sha256:" + hashlib.sha256(body).hexdigest()


def event_name(*, provider: str, headers: Mapping[str, str], payload: Any) -> str:
    if provider == Provider.GENERIC:
        given = payload.get("event") if isinstance(payload, dict) else None
        return given[:60] if isinstance(given, str) else ""
    return _header(headers, EVENT_HEADERS[Provider(provider)])[:60]
