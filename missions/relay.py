"""The relay behind `missions.outbox`' on-commit fast path: the audit log (`MissionEvent`)
is the outbox, and a committed event that the event stream's storage does not hold (its
process died before the on-commit send, or the transport failed) is sent again by the
recovery sweep (docs/RELIABILITY.md)."""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta

from django.utils import timezone
from django_eventstream.models import Event

from missions.delivery import mission_channel, send_all
from missions.models import MissionEvent

logger = logging.getLogger(__name__)

# The `seq` of a stored stream event, read without decoding it: every event's data begins
# `{"type": …, "mission": …, "seq": N` (`publish_on_commit`), encoded once or, stored by
# `send_event`, twice (the quotes then escaped). A sweep reads every event of the last hour:
# two JSON decodes each cost it seconds on a busy service.
_SEQ = re.compile(r'^"?\{\\?"type\\?": \\?"[^"\\]*\\?", \\?"mission\\?": \d+, \\?"seq\\?": (\d+)[,}]')


def _streamed_seq(raw: str) -> int | None:
    match = _SEQ.match(raw)
    if match is not None:
        return int(match.group(1))
    try:  # another shape (written by another release): decode it
        value = json.loads(raw)
        if isinstance(value, str):  # send_event encodes the payload, the storage encodes that string again
            value = json.loads(value)
        return int(value["seq"])
    except (ValueError, TypeError, KeyError):
        return None


def redeliver_missing(*, grace_seconds: float, window_minutes: int = 60) -> list[tuple[int, int]]:
    """The relay behind the on-commit fast path: re-send every audit event of the last
    `window_minutes` that the event stream's storage does not hold (the process that
    committed it died before its on-commit send, or the transport failed). Events younger
    than `grace_seconds` are left to their own sender. Returns [(mission id, seq)].

    The MissionEvent table is the outbox: a re-sent event carries its original `seq` (it
    may arrive after later events; clients order and de-duplicate by `seq`)."""

    now = timezone.now()
    recorded = list(
        MissionEvent.objects.filter(
            created_at__gte=now - timedelta(minutes=window_minutes),
            created_at__lt=now - timedelta(seconds=grace_seconds),
        )
        .order_by("mission_id", "seq")
        .values("mission_id", "seq", "type", "payload")
    )
    if not recorded:
        return []
    oldest = now - timedelta(minutes=window_minutes + 5)
    channels = {mission_channel(row["mission_id"]) for row in recorded}
    streamed: set[tuple[str, int]] = set()
    for channel, raw in (
        Event.objects.filter(channel__in=channels, created__gte=oldest).exclude(type="").values_list("channel", "data")
    ):
        seq = _streamed_seq(raw)
        if seq is not None:
            streamed.add((channel, seq))
    resent = []
    for row in recorded:
        if (mission_channel(row["mission_id"]), row["seq"]) in streamed:
            continue
        data = {"type": row["type"], "mission": row["mission_id"], "seq": row["seq"], **(row["payload"] or {})}
        send_all([(row["mission_id"], row["type"], data)])
        resent.append((row["mission_id"], row["seq"]))
    if resent:
        logger.warning("re-sent %d recorded events the stream had lost", len(resent))
    return resent
