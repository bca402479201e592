"""The mission's row lock: taken first in every step that writes a mission's rows, once
per transaction (docs/RELIABILITY.md, "Lock order"; docs/TRUTH.md, rule 35).

Every event bumps the mission's `seq` counter, which locks the mission's row: a step that
also locks features, tasks or runs takes the mission's lock before them, so there is one
lock order everywhere and no deadlock between the autopilot and the loop.

Who takes it: the services the API, the admin and the actors call (`lock_mission`, first
in their transaction; `locked_mission` where the step reads the whole row). What they call below states "called while holding the mission
lock" and checks it with `assert_mission_locked`. A second `lock_mission` of the same
mission in the same transaction costs nothing: the transaction records the lock it holds.

How the record follows the transaction without reading Django's internals: it is an
on-commit callback that does nothing (`_Held`), known here only by a weak reference.
Django keeps a callback exactly as long as the locks taken with it: it runs and drops it
at commit, drops it at rollback, and drops it with a savepoint rolled back (which also
releases the row locks taken after that savepoint). Once dropped, the record is gone.
"""

from __future__ import annotations

import weakref
from typing import Any

from django.conf import settings
from django.db import connections, transaction

from missions import fastpaths
from missions.models import Mission, MissionStatus

# The connection attribute holding this module's records: {mission id: weak reference}.
_RECORDS = "fusion_mission_locks"


class _Held:
    """The record that the current transaction holds a mission's lock, with what the row
    said when it was locked (`running`; None on SQLite, which reads it when asked)."""

    __slots__ = ("running", "records", "__weakref__")

    def __init__(self, running: bool | None, records: dict[int, weakref.ref[_Held]]):
        self.running = running
        self.records = records

    def __call__(self) -> None:
        # The transaction committed: every lock it held went with it. Django still holds
        # the records of the callbacks after this one (it drops each once it has run), so
        # they are cleared here: a later callback that opens a transaction of its own finds
        # none. Only a callback registered before the transaction's first lock runs
        # earlier, one more reason to take the lock first.
        self.records.clear()


def lock_mission(mission_id: int) -> None:
    """Take the mission's row lock, first in the transaction (before any feature, task or
    run row). On PostgreSQL a `SELECT … FOR UPDATE`, once per transaction. On SQLite no
    query: its `IMMEDIATE` transactions serialize writers already (without `FOR UPDATE`
    the read would only be a read); the transaction records the lock all the same, so
    that `assert_mission_locked` means the same on both."""
    connection = connections[Mission.objects.db]
    locking = connection.features.has_select_for_update
    if not connection.in_atomic_block:
        if locking:
            fastpaths.mission_lock(mission_id=mission_id)  # autocommit: the lock ends with the statement
        return
    records = _records(connection)
    if _held(records, mission_id) is not None:
        return  # this transaction holds it already: no second round trip under it
    running: bool | None = None
    if locking:
        row = fastpaths.mission_lock(mission_id=mission_id)
        if row is None:
            return  # no such mission: nothing is locked
        running = _runs(*row)
    _record(connection, records, mission_id, running)


def locked_mission(**lookup: Any) -> Mission | None:
    """The mission found by `lookup` (`pk=…`, or `key=…` for an import), read with its row
    lock in one statement and recorded as `lock_mission` records it: for a step that needs
    the whole row anyway. None when there is no such mission."""
    connection = connections[Mission.objects.db]
    queryset = Mission.objects.select_for_update() if connection.features.has_select_for_update else Mission.objects
    mission = queryset.filter(**lookup).first()
    if mission is not None and connection.in_atomic_block:
        records = _records(connection)
        if _held(records, mission.pk) is None:
            running = _runs(mission.autopilot, mission.status) if connection.features.has_select_for_update else None
            _record(connection, records, mission.pk, running)
    return mission


def mission_locked(mission_id: int) -> bool:
    """Whether the current transaction holds the mission's lock (`lock_mission`)."""
    connection = connections[Mission.objects.db]
    return connection.in_atomic_block and _held(_records(connection), mission_id) is not None


def assert_mission_locked(mission_id: int) -> None:
    """The precondition of a function "called while holding the mission lock", checked
    where `FUSION_STRICT` is on (DEBUG and the test suite); a dictionary look-up."""
    if settings.FUSION_STRICT and not mission_locked(mission_id):
        raise AssertionError(f"called without the lock of mission {mission_id} (missions.locks.lock_mission)")


def autopilot_running_under_lock(mission_id: int) -> bool | None:
    """Whether the mission's autopilot is on and the mission active, as this transaction
    read it when it took the mission's lock (`lock_mission`); None without that lock. It
    cannot change before this transaction commits: any other writer of the row waits for
    it. In a SQLite transaction, read now: it began `IMMEDIATE`, with the one write lock."""
    connection = connections[Mission.objects.db]
    if not connection.in_atomic_block:
        return None
    if not connection.features.has_select_for_update:
        row = fastpaths.mission_autopilot(mission_id=mission_id)
        return row is not None and _runs(*row)
    held = _held(_records(connection), mission_id)
    return None if held is None else held.running


def _runs(autopilot: bool, status: str) -> bool:
    """The autopilot has work to look at: it is on and the mission active."""
    return bool(autopilot) and status == MissionStatus.ACTIVE


def _records(connection: Any) -> dict[int, weakref.ref[_Held]]:
    records = getattr(connection, _RECORDS, None)
    if records is None:
        records = {}
        setattr(connection, _RECORDS, records)
    return records


def _record(connection: Any, records: dict[int, weakref.ref[_Held]], mission_id: int, running: bool | None) -> None:
    held = _Held(running, records)
    records[mission_id] = weakref.ref(held)
    transaction.on_commit(held, using=connection.alias)


def _held(records: dict[int, weakref.ref[_Held]], mission_id: int) -> _Held | None:
    ref = records.get(mission_id)
    held = None if ref is None else ref()
    if ref is not None and held is None:
        del records[mission_id]  # its transaction or savepoint rolled back
    return held
