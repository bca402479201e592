"""A webhook request's steps, in the order that lets nothing unverified be read: the
mission's forge, the body's size, the signature, then the body as JSON, the replay and the
record. Each refusal is a `Delivery` in state `rejected` with its reason (when the mission
exists); its body is never stored, and its delivery id never held (a forged request cannot
burn a real one). A verified delivery is stored `received` and processed by a worker
after commit (`process_delivery`): the forge gets its answer before any git work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from forges.inbound.signatures import delivery_id, event_name, signature_ok
from forges.models import Delivery, DeliveryState, Forge, Provider
from fusion_site.runtime.queue import send_on_commit
from missions.models import Mission

PROCESS_ACTOR = "process_delivery"
_NO_HOOK = "no such hook"


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


@dataclass
class Answer:
    status: int
    body: dict[str, Any] = field(default_factory=dict)


class _Refused(Exception):
    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.code, self.reason = status, code, reason


def hook_secret(forge: Forge) -> str:
    """The forge's own secret, or the deployment's; empty when neither is set."""
    return forge.secret or settings.FUSION_FORGE_WEBHOOK_SECRET


def max_bytes() -> int:
    return int(settings.FUSION_FORGE_HOOK_MAX_BYTES)


def delivery_receive(
    *, provider: str, mission_key: str, headers: Mapping[str, str], stream: Readable, content_length: int | None
) -> Answer:
    """Verify, record and queue one webhook request; the answer the forge is given."""
    mission = Mission.objects.filter(key=mission_key).first()
    if mission is None:
        return Answer(404, {"code": "not_found", "detail": _NO_HOOK})
    try:
        forge = _forge_of(mission, provider)
        body = _bounded_body(stream, content_length)
        _verify(forge, headers, body)
        payload = _parsed(body)
    except _Refused as refused:
        _reject(mission, provider, headers, refused.reason)
        # A caller without the secret learns nothing of the mission's forge from a 404.
        detail = _NO_HOOK if refused.status == 404 else refused.reason
        return Answer(refused.status, {"code": refused.code, "detail": detail})
    return _record(mission, provider, headers, body, payload)


def _forge_of(mission: Mission, provider: str) -> Forge:
    forge = Forge.objects.filter(mission=mission).first()
    if provider not in Provider.values:
        raise _Refused(404, "not_found", f"no provider {provider[:40]}")
    if forge is None:
        raise _Refused(404, "not_found", "the mission follows no forge")
    if forge.provider != provider:
        raise _Refused(404, "not_found", f"the mission's forge is {forge.provider}, not {provider}")
    return forge


def _bounded_body(stream: Readable, content_length: int | None) -> bytes:
    """At most the limit and one byte more is read: a body that claims or turns out to be
    larger is refused without reading the rest."""
    limit = max_bytes()
    too_large = _Refused(413, "body_too_large", f"the body is larger than {limit} bytes")
    if content_length is not None and content_length > limit:
        raise too_large
    body = stream.read(limit + 1)
    if len(body) > limit:
        raise too_large
    return body


def _verify(forge: Forge, headers: Mapping[str, str], body: bytes) -> None:
    secret = hook_secret(forge)
    if not secret:
        raise _Refused(403, "no_secret", "neither the forge nor the deployment has a webhook secret")
    if not signature_ok(provider=forge.provider, secret=secret, headers=headers, body=body):
        raise _Refused(401, "bad_signature", "the signature is missing or wrong")


def _parsed(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except ValueError:
        raise _Refused(400, "bad_payload", "the body is not JSON") from None
    if not isinstance(payload, dict):
        raise _Refused(400, "bad_payload", "the body is not a JSON object")
    return payload


def _reject(mission: Mission, provider: str, headers: Mapping[str, str], reason: str) -> None:
    # The event name of a header only: an unverified body is never read.
    known = provider in Provider.values
    Delivery.objects.create(
        mission=mission,
        provider=provider[:16],
        event=event_name(provider=provider, headers=headers, payload=None) if known else "",
        state=DeliveryState.REJECTED,
        reason=reason,
        processed_at=timezone.now(),
    )


def _record(mission: Mission, provider: str, headers: Mapping[str, str], body: bytes, payload: dict) -> Answer:
    event = event_name(provider=provider, headers=headers, payload=payload)
    ping = provider == Provider.GITHUB and event == "ping"
    row = Delivery(
        mission=mission,
        provider=provider,
        delivery_id=delivery_id(provider=provider, headers=headers, payload=payload, body=body),
        event=event,
        payload=payload,
    )
    if ping:  # GitHub's hello when a hook is made: answered now, nothing to match
        row.state, row.reason, row.processed_at = DeliveryState.IGNORED, "ping", timezone.now()
    try:
        with transaction.atomic():
            row.save()
            if not ping:
                send_on_commit(PROCESS_ACTOR, row.pk)
    except IntegrityError:
        # The unique constraint on (mission, provider, delivery id) of verified deliveries:
        # the same delivery again, however many arrive at once, is recorded once.
        return Answer(200, {"status": "duplicate"})
    if ping:
        return Answer(200, {"status": "ignored", "delivery": row.pk})
    return Answer(202, {"status": "queued", "delivery": row.pk})
