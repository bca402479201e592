"""The plan's floor's fast paths: its hot statements, each behind a named function.

Every judged feature runs each of these once or more: the API's token and the completion's
task, the task and the mission locked for a completion, every state machine's
compare-and-swap, the audit log's rows (a loop step writes up to five) and the milestone
rollup every verdict recomputes. Each is the same statement every time, only the ids
change, and building and compiling a queryset costs about ten times as much interpreter
time as running its SQL (docs/BENCHMARKS.md, "Loop throughput": a run read with its
mission and feature, 1.7 ms of CPU through the ORM against 0.13 ms as the same SQL). So:

- the reads, the locks and the compare-and-swap are compiled once per process
  (`fusion_site/runtime/prepared.py`; "Statements compiled once per process": 52,200 →
  24,500 Python calls per feature);
- the audit rows are counted and inserted in one statement on PostgreSQL (a round trip
  fewer per event under the mission's lock), elsewhere counted by one `UPDATE … RETURNING`
  and inserted by a statement written once (`fusion_site/runtime/inserts.py`);
- the rollup's counts are one statement written out (the ORM took five times as long to
  build that aggregate as to run it).

This module is the only one of the floor that imports `prepared` and `inserts` (an
import-linter contract): domain code calls the functions below like any selector. With
`FUSION_FAST_PATHS=off` (`fusion_site/runtime/fast_paths.py`) each of them takes the plain
ORM route (the queryset, `.update()`, `bulk_create` or aggregate it describes): the same
rows and return values.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, models
from django.db.models import Count, Exists, F, Model, OuterRef, Q
from rest_framework.authtoken.models import Token

from fusion_site.runtime import fast_paths, inserts
from fusion_site.runtime.prepared import Prepared
from fusion_site.runtime.prepared import compare_and_set as _compare_and_set
from missions.models import (
    AssertionScope,
    AssertionStatus,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    Task,
    column,
)

# --- the mission's row lock (missions/locks.py): its autopilot and status come with it.

_LOCK: Prepared[tuple[bool, str]] = Prepared(
    lambda pk: Mission.objects.select_for_update().filter(pk=pk).values_list("autopilot", "status")
)
_AUTOPILOT: Prepared[tuple[bool, str]] = Prepared(
    lambda pk: Mission.objects.filter(pk=pk).values_list("autopilot", "status")
)


def mission_lock(*, mission_id: int) -> tuple[bool, str] | None:
    """`SELECT autopilot, status … FOR UPDATE` of the mission (None: no such mission)."""
    return _LOCK.first(pk=mission_id)


def mission_autopilot(*, mission_id: int) -> tuple[bool, str] | None:
    """The mission's autopilot and status, read without a lock (None: no such mission)."""
    return _AUTOPILOT.first(pk=mission_id)


# --- the API: every request's token, every completion's task.

_TOKEN: Prepared[Token] = Prepared(lambda key: Token.objects.select_related("user").filter(key=key), key=str)


def token_with_user(*, key: str) -> Token:
    """The API token `key` with its user; `Token.DoesNotExist` when there is none."""
    return _TOKEN.get(key=key)


_ANY_TASK: Prepared[Task] = Prepared(lambda pk: Task.objects.select_related("mission").filter(pk=pk))
# The missions a user who is not staff sees (`missions.selectors.visible_missions`): owned
# or a member's. The user's id twice: a prepared statement's parameter stands in one place.
_MEMBERS_TASK: Prepared[Task] = Prepared(
    lambda pk, owner, member: Task.objects.select_related("mission").filter(
        pk=pk, mission__in=Mission.objects.filter(Q(owner_id=owner) | Q(members=member)).values("pk")
    )
)


def task_with_mission(*, task_id: int, user_id: int | None) -> Task | None:
    """The task with its mission; with `user_id`, only where that user owns or is a member
    of its mission (None: no such task, or not theirs)."""
    if user_id is None:
        return _ANY_TASK.first(pk=task_id)
    return _MEMBERS_TASK.first(pk=task_id, owner=user_id, member=user_id)


def _locked_with_feature(pk: int) -> Any:
    """The task locked `FOR UPDATE` with its mission (as `select_related("mission")` locked
    it), its feature read in the same query but not locked (a nullable join)."""
    if connections[Task.objects.db].features.has_select_for_update_of:
        tasks = Task.objects.select_for_update(of=("self", "mission")).select_related("mission", "feature")
    else:
        tasks = Task.objects.select_for_update().select_related("mission", "feature")
    return tasks.filter(pk=pk)


_LOCKED_TASK: Prepared[Task] = Prepared(_locked_with_feature)


def task_locked_with_feature(*, task_id: int) -> Task:
    """The task and its mission locked, its feature read with them; `Task.DoesNotExist`."""
    return _LOCKED_TASK.get(pk=task_id)


# --- the state machines (missions/transitions/machine.py) and the audit log (missions/audit.py).


def compare_and_set(*, model: type[Model], pk: int, field: str, old: str, updates: dict[str, Any]) -> int:
    """`model.objects.filter(pk=pk, <field>=old).update(**updates)`: the rows changed (0:
    another writer moved the row first)."""
    return _compare_and_set(model, pk=pk, field=field, old=old, updates=updates)


def audit_insert(*, mission_id: int, events: list[MissionEvent]) -> None:
    """The unsaved audit rows of one mission written, given its next `seq`s in their order
    (sets their `pk` and `seq`): one statement on PostgreSQL however many there are;
    elsewhere counted first (`_next_event_seq`), then one insert written once per process."""
    connection = connections[MissionEvent.objects.db]
    if connection.vendor == "postgresql" and fast_paths.on():
        _counted_insert(connection, mission_id, events)
        return
    first = _next_event_seq(mission_id, by=len(events)) - len(events) + 1
    for offset, event in enumerate(events):
        event.seq = first + offset
    inserts.insert(events)


def _counted_insert(connection: Any, mission_id: int, events: list[MissionEvent]) -> None:
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


def _next_event_seq(mission_id: int, *, by: int = 1) -> int:
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


# --- the milestone rollup (missions/selectors.py, missions/services/rollup.py).

ROLLUP_COUNTS = ("total", "passed", "failed", "blocked", "pending", "unlinked")


def milestone_rollup_row(*, milestone_id: int) -> tuple[dict[str, int], tuple[int, str]] | None:
    """The counts of `missions.selectors.rollup_counts` (`ROLLUP_COUNTS`) and the milestone's (mission id, stored rollup state),
    in one statement written out: every verdict recomputes them, and the ORM took five
    times as long to build this aggregate as to run it. None: no such milestone."""
    if not fast_paths.on():
        return _milestone_rollup_row_plain(milestone_id)
    connection = connections[ContractAssertion.objects.db]
    quote = connection.ops.quote_name
    table, links, milestones = (quote(m._meta.db_table) for m in (ContractAssertion, FeatureAssertion, Milestone))
    status, scope, pk, milestone = (quote(column(ContractAssertion, f)) for f in ("status", "scope", "id", "milestone"))
    mission, state, milestone_pk = (quote(column(Milestone, f)) for f in ("mission", "validation_state", "id"))
    link_to = quote(column(FeatureAssertion, "assertion"))
    linked = f"EXISTS (SELECT 1 FROM {links} l WHERE l.{link_to} = a.{pk})"
    sql = (
        f"SELECT COUNT(a.{pk}), "
        + ", ".join(f"SUM(CASE WHEN a.{status} = %s THEN 1 ELSE 0 END)" for _ in range(4))
        + f", SUM(CASE WHEN a.{scope} = %s AND NOT {linked} THEN 1 ELSE 0 END), m.{mission}, m.{state}"
        f" FROM {milestones} m LEFT JOIN {table} a ON a.{milestone} = m.{milestone_pk}"
        f" WHERE m.{milestone_pk} = %s GROUP BY m.{milestone_pk}, m.{mission}, m.{state}"
    )
    S = AssertionStatus
    with connection.cursor() as cursor:
        cursor.execute(sql, [S.PASSED, S.FAILED, S.BLOCKED, S.PENDING, AssertionScope.FEATURE, milestone_id])
        row = cursor.fetchone()
    if row is None:
        return None
    counts = {name: int(value or 0) for name, value in zip(ROLLUP_COUNTS, row[:-2], strict=True)}
    return counts, (int(row[-2]), str(row[-1]))


def _milestone_rollup_row_plain(milestone_id: int) -> tuple[dict[str, int], tuple[int, str]] | None:
    """`milestone_rollup_row` through the ORM (`FUSION_FAST_PATHS` off)."""
    milestone = Milestone.objects.filter(pk=milestone_id).values_list("mission_id", "validation_state").first()
    if milestone is None:
        return None
    S = AssertionStatus
    unlinked = Q(~Exists(FeatureAssertion.objects.filter(assertion=OuterRef("pk"))), scope=AssertionScope.FEATURE)
    counts = ContractAssertion.objects.filter(milestone_id=milestone_id).aggregate(
        total=Count("pk"),
        **{
            name: Count("pk", filter=Q(status=status))
            for name, status in zip(ROLLUP_COUNTS[1:5], (S.PASSED, S.FAILED, S.BLOCKED, S.PENDING), strict=True)
        },
        unlinked=Count("pk", filter=unlinked),
    )
    return {name: int(counts[name] or 0) for name in ROLLUP_COUNTS}, (int(milestone[0]), str(milestone[1]))
