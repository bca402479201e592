"""A lease renewed while its holder works (docs/RELIABILITY.md): validator runs and
executor tasks hold one, so that a long check or command is never taken away, and a dead
worker stops renewing and loses it after one lease."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def renewing(held: QuerySet, *, every: float, lease: timedelta, name: str) -> Iterator[None]:
    """While the body runs, every `every` seconds set `lease_until` of the rows `held`
    (the holder's own row, filtered on its claim) to now + `lease`."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(every):
                try:
                    held.update(lease_until=timezone.now() + lease)
                except Exception:  # noqa: BLE001 — the database is away: try again next beat
                    logger.warning("could not renew the lease of %s", name, exc_info=True)
        finally:
            connection.close()

    thread = threading.Thread(target=beat, name=f"lease-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
