"""One request to a forge's API: bounded in time (FUSION_FORGE_TIMEOUT) and in what is
read of the answer (FUSION_FORGE_MAX_RESPONSE_BYTES), and never a secret in what it
returns (the token's value and the product's redaction patterns are scrubbed from the
answer's excerpt)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx2
from django.conf import settings

from forges.providers.base import ForgeRequest
from fusion_site.runtime.redact import REDACTED, redact

logger = logging.getLogger(__name__)

EXCERPT = 500


@dataclass(frozen=True)
class Answer:
    """What the forge answered: `status` None when nothing came back (`error` says why)."""

    status: int | None
    body: Any = None
    excerpt: str = ""
    retry_after: str = ""
    error: str = ""

    @property
    def created_id(self) -> str:
        """The id of what the request created (a comment's, a note's)."""
        value = self.body.get("id") if isinstance(self.body, dict) else None
        return str(value) if value is not None else ""


def scrub(text: str, token: str) -> str:
    if token:
        text = text.replace(token, REDACTED)
    return redact(text)


def send(request: ForgeRequest, *, auth: dict[str, str], token: str = "") -> Answer:
    """Send `request` with the `auth` headers (the token's: never logged, never returned)."""
    limit = settings.FUSION_FORGE_MAX_RESPONSE_BYTES
    headers = {"User-Agent": "fusion-missions", **request.headers, **auth}
    try:
        with (
            httpx2.Client(timeout=settings.FUSION_FORGE_TIMEOUT, follow_redirects=False) as client,
            client.stream(request.method, request.url, json=request.json, headers=headers) as response,
        ):
            raw = _read_capped(response, limit)
            status, retry_after = response.status_code, response.headers.get("Retry-After", "")
    except httpx2.TimeoutException as exc:
        return Answer(None, error=f"timeout: {type(exc).__name__}")
    except httpx2.HTTPError as exc:  # refused connection, reset, protocol error…
        return Answer(None, error=scrub(f"network error: {type(exc).__name__}: {exc}", token)[:EXCERPT])
    text = raw.decode("utf-8", errors="replace")
    try:
        body = json.loads(text) if text.strip() else None
    except ValueError:
        body = None
    return Answer(status, body=body, excerpt=scrub(text[:EXCERPT], token), retry_after=retry_after)


def _read_capped(response: httpx2.Response, limit: int) -> bytes:
    """At most `limit` bytes of the answer; a longer one is cut (the rest never read)."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            logger.info("forge answer cut at %d bytes (%s %s)", limit, response.request.method, response.url.path)
            break
    return b"".join(chunks)[:limit]
