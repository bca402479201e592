"""The mission audit log's rows (`MissionEvent`), each with the mission's next `seq`.

`missions.events.publish_on_commit` is the only caller: it writes a row here and sends
the live event after commit. The `seq` is counted on the mission's row, under its lock,
so a mission's events are numbered without gaps in the order their transactions commit.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, models
from django.db.models import F
from django.utils import timezone

from fusion_site.base.inserts import insert
from missions.models import Mission, MissionEvent, column


def append(mission_id: int, type: str, payload: dict[str, Any], actor_id: int | None) -> MissionEvent:
    """The audit row, with the mission's next `seq`, written now."""
    connection = connections[MissionEvent.objects.db]
    now = timezone.now()
    event = MissionEvent(
        mission_id=mission_id, type=type, payload=payload, actor_id=actor_id, created_at=now, updated_at=now
    )
    if connection.vendor != "postgresql":
        # Counted first (`_next_seq`), then one insert written once per process.
        event.seq = _next_seq(mission_id)
        return insert([event])[0]
    _write(connection, mission_id, event)
    return event


def _write(connection: Any, mission_id: int, event: MissionEvent) -> None:
    """Count and insert `event` in one statement (a round trip fewer per event, under the
    mission's lock), written once per process: every step of the loop writes a few of
    these, and building the statement cost more than running it. Sets its `pk` and `seq`."""
    sql, fields = _counted_insert_sql(connection)
    values = [field.get_db_prep_save(getattr(event, field.attname), connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, [mission_id, *values])
        row = cursor.fetchone()
    if row is None:  # no mission row: nothing inserted
        raise Mission.DoesNotExist(f"mission {mission_id} does not exist")
    event.pk, event.seq = row
    event._state.adding, event._state.db = False, connection.alias


_COUNTED_INSERTS: dict[str, tuple[str, list[models.Field]]] = {}


def _counted_insert_sql(connection: Any) -> tuple[str, list[models.Field]]:
    """PostgreSQL's `WITH counted AS (UPDATE … RETURNING) INSERT … RETURNING id, seq` of an
    audit row (parameters: the mission's id, then the fields, in order), and those fields."""
    if connection.alias not in _COUNTED_INSERTS:
        meta, quote = MissionEvent._meta, connection.ops.quote_name
        fields = [f for f in meta.concrete_fields if not f.primary_key and f.attname != "seq"]
        seq = quote(column(MissionEvent, "seq"))
        sql = (
            f"WITH counted AS ({_bump_sql(connection)}) "
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}, {seq}) "
            f"SELECT {', '.join(['%s'] * len(fields))}, counted.n FROM counted "
            f"RETURNING {quote(meta.pk.column)}, {seq}"
        )
        _COUNTED_INSERTS[connection.alias] = (sql, fields)
    return _COUNTED_INSERTS[connection.alias]


def _bump_sql(connection: Any) -> str:
    """Add one to the mission's event counter (parameter: its id), returning it as `n`."""
    quote = connection.ops.quote_name
    counter, pk = (quote(column(Mission, name)) for name in ("event_seq", "id"))
    return (
        f"UPDATE {quote(Mission._meta.db_table)} SET {counter} = {counter} + 1 WHERE {pk} = %s RETURNING {counter} AS n"
    )


def _next_seq(mission_id: int) -> int:
    """The mission's next event `seq`, counted under its row lock (the update holds it to
    the end of the transaction): one `UPDATE … RETURNING` where the database has it (the
    ORM's `update` returns no values), else the update and a read."""
    connection = connections[Mission.objects.db]
    if not connection.features.can_return_columns_from_insert:  # the same SQL support (RETURNING)
        Mission.objects.filter(pk=mission_id).update(event_seq=F("event_seq") + 1)
        return Mission.objects.filter(pk=mission_id).values_list("event_seq", flat=True).get()
    with connection.cursor() as cursor:
        cursor.execute(_bump_sql(connection), [mission_id])
        row = cursor.fetchone()
    if row is None:
        raise Mission.DoesNotExist(f"mission {mission_id} does not exist")
    return int(row[0])
