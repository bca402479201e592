"""Sending the outbox (docs/FORGES.md, "Delivery"): a row is claimed by compare-and-
swap on its claim and lease before the forge is called (no transaction nor lock is held
during the request), then its answer is recorded under that claim: delivered, retried
with backoff (5xx, 429, 408, no answer; `Retry-After` honoured), or refused (any other
4xx: the reason kept on the row and on the forge, shown on the mission, until a later
delivery succeeds). A row whose claim expired (its worker died) is sent again by the
sweep (`outbox_sweep`)."""

from __future__ import annotations

import logging
import os
import random
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

from django.conf import settings
from django.db.models import Case, F, Q, QuerySet, Value, When
from django.utils import timezone

from forges.models import Forge, Outbox, OutboxKind, OutboxState, PullRequest
from forges.providers import Adapter, StatusPost, adapter_for
from forges.providers.http import Answer, send
from forges.services.arming import DELIVER
from forges.services.comment import MARKER, render
from fusion_site.repos.sources import credentials_allowed
from fusion_site.runtime.queue import send_on_commit

logger = logging.getLogger(__name__)

RETRIED = frozenset({408, 429})


@dataclass(frozen=True)
class Sent:
    answer: Answer
    what: str  # what was asked, for a refusal's reason: "status success of 1a2b3c4d5e6f"
    note: str = ""  # why no token went with it, when it did not


def _unclaimed(qs: QuerySet[Outbox], now: datetime) -> QuerySet[Outbox]:
    return qs.filter(Q(lease_until__isnull=True) | Q(lease_until__lte=now))


def due(*, now: datetime | None = None) -> list[int]:
    """The pending rows whose next attempt is due and that no live sender holds."""
    now = now or timezone.now()
    grace = timedelta(seconds=settings.FUSION_REDRIVE_GRACE)
    ready = Outbox.objects.filter(state=OutboxState.PENDING).filter(
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now - grace)
    )
    return list(_unclaimed(ready, now).order_by("id").values_list("pk", flat=True)[: settings.FUSION_FORGE_SWEEP_BATCH])


def outbox_sweep(*, now: datetime | None = None) -> list[int]:
    """Send every due row again (the recovery sweep's part: nothing is lost with a message
    or a worker); a row another message already sends is claimed once."""
    ids = due(now=now)
    for pk in ids:
        send_on_commit(DELIVER, pk)
    return ids


def claim(*, outbox_id: int, now: datetime) -> str | None:
    token = secrets.token_hex(16)
    ready = Outbox.objects.filter(pk=outbox_id, state=OutboxState.PENDING).filter(
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
    )
    claimed = _unclaimed(ready, now).update(
        claim_token=token,
        lease_until=now + timedelta(seconds=settings.FUSION_FORGE_LEASE_SECONDS),
        attempts=F("attempts") + 1,
        updated_at=now,
    )
    return token if claimed else None


def deliver(*, outbox_id: int, now: datetime | None = None) -> str:
    """Send one row if it is due and unclaimed. The outcome: delivered | retry | refused |
    superseded | deferred | skipped (not due, claimed elsewhere, or done) | lost (its claim
    expired while it was sent: the next sender's answer stands)."""
    now = now or timezone.now()
    token = claim(outbox_id=outbox_id, now=now)
    if token is None:
        return "skipped"
    row = Outbox.objects.select_related("forge").get(pk=outbox_id)
    if row.kind == OutboxKind.STATUS:
        order = _status_order(row, token, now)
        if order is not None:
            return order
    try:
        sent = _send(row)
    except Exception as exc:  # noqa: BLE001 — a fault of ours is retried with backoff, not left claimed
        logger.exception("forge delivery %s failed before an answer", row.key)
        sent = Sent(Answer(None, error=f"not sent: {type(exc).__name__}"), row.key)
    return _record(row, token, sent, now)


def _status_order(row: Outbox, token: str, now: datetime) -> str | None:
    """The statuses of one revision reach the forge in the order they were armed: an older
    one not sent yet is superseded by a newer (the forge shows the last); a newer one
    waits while an older one is being sent."""
    siblings = Outbox.objects.filter(
        forge_id=row.forge_id, kind=OutboxKind.STATUS, key__startswith=f"status:{row.payload.get('sha')}:"
    ).exclude(pk=row.pk)
    newer = siblings.filter(pk__gt=row.pk).values_list("key", flat=True).first()
    mine = Outbox.objects.filter(pk=row.pk, claim_token=token)
    if newer is not None:
        mine.update(state=OutboxState.SUPERSEDED, last_error=f"superseded by {newer}", **_released(now))
        return "superseded"
    older = siblings.filter(pk__lt=row.pk, state=OutboxState.PENDING)
    _unclaimed(older, now).update(
        state=OutboxState.SUPERSEDED, last_error=f"superseded by {row.key}", claim_token="", updated_at=now
    )
    if older.exists():  # one is being sent right now: after it
        mine.update(next_attempt_at=now + timedelta(seconds=1), attempts=F("attempts") - 1, **_released(now))
        send_on_commit(DELIVER, row.pk, delay_ms=1000)
        return "deferred"
    return None


def _released(now: datetime) -> dict:
    return {"claim_token": "", "lease_until": None, "updated_at": now}


def _token(forge: Forge) -> tuple[str, str]:
    """The API token (the workers' variable `token_env`) when FUSION_GIT_CREDENTIALS lets it
    go to the forge's API; else none, and why (a name and a URL: never a value)."""
    name = forge.token_env
    if not name:
        return "", ""
    if not credentials_allowed(name, forge.api_url):
        logger.warning(
            "forge of mission %s: %s may not be sent to %s; sent without a token", forge.mission_id, name, forge.api_url
        )
        return "", f"FUSION_GIT_CREDENTIALS does not let {name} go to {forge.api_url}: sent without a token"
    value = os.environ.get(name, "")
    return (value, "") if value else ("", f"{name} is not set on the workers: sent without a token")


def _send(row: Outbox) -> Sent:
    forge = row.forge
    adapter = adapter_for(forge.provider)
    if adapter is None:
        return Sent(Answer(400, excerpt=f"provider {forge.provider} has no API to answer on"), row.key)
    token, note = _token(forge)
    auth = adapter.auth_headers(token) if token else {}
    if row.kind == OutboxKind.STATUS:
        p = row.payload
        post = StatusPost(
            sha=p["sha"],
            state=p["state"],
            description=p.get("description", ""),
            target_url=p.get("target_url", ""),
            context=p.get("context") or forge.context,
            run_status=p.get("run_status", ""),
        )
        request = adapter.status(api_url=forge.api_url, repository=forge.repository, post=post)
        return Sent(send(request, auth=auth, token=token), f"status {post.state} of {post.sha[:12]}", note)
    return _send_comment(row, adapter, auth, token, note)


def _send_comment(row: Outbox, adapter: Adapter, auth: dict[str, str], token: str, note: str) -> Sent:
    """Edit the pull request's comment, or create it (once: the row is claimed) when it has
    none yet or a person deleted it."""
    forge = row.forge
    pull = PullRequest.objects.filter(pk=row.payload.get("pull_request"), forge_id=forge.pk).first()
    what = f"comment on #{row.payload.get('number')}"
    if pull is None:
        return Sent(Answer(404, excerpt="the pull request is no longer followed"), what)
    body = render(run_id=row.payload["run"], pull=pull)
    api_url, repository, number = forge.api_url, forge.repository, pull.number
    if not pull.comment_id and row.attempts > 1:
        pull.comment_id = _ours_already(adapter, forge, pull, auth, token)
    if pull.comment_id:
        edit = adapter.edit_comment(
            api_url=api_url, repository=repository, number=number, comment_id=pull.comment_id, body=body
        )
        answer = send(edit, auth=auth, token=token)
        if answer.status != 404:
            return Sent(answer, what, note)
    create = adapter.create_comment(api_url=api_url, repository=repository, number=number, body=body)
    answer = send(create, auth=auth, token=token)
    if answer.status is not None and 200 <= answer.status < 300 and answer.created_id:
        PullRequest.objects.filter(pk=pull.pk).update(comment_id=answer.created_id, updated_at=timezone.now())
    return Sent(answer, what, note)


def _ours_already(adapter: Adapter, forge: Forge, pull: PullRequest, auth: dict[str, str], token: str) -> str:
    """Our comment's id when an earlier attempt created it but died before recording it
    (the first page of the pull request's comments, looked up only when a creation is
    attempted again); '' when none is found."""
    listing = send(
        adapter.list_comments(api_url=forge.api_url, repository=forge.repository, number=pull.number),
        auth=auth,
        token=token,
    )
    comments = listing.body if isinstance(listing.body, list) else []
    found = next(
        (str(c["id"]) for c in comments if isinstance(c, dict) and MARKER in str(c.get("body", "")) and "id" in c), ""
    )
    if found:
        PullRequest.objects.filter(pk=pull.pk).update(comment_id=found, updated_at=timezone.now())
    return found


def _record(row: Outbox, token: str, sent: Sent, now: datetime) -> str:
    answer = sent.answer
    mine = Outbox.objects.filter(pk=row.pk, claim_token=token)
    common = {"last_status": answer.status, **_released(now)}
    if answer.status is not None and 200 <= answer.status < 300:
        # Re-armed while it was sent (a newer verdict): still pending, sent again now.
        state = Case(When(version=row.version, then=Value(OutboxState.DELIVERED)), default=Value(OutboxState.PENDING))
        if not mine.update(
            state=state, delivered_version=row.version, delivered_at=now, next_attempt_at=now, last_error="", **common
        ):
            return "lost"
        Forge.objects.filter(pk=row.forge_id).exclude(refusal="").update(refusal="", updated_at=now)
        if Outbox.objects.filter(pk=row.pk, state=OutboxState.PENDING).exists():
            send_on_commit(DELIVER, row.pk)
        return "delivered"
    reason = _reason(answer, sent)
    if answer.status is None or answer.status >= 500 or answer.status in RETRIED:
        delay = retry_delay(attempts=row.attempts, retry_after=answer.retry_after, now=now)
        updated = mine.update(next_attempt_at=now + timedelta(seconds=delay), last_error=reason, **common)
        if updated:
            send_on_commit(DELIVER, row.pk, delay_ms=int(delay * 1000))
        logger.info("forge delivery %s: %s; again in %.0f s", row.key, reason, delay)
        return "retry" if updated else "lost"
    state = Case(When(version=row.version, then=Value(OutboxState.REFUSED)), default=Value(OutboxState.PENDING))
    if not mine.update(state=state, last_error=reason, **common):
        return "lost"
    Forge.objects.filter(pk=row.forge_id).update(refusal=f"{sent.what}: {reason}"[:2000], updated_at=now)
    logger.warning("forge delivery %s refused: %s", row.key, reason)
    return "refused"


def _reason(answer: Answer, sent: Sent) -> str:
    said = f"HTTP {answer.status}" if answer.status is not None else answer.error
    if answer.excerpt:
        said += f": {answer.excerpt}"
    return f"{said} ({sent.note})" if sent.note else said


def retry_delay(*, attempts: int, retry_after: str = "", now: datetime) -> float:
    """Seconds until the next attempt: the forge's `Retry-After` (seconds or an HTTP date),
    capped by FUSION_FORGE_RETRY_AFTER_MAX; else exponential from FUSION_FORGE_RETRY_BASE
    to FUSION_FORGE_RETRY_MAX, with jitter (between half and all of it)."""
    asked = parse_retry_after(retry_after, now)
    if asked is not None:
        return min(max(asked, 0.0), settings.FUSION_FORGE_RETRY_AFTER_MAX)
    ceiling = min(
        settings.FUSION_FORGE_RETRY_MAX, settings.FUSION_FORGE_RETRY_BASE * 2 ** min(max(attempts - 1, 0), 30)
    )
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 — jitter, not a secret


def parse_retry_after(value: str, now: datetime) -> float | None:
    value = (value or "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return (when - now).total_seconds()


def outbox_retry(*, outbox_ids: list[int]) -> int:
    """Send refused or pending rows again now (a person fixed the token or the repository):
    the count armed. A row being sent keeps its claim; a delivered row stays delivered."""
    now = timezone.now()
    rows = Outbox.objects.filter(pk__in=outbox_ids, state__in=[OutboxState.PENDING, OutboxState.REFUSED])
    ids = list(rows.values_list("pk", flat=True))
    armed = Outbox.objects.filter(pk__in=ids).update(state=OutboxState.PENDING, next_attempt_at=now, updated_at=now)
    for pk in ids:
        send_on_commit(DELIVER, pk)
    return armed
