"""The mission audit log's rows (`MissionEvent`), each with the mission's next `seq`.

`missions.outbox.publish_on_commit` is the only caller: it writes a row here and sends
the live event after commit. The `seq` is counted on the mission's row, under its lock,
so a mission's events are numbered without gaps in the order their transactions commit.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, models
from django.db.models import F
from django.utils import timezone

from fusion_site.runtime import fast_paths
from missions import fastpaths
from missions.models import Mission, MissionEvent, column


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
    connection = connections[MissionEvent.objects.db]
    if connection.vendor != "postgresql" or not fast_paths.on():
        # Counted first (`_next_seq`), then one insert written once per process.
        first = _next_seq(mission_id, by=len(events)) - len(events) + 1
        for offset, event in enumerate(events):
            event.seq = first + offset
        return fastpaths.audit_insert(events=events)
    _write(connection, mission_id, events)
    return events


def _write(connection: Any, mission_id: int, events: list[MissionEvent]) -> None:
    """Count and insert `events` in one statement (a round trip fewer per event, under the
    mission's lock), written once per process and number of rows: every step of the loop
    writes a few of these, and building the statement cost more than running it. Sets
    their `pk` and `seq`."""
    sql, fields = _counted_insert_sql(connection, len(events))
    values = [field.get_db_prep_save(getattr(event, field.attname), connection) for event in events for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, [mission_id, *values])
        rows = cursor.fetchall()
    if not rows:  # no mission row: nothing inserted
        raise Mission.DoesNotExist(f"mission {mission_id} does not exist")
    # The rows come back in no promised order: each is known by its `seq`, given in order.
    first = min(seq for _pk, seq in rows)
    for pk, seq in rows:
        event = events[seq - first]
        event.pk, event.seq = pk, seq
        event._state.adding, event._state.db = False, connection.alias


_COUNTED_INSERTS: dict[tuple[str, int], tuple[str, list[models.Field]]] = {}


def _counted_insert_sql(connection: Any, rows: int) -> tuple[str, list[models.Field]]:
    """PostgreSQL's `WITH counted AS (UPDATE … RETURNING) INSERT … SELECT … FROM (VALUES …)
    RETURNING id, seq` of `rows` audit rows (parameters: the mission's id, then each row's
    fields, in order), and those fields. The values are cast to their columns' types: a
    `VALUES` list infers none from the table it feeds."""
    key = (connection.alias, rows)
    if key not in _COUNTED_INSERTS:
        meta, quote = MissionEvent._meta, connection.ops.quote_name
        fields = [f for f in meta.concrete_fields if not f.primary_key and f.attname != "seq"]
        columns = [quote(f.column) for f in fields]
        row = ", ".join(f"%s::{f.cast_db_type(connection)}" for f in fields)
        values = ", ".join(f"({row}, {n})" for n in range(1, rows + 1))
        seq = quote(column(MissionEvent, "seq"))
        sql = (
            f"WITH counted AS ({_bump_sql(connection, rows)}) "
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(columns)}, {seq}) "
            f"SELECT {', '.join(f'v.{c}' for c in columns)}, counted.n - {rows} + v.n "
            f"FROM counted, (VALUES {values}) AS v({', '.join(columns)}, n) "
            f"RETURNING {quote(meta.pk.column)}, {seq}"
        )
        _COUNTED_INSERTS[key] = (sql, fields)
    return _COUNTED_INSERTS[key]


def _bump_sql(connection: Any, by: int = 1) -> str:
    """Add `by` to the mission's event counter (parameter: its id), returning it as `n`."""
    quote = connection.ops.quote_name
    counter, pk = (quote(column(Mission, name)) for name in ("event_seq", "id"))
    return (
        f"UPDATE {quote(Mission._meta.db_table)} SET {counter} = {counter} + {int(by)} "
        f"WHERE {pk} = %s RETURNING {counter} AS n"
    )


def _next_seq(mission_id: int, *, by: int = 1) -> int:
    """The mission's counter raised by `by` (the last of the `seq`s it hands out), counted
    under its row lock (the update holds it to the end of the transaction): one `UPDATE …
    RETURNING` where the database has it (the ORM's `update` returns no values), else the
    update and a read."""
    connection = connections[Mission.objects.db]
    if not fast_paths.on() or not connection.features.can_return_columns_from_insert:  # RETURNING's support
        Mission.objects.filter(pk=mission_id).update(event_seq=F("event_seq") + by)
        return Mission.objects.filter(pk=mission_id).values_list("event_seq", flat=True).get()
    with connection.cursor() as cursor:
        cursor.execute(_bump_sql(connection, by), [mission_id])
        row = cursor.fetchone()
    if row is None:
        raise Mission.DoesNotExist(f"mission {mission_id} does not exist")
    return int(row[0])
