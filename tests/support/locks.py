"""Barriers on database locks: a test that must know another session waits for a lock it
holds (not merely that the session started) waits until the database says so, however slow
the machine is. PostgreSQL shows a waiting session in pg_locks. SQLite shows none: there the
waiting session says that it starts a transaction (`announcing_begin`), the step where it
queues for the write lock: the closest a wait can be seen."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, connections

from tests.conftest import is_postgres

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


@contextmanager
def announcing_begin(begun: threading.Event) -> Iterator[None]:
    """In this thread, on SQLite: set `begun` as this connection starts a transaction, the
    step where a writer of this process queues behind the one that holds the write lock
    (fusion_site/sqlite/base.py), just before it waits there."""
    wrapper = connections["default"]
    if wrapper.vendor != "sqlite":  # PostgreSQL's waits are seen in pg_locks
        yield
        return
    start = wrapper._start_transaction_under_autocommit

    def announced() -> None:
        begun.set()
        start()

    wrapper._start_transaction_under_autocommit = announced
    try:
        yield
    finally:
        del wrapper._start_transaction_under_autocommit


def wait_until_another_waits(begun: threading.Event, *, timeout: float = 120.0) -> None:
    """Return once another session waits for a lock this one holds: on PostgreSQL as
    pg_locks shows it; on SQLite once that session (in `announcing_begin`) starts its
    transaction, which then waits for this one's commit."""
    if is_postgres():
        wait_for_lock_waiters(1, timeout=timeout)
    else:
        assert begun.wait(timeout), "the other session never began its transaction"
