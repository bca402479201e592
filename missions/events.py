"""The only module that publishes live events and writes the mission audit log.

`publish_on_commit` sends nothing until the surrounding transaction commits; then the
event goes to django-eventstream (stored, so a reconnecting EventSource replays it from
Last-Event-ID) on `mission-<id>` and `missions`, and to the mission's Channels group for
WebSocket clients with the same JSON and the stored event id.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import F

from missions.models import Mission, MissionEvent

logger = logging.getLogger(__name__)

GLOBAL_CHANNEL = "missions"
# Events that also go to the global channel that feeds mission lists.
GLOBAL_TYPES = frozenset({"mission:updated", "feature:updated", "validator-run:completed", "milestone:validation:updated"})


def mission_channel(mission_id: int) -> str:
    return f"mission-{mission_id}"


def group_name(mission_id: int) -> str:
    return f"mission-{mission_id}"


def lock_mission(mission_id: int) -> None:
    """Take the mission's row lock first. Every event takes it (the `seq` counter), so
    a transaction that will also lock features or tasks must take it before them: one
    lock order everywhere, no deadlock between the autopilot and the loop. SQLite's
    IMMEDIATE transactions serialize writers already; there this is a no-op."""
    list(Mission.objects.select_for_update().filter(pk=mission_id).values_list("pk", flat=True))


def publish_on_commit(
    mission: Mission | int, type: str, payload: dict[str, Any], *, actor_id: int | None = None
) -> MissionEvent:
    """Append the audit row now (it rolls back with the transaction) and send the live
    event only after commit. The row's `seq` travels with the event so that clients can
    tell gaps and the WebSocket carries the same id as the audit log."""
    mission_id = mission if isinstance(mission, int) else mission.pk
    with transaction.atomic():
        Mission.objects.filter(pk=mission_id).update(event_seq=F("event_seq") + 1)
        seq = Mission.objects.filter(pk=mission_id).values_list("event_seq", flat=True).get()
        event = MissionEvent.objects.create(mission_id=mission_id, seq=seq, type=type, payload=payload, actor_id=actor_id)
    data = {"type": type, "mission": mission_id, "seq": seq, **payload}
    transaction.on_commit(lambda: _send(mission_id, type, data))
    return event


def _send(mission_id: int, type: str, data: dict[str, Any]) -> None:
    # A failing transport must never undo or break the committed business change:
    # the database is the source of truth and clients reload their state on reset.
    from django_eventstream import send_event

    try:
        send_event(mission_channel(mission_id), type, data)
        if type in GLOBAL_TYPES:
            send_event(GLOBAL_CHANNEL, type, data)
    except Exception:  # noqa: BLE001
        logger.exception("eventstream delivery failed for %s", type)
    _send_group(mission_id, type, data)


def _send_group(mission_id: int, type: str, data: dict[str, Any]) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "mission.event", "event": type, "data": data, "id": data["seq"]}
    try:
        async_to_sync(layer.group_send)(group_name(mission_id), message)
    except Exception:  # noqa: BLE001
        logger.exception("channel layer delivery failed for %s", type)
