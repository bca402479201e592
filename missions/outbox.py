"""The only module that publishes live events and writes the mission audit log.

`publish_on_commit` writes the audit row now (it rolls back with the transaction) and
sends nothing until the surrounding transaction commits; then the event goes out through
`missions.delivery.send_all`: to django-eventstream (stored, so a reconnecting
EventSource replays it from Last-Event-ID) on `mission-<id>` and `missions`, and to the
mission's Channels group for WebSocket clients, with the same JSON and the stored event
id. Every event is checked against its declared payload (`missions.event_catalogue`).

How an event follows its transaction without reading Django's internals: each one has
an on-commit callback (`_Ticket`) that Django keeps exactly as long as the event stands
(dropped at rollback, and with a savepoint rolled back). At commit the first ticket to
run sends its event with every later one of the connection's still standing: the events
of one commit go out together, their stream rows in one write, their group sends in one
hop (a loop step publishes two to six).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from django.db import transaction

from missions import audit, delivery, event_catalogue
from missions.models import Mission, MissionEvent

# The connection attributes holding this module's state: the tickets not yet sent, and
# the events of an open `published_together` block.
_QUEUE = "fusion_outbox"
_PENDING = "fusion_published_together"


class _Ticket:
    """One event's on-commit callback: when it runs, its transaction has committed."""

    __slots__ = ("event", "queue", "sent", "__weakref__")

    def __init__(self, event: tuple[int, str, dict[str, Any]], queue: list[weakref.ref[_Ticket]]):
        self.event = event  # (mission id, type, data)
        self.queue = queue
        self.sent = False

    def __call__(self) -> None:
        if self.sent:
            return
        # Later tickets still standing belong to this commit (or to one made by its own
        # callbacks, committed too): never before their commit, never after what follows.
        # Earlier ones standing are of a transaction still open (a test's): left alone.
        here = next(i for i, ref in enumerate(self.queue) if ref() is self)
        batch = [ticket for ref in self.queue[here:] if (ticket := ref()) is not None and not ticket.sent]
        for ticket in batch:
            ticket.sent = True
        self.queue[:] = [ref for ref in self.queue if (ticket := ref()) is not None and not ticket.sent]
        delivery.send_all([ticket.event for ticket in batch])


def publish_on_commit(
    mission: Mission | int, type: str, payload: dict[str, Any], *, actor_id: int | None = None
) -> MissionEvent:
    """Append the audit row now (it rolls back with the transaction) and send the live
    event only after commit. The row's `seq` travels with the event so that clients can
    tell gaps and the WebSocket carries the same id as the audit log. Inside
    `published_together`, the row is written at the end of that block: the event returned
    has its `seq` only then. `type` and `payload` must match the catalogue
    (`missions.event_catalogue.check_event`)."""
    event_catalogue.check_event(type, payload)
    mission_id = mission if isinstance(mission, int) else mission.pk
    pending = _pending(transaction.get_connection(MissionEvent.objects.db))
    if pending is not None:
        event = audit.new(mission_id, type, payload, actor_id)
        data = {"type": type, "mission": mission_id, "seq": None, **payload}
        pending.append((event, data, weakref.ref(_send_on_commit(mission_id, type, data))))
        return event
    # No savepoint of its own (two statements fewer per event, on every hop of the loop):
    # a failure here fails the caller's transaction, which is what it would do anyway.
    with transaction.atomic(savepoint=False):
        event = audit.append(mission_id, type, payload, actor_id)
    _send_on_commit(mission_id, type, {"type": type, "mission": mission_id, "seq": event.seq, **payload})
    return event


_Pending = list[tuple[MissionEvent, dict[str, Any], weakref.ref[_Ticket]]]


def _pending(connection: Any) -> _Pending | None:
    return getattr(connection, _PENDING, None) if connection.in_atomic_block else None


@contextlib.contextmanager
def published_together() -> Iterator[None]:
    """The audit rows of the events published in this block (inside a transaction) are
    written together when it ends: one statement per mission instead of one per event (a
    loop step publishes up to five, each a round trip under the mission's lock).

    Use it inside the transaction, around the whole body of an atomic service, so that an
    exception leaving the block also rolls that transaction (or its savepoint) back with
    the events. A block that locks other rows must take the mission's lock before them
    (`missions.locks.lock_mission`), as every service does: its rows' counter, which takes
    the mission's row too, comes at the end. An event published in a savepoint rolled back
    inside the block is dropped with its live send. Outside a transaction, or inside
    another such block, it changes nothing."""
    connection = transaction.get_connection(MissionEvent.objects.db)
    if not connection.in_atomic_block or _pending(connection) is not None:
        yield
        return
    pending: _Pending = []
    setattr(connection, _PENDING, pending)
    try:
        yield
    finally:
        setattr(connection, _PENDING, None)
    _write_pending(pending)


def _write_pending(pending: _Pending) -> None:
    # Still to be sent: a ticket Django dropped went with a savepoint rolled back.
    by_mission: dict[int, list[tuple[MissionEvent, dict[str, Any]]]] = {}
    for event, data, ticket in pending:
        if ticket() is not None:
            by_mission.setdefault(event.mission_id, []).append((event, data))
    for mission_id, items in by_mission.items():
        audit.append_many(mission_id, [event for event, _data in items])
        for event, data in items:
            if "seq" not in event.payload:  # as `{"seq": …, **payload}` has it
                data["seq"] = event.seq


def _send_on_commit(mission_id: int, type: str, data: dict[str, Any]) -> _Ticket:
    """The event's ticket, queued on the connection and given to Django as an on-commit
    callback (outside a transaction Django runs it at once)."""
    connection = transaction.get_connection(Mission.objects.db)
    queue: list[weakref.ref[_Ticket]] | None = getattr(connection, _QUEUE, None)
    if queue is None:
        queue = []
        setattr(connection, _QUEUE, queue)
    elif queue and queue[0]() is None:  # tickets Django dropped (rolled back)
        queue[:] = [ref for ref in queue if ref() is not None]
    ticket = _Ticket((mission_id, type, data), queue)
    queue.append(weakref.ref(ticket))
    transaction.on_commit(ticket, using=connection.alias)
    return ticket
