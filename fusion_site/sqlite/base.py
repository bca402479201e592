"""Django's SQLite backend, with one process-wide queue per database file for write
transactions.

Every `atomic()` block here starts with `BEGIN IMMEDIATE` (settings.py): it takes SQLite's
write lock at once, and a second writer waits in SQLite's busy handler, which polls with
sleeps growing to 100 ms. In the embedded shape the API, the worker threads and the
sweeper are threads of one process that write all the time, so a writer often slept on
after the lock was free (docs/BENCHMARKS.md). Before its BEGIN, a transaction of this
process now waits for the one of this process that holds the lock, and is woken the moment
that one ends. Writes outside `atomic()` (autocommit statements) and other processes'
writers are still queued by SQLite itself.

The queue is advice, SQLite's lock stays the real one: a holder whose connection is no
longer in a transaction (an exception raised into its thread at the wrong moment, as
Dramatiq's time limit does) is taken over by the next waiter within POLL seconds, never
left to block the process. A waiter gives up after the connection's `timeout` with the
"database is locked" error SQLite gives (and SQLite may wait that long again behind
another process).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base

POLL = 0.1  # seconds between looks at a holder that may have gone without saying so


class _Gate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: Any = None  # the DatabaseWrapper whose transaction goes first

    @staticmethod
    def _busy(holder: Any) -> bool:
        raw = getattr(holder, "connection", None)
        return raw is not None and raw.in_transaction

    def enter(self, wrapper: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._holder is not None and self._holder is not wrapper:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OperationalError("database is locked")
                if not self._cond.wait(min(left, POLL)) and not self._busy(self._holder):
                    break  # its transaction ended without a word: SQLite's lock decides
            self._holder = wrapper

    def leave(self, wrapper: Any) -> None:
        with self._cond:
            if self._holder is wrapper:
                self._holder = None
                self._cond.notify()

    def held(self) -> bool:
        return self._holder is not None


_gates: dict[str, _Gate] = {}
_gates_lock = threading.Lock()


def gate(name: str) -> _Gate:
    with _gates_lock:
        return _gates.setdefault(name, _Gate())


class DatabaseWrapper(base.DatabaseWrapper):
    def _gate(self) -> _Gate:
        return gate(str(self.settings_dict["NAME"]))

    def _start_transaction_under_autocommit(self) -> None:
        self._gate().enter(self, float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5)))
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # private in django-stubs
        except BaseException:
            self._gate().leave(self)
            raise

    def _leave_unless_in_transaction(self) -> None:
        if self.connection is None or not self.connection.in_transaction:
            self._gate().leave(self)

    def _commit(self):
        try:
            return super()._commit()  # type: ignore[misc]  # private in django-stubs
        finally:
            self._leave_unless_in_transaction()

    def _rollback(self):
        try:
            return super()._rollback()  # type: ignore[misc]  # private in django-stubs
        finally:
            self._leave_unless_in_transaction()

    def _close(self):
        try:
            return super()._close()  # type: ignore[misc]  # private in django-stubs
        finally:
            self._gate().leave(self)
