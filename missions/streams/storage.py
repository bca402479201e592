"""The stored event log of the live streams (`EVENTSTREAM_STORAGE_CLASS`): django-eventstream's
own model storage (the same tables, ids and placeholder, so `Last-Event-ID` replay and
`missions.events.redeliver_missing` read it unchanged), with fewer statements per event.

Every audit event is stored once or twice (its mission's channel, and the global one),
so this is on every hop of the loop. The library's `Event.save` reads the channel's
counter, locks and re-reads it, inserts, writes the counter back and then looks for
events to trim: seven statements. Here the counter is bumped and read in one
`UPDATE … RETURNING` (which also locks it to the end of the transaction) and the event
(with the channel's placeholder event 0 the first time) is one insert; old events are
trimmed at most once a minute per process instead of on every append.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connections, router, transaction
from django.utils import timezone
from django_eventstream.event import Event
from django_eventstream.models import Event as StoredEvent
from django_eventstream.models import EventCounter
from django_eventstream.storage import DjangoModelStorage

TRIM_EVERY_SECONDS = 60.0
_trimmed = {"at": float("-inf")}
_trim_lock = threading.Lock()


class EventLogStorage(DjangoModelStorage):
    def append_event(self, channel: str, event_type: str, data: Any) -> Event:
        connection = connections[router.db_for_write(StoredEvent)]
        if not connection.features.can_return_columns_from_insert:  # no RETURNING: the library's way
            return super().append_event(channel, event_type, data)
        stored = json.dumps(data, cls=DjangoJSONEncoder)
        for _attempt in range(2):
            with transaction.atomic(using=connection.alias):
                eid = _bump(connection, channel)
                if eid is not None:
                    rows = [(channel, event_type, stored, eid)]
                    if eid == 1:  # as the library does: event 0, so that clients may ask for "after 0"
                        rows.insert(0, (channel, "", "", 0))
                    _insert(connection, rows)
                    break
            try:  # the channel's first event: its counter (another process may make it first)
                with transaction.atomic(using=connection.alias):
                    EventCounter.objects.using(connection.alias).create(name=channel)
            except IntegrityError:
                pass
        else:  # the counter vanished twice in a row: leave it to the library
            return super().append_event(channel, event_type, data)
        self._trim_now_and_then()
        return Event(channel, event_type, data, id=eid)

    def _trim_now_and_then(self) -> None:
        now = time.monotonic()
        with _trim_lock:
            if now - _trimmed["at"] < TRIM_EVERY_SECONDS:
                return
            _trimmed["at"] = now
        self.trim_event_log()


def _bump(connection: Any, channel: str) -> int | None:
    """The channel's next event id, its counter row locked to the end of the transaction;
    None when the channel has no counter yet."""
    quote = connection.ops.quote_name
    table = quote(EventCounter._meta.db_table)
    value = quote(EventCounter._meta.get_field("value").column)
    updated = quote(EventCounter._meta.get_field("updated").column)
    name = quote(EventCounter._meta.get_field("name").column)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {value} = {value} + 1, {updated} = %s WHERE {name} = %s RETURNING {value}",
            [connection.ops.adapt_datetimefield_value(timezone.now()), channel],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def _insert(connection: Any, rows: list[tuple[str, str, str, int]]) -> None:
    """The rows (channel, type, data, eid) in one `INSERT`, stamped now (`created`)."""
    quote = connection.ops.quote_name
    columns = ", ".join(
        quote(StoredEvent._meta.get_field(f).column) for f in ("channel", "type", "data", "eid", "created")
    )
    created = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(StoredEvent._meta.db_table)} ({columns}) VALUES "
            + ", ".join(["(%s, %s, %s, %s, %s)"] * len(rows)),
            [value for row in rows for value in (*row, created)],
        )
