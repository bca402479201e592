"""The mission audit log's rows (`MissionEvent`), each with the mission's next `seq`.

`missions.outbox.publish_on_commit` is the only caller: it writes a row here and sends
the live event after commit. The `seq` is counted on the mission's row, under its lock,
so a mission's events are numbered without gaps in the order their transactions commit.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from missions import fastpaths
from missions.models import MissionEvent


def new(mission_id: int, type: str, payload: dict[str, Any], actor_id: int | None) -> MissionEvent:
    """An audit row stamped now, unsaved: its `seq` is given when it is written."""
    now = timezone.now()
    return MissionEvent(
        mission_id=mission_id, type=type, payload=payload, actor_id=actor_id, created_at=now, updated_at=now
    )


def append(mission_id: int, type: str, payload: dict[str, Any], actor_id: int | None) -> MissionEvent:
    """The audit row, with the mission's next `seq`, written now."""
    return append_many(mission_id, [new(mission_id, type, payload, actor_id)])[0]


def append_many(mission_id: int, events: list[MissionEvent]) -> list[MissionEvent]:
    """The unsaved audit rows of one mission, given its next `seq`s in their order, written
    now: one statement on PostgreSQL however many there are (a loop step publishes up to
    five events; `missions.outbox.published_together`)."""
    if not events:
        return events
    fastpaths.audit_insert(mission_id=mission_id, events=events)
    return events
