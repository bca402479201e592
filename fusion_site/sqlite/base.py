"""Django's SQLite backend, with one process-wide queue per database file for write
transactions.

Every transaction here is `BEGIN IMMEDIATE` (settings.py): it takes SQLite's write lock at
once, and a second writer waits in SQLite's busy handler, which polls with sleeps growing
to 100 ms. In the embedded shape the API, the worker threads, the lease renewals and the
sweeper are threads of one process that write all the time, so a writer often slept on
after the lock was free (the loop's time went to that polling; README, "Benchmarks").
Threads of this process now wait for each other on a lock, woken the moment the previous
transaction ends, and only another process's writer (a management command) is waited for
by SQLite itself. The wait is bounded by the connection's `timeout`, and ends with the
same "database is locked" error SQLite gives.
"""

from __future__ import annotations

import threading

from django.db import OperationalError
from django.db.backends.sqlite3 import base

_gates: dict[str, threading.Lock] = {}
_gates_lock = threading.Lock()


def _gate(name: str) -> threading.Lock:
    with _gates_lock:
        return _gates.setdefault(name, threading.Lock())


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_gate = False

    def _gate(self) -> threading.Lock:
        return _gate(str(self.settings_dict["NAME"]))

    def _start_transaction_under_autocommit(self) -> None:
        if not self._holds_gate:
            timeout = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
            if not self._gate().acquire(timeout=timeout):
                raise OperationalError("database is locked")
            self._holds_gate = True
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # private in django-stubs
        except BaseException:
            self._release_gate()
            raise

    def _release_gate(self) -> None:
        if self._holds_gate and (self.connection is None or not self.connection.in_transaction):
            self._holds_gate = False
            self._gate().release()

    def _commit(self):
        try:
            return super()._commit()  # type: ignore[misc]  # private in django-stubs
        finally:
            self._release_gate()

    def _rollback(self):
        try:
            return super()._rollback()  # type: ignore[misc]  # private in django-stubs
        finally:
            self._release_gate()

    def _close(self):
        try:
            return super()._close()  # type: ignore[misc]  # private in django-stubs
        finally:
            if self._holds_gate:
                self._holds_gate = False
                self._gate().release()
