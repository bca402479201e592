"""A barrier on PostgreSQL's lock table: a test that must know another session is blocked
on a lock (not merely started) waits until pg_locks says so, however slow the machine is."""

from __future__ import annotations

import time

from django.db import connection

_WAITERS = """
    SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> pg_backend_pid()
"""


def lock_waiters(*, table: str | None = None) -> int:
    """How many other sessions of this database wait for a lock (on `table`, when named)."""
    sql, params = _WAITERS, []
    if table is not None:
        sql, params = sql + " AND l.relation = to_regclass(%s)", [table]
    with connection.cursor() as cursor:
        # pg_stat_activity is read once per transaction unless its snapshot is cleared,
        # and the caller may be holding a transaction open while it waits.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def wait_for_lock_waiters(count: int, *, table: str | None = None, timeout: float = 120.0) -> None:
    """Return once `count` other sessions wait for a lock (on `table`, when named). The
    timeout only turns a hang into a failure: it is no part of the test's timing."""
    deadline = time.monotonic() + timeout
    while (waiting := lock_waiters(table=table)) < count:
        assert time.monotonic() < deadline, f"{waiting} of {count} sessions wait for a lock: {_sessions()}"
        time.sleep(0.01)


def _sessions() -> list[tuple]:
    """The other sessions of this database: what each waits for and runs (for a failure)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pid, state, wait_event_type, wait_event, left(query, 120) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchall()
