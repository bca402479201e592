"""The stored event log of the live streams (`EVENTSTREAM_STORAGE_CLASS`): django-eventstream's
own model storage (the same tables, ids and placeholder, so `Last-Event-ID` replay and
`missions.relay.redeliver_missing` read it unchanged), with fewer statements per event.

Every audit event is stored once or twice (its mission's channel, and the global one),
so this is on every hop of the loop. The library's `Event.save` reads the channel's
counter, locks and re-reads it, inserts, writes the counter back and then looks for
events to trim: seven statements. Here the counter is bumped and read in one
`UPDATE … RETURNING` (which also locks it to the end of the transaction) and the event
(with the channel's placeholder event 0 the first time) is one insert; old events are
trimmed at most once a minute per process instead of on every append. The live events
of one committed transaction are stored together (`append_events`): one transaction, one
bump per channel and one insert for all of them. On PostgreSQL each channel's part is
one statement (`_append_channel`: the bump in a data-modifying `WITH`, the insert reading
its value), run in autocommit after the events' transaction committed: one round trip
per channel instead of five for the batch, and the counter's row lock (the global
channel's is taken by every mission) held for one statement only.
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

from fusion_site.runtime import fast_paths
from missions.delivery import GLOBAL_CHANNEL

TRIM_EVERY_SECONDS = 60.0
_trimmed = {"at": float("-inf")}
_trim_lock = threading.Lock()


class _CounterMissing(Exception):
    """A channel of the batch has no counter yet: roll the batch back, make it, go again."""

    def __init__(self, channel: str):
        self.channel = channel


class EventLogStorage(DjangoModelStorage):
    def append_events(self, items: list[tuple[str, str, Any]]) -> list[Event]:
        """Several events `(channel, type, data)` at once, in their order (the live events
        of one committed transaction, `missions.delivery`): one statement per channel on
        PostgreSQL (`_append_by_channel`), elsewhere one transaction, one counter bump per
        channel and one insert. Ids within a channel follow the order of `items`."""
        connection = connections[router.db_for_write(StoredEvent)]
        if not fast_paths.on():
            return self._append_plain(connection, items)
        if connection.vendor == "postgresql":
            return self._append_by_channel(connection, items)
        if len(items) == 1 or not connection.features.can_return_columns_from_insert:
            return [self.append_event(*item) for item in items]
        encoded = [
            (channel, event_type, json.dumps(data, cls=DjangoJSONEncoder)) for channel, event_type, data in items
        ]
        for _attempt in range(3):
            try:
                ids = _store_batch(connection, encoded)
                break
            except _CounterMissing as missing:
                _make_counter(connection, missing.channel)
        else:  # counters vanishing again and again: one by one, the library's way
            return [self.append_event(*item) for item in items]
        self._trim_now_and_then()
        return [
            Event(channel, event_type, data, id=eid)
            for (channel, event_type, data), eid in zip(items, ids, strict=True)
        ]

    def append_event(self, channel: str, event_type: str, data: Any) -> Event:
        connection = connections[router.db_for_write(StoredEvent)]
        if not fast_paths.on():  # the plain route: the library's own
            return super().append_event(channel, event_type, data)
        if connection.vendor == "postgresql":
            return self._append_by_channel(connection, [(channel, event_type, data)])[0]
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
            _make_counter(connection, channel)  # the channel's first event
        else:  # the counter vanished twice in a row: leave it to the library
            return super().append_event(channel, event_type, data)
        self._trim_now_and_then()
        return Event(channel, event_type, data, id=eid)

    def _append_plain(self, connection: Any, items: list[tuple[str, str, Any]]) -> list[Event]:
        """`FUSION_FAST_PATHS` off: the library's `append_event` for each, in one transaction
        with the batch's counters locked first in one order, so that a batch's ids within a
        channel follow each other as on the fast path, and two batches never deadlock."""
        channels = sorted({channel for channel, _type, _data in items})
        with transaction.atomic(using=connection.alias):
            counters = EventCounter.objects.using(connection.alias).select_for_update().filter(name__in=channels)
            list(counters.order_by("name").values_list("pk", flat=True))
            return [super(EventLogStorage, self).append_event(*item) for item in items]

    def _append_by_channel(self, connection: Any, items: list[tuple[str, str, Any]]) -> list[Event]:
        """PostgreSQL: each channel's events in one statement (`_append_channel`). The
        global channel goes first and the mission's last: the sweep (`redeliver_missing`)
        re-sends what the mission's channel lacks, so a failure between the two loses
        nothing. One order everywhere, too: inside a transaction both rows stay locked to
        its end."""
        by_channel: dict[str, list[int]] = {}
        for position, (channel, _type, _data) in enumerate(items):
            by_channel.setdefault(channel, []).append(position)
        ids: dict[int, int] = {}
        for channel in sorted(by_channel, key=lambda name: (name != GLOBAL_CHANNEL, name)):
            positions = by_channel[channel]
            rows = [(items[p][1], json.dumps(items[p][2], cls=DjangoJSONEncoder)) for p in positions]
            for _attempt in range(3):
                taken = _append_channel(connection, channel, rows)
                if taken is not None:
                    break
                _make_counter(connection, channel)  # the channel's first event
            else:  # the counter vanishing again and again: one by one, the library's way
                taken = [super(EventLogStorage, self).append_event(channel, *items[p][1:]).id for p in positions]
            ids.update(zip(positions, taken, strict=True))
        self._trim_now_and_then()
        return [Event(channel, event_type, data, id=ids[p]) for p, (channel, event_type, data) in enumerate(items)]

    def _trim_now_and_then(self) -> None:
        now = time.monotonic()
        with _trim_lock:
            if now - _trimmed["at"] < TRIM_EVERY_SECONDS:
                return
            _trimmed["at"] = now
        self.trim_event_log()


def _make_counter(connection: Any, channel: str) -> None:
    """The channel's counter (another process may make it first)."""
    try:
        with transaction.atomic(using=connection.alias):
            EventCounter.objects.using(connection.alias).create(name=channel)
    except IntegrityError:
        pass


def _store_batch(connection: Any, encoded: list[tuple[str, str, str]]) -> list[int]:
    """Store the encoded events in one transaction; their ids. Raises _CounterMissing
    (nothing stored) when a channel has no counter yet."""
    counts: dict[str, int] = {}
    for channel, _type, _data in encoded:
        counts[channel] = counts.get(channel, 0) + 1
    with transaction.atomic(using=connection.alias):
        next_id: dict[str, int] = {}
        for channel, count in sorted(counts.items()):  # one lock order: no deadlock between two batches
            top = _bump(connection, channel, by=count)
            if top is None:
                raise _CounterMissing(channel)
            next_id[channel] = top - count + 1
        rows, ids = [], []
        for channel, event_type, data in encoded:
            eid = next_id[channel]
            next_id[channel] = eid + 1
            if eid == 1:  # as the library does: event 0, so that clients may ask for "after 0"
                rows.append((channel, "", "", 0))
            rows.append((channel, event_type, data, eid))
            ids.append(eid)
        _insert(connection, rows)
    return ids


def _bump(connection: Any, channel: str, by: int = 1) -> int | None:
    """The channel's counter raised by `by`: its new value (the last id taken), its row
    locked to the end of the transaction; None when the channel has no counter yet."""
    with connection.cursor() as cursor:
        cursor.execute(_bump_sql(connection), [by, _now(connection), channel])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def _insert(connection: Any, rows: list[tuple[str, str, str, int]]) -> None:
    """The rows (channel, type, data, eid) in one `INSERT`, stamped now (`created`)."""
    created = _now(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            _insert_sql(connection) + " VALUES " + ", ".join(["(%s, %s, %s, %s, %s)"] * len(rows)),
            [value for row in rows for value in (*row, created)],
        )


def _append_channel(connection: Any, channel: str, rows: list[tuple[str, str]]) -> list[int] | None:
    """PostgreSQL: the events `(type, encoded data)` of one channel, in their order, in one
    statement: the counter raised by their number and the rows inserted with the ids it
    gives (and event 0, as the library has it, when they are the channel's first). Their
    ids; None (nothing stored) when the channel has no counter yet. The data-modifying
    `WITH` runs exactly once, and its row lock orders concurrent appends by commit."""
    now, count = _now(connection), len(rows)
    values = ", ".join(f"(%s, %s, {i})" for i in range(1, count + 1))
    sql = (
        f"WITH bumped AS ({_bump_sql(connection)} AS top) {_insert_sql(connection)} "
        f"SELECT %s, v.type, v.data, bumped.top - %s + v.n, %s FROM bumped, (VALUES {values}) AS v(type, data, n) "
        f"UNION ALL SELECT %s, '', '', 0, %s FROM bumped WHERE bumped.top = %s "
        f"RETURNING {connection.ops.quote_name(StoredEvent._meta.get_field('eid').column)}"
    )
    params = [count, now, channel, channel, count, now, *(value for row in rows for value in row), channel, now, count]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        taken = sorted(eid for (eid,) in cursor.fetchall() if eid)
    return taken or None


def _bump_sql(connection: Any) -> str:
    """Raise a channel's counter (parameters: by, now, channel), returning its new value."""
    quote = connection.ops.quote_name
    table = quote(EventCounter._meta.db_table)
    value, updated, name = (quote(EventCounter._meta.get_field(f).column) for f in ("value", "updated", "name"))
    return f"UPDATE {table} SET {value} = {value} + %s, {updated} = %s WHERE {name} = %s RETURNING {value}"


def _insert_sql(connection: Any) -> str:
    """`INSERT INTO` the stored events' table with its columns (channel, type, data, eid, created)."""
    quote = connection.ops.quote_name
    columns = ", ".join(
        quote(StoredEvent._meta.get_field(f).column) for f in ("channel", "type", "data", "eid", "created")
    )
    return f"INSERT INTO {quote(StoredEvent._meta.db_table)} ({columns})"


def _now(connection: Any) -> Any:
    return connection.ops.adapt_datetimefield_value(timezone.now())
