"""Sending Dramatiq messages by actor name, after commit.

Services send work to actors without importing the modules that declare them: those
modules import the services (the actors are thin wrappers), so a direct import would be
a cycle (docs/ARCHITECTURE.md, "Floors"). Each app imports its actor module in its
`AppConfig.ready`, so every actor is declared before a message can be sent.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from django.db import close_old_connections, connections, transaction
from dramatiq.middleware import Middleware


def send_on_commit(actor_name: str, *args: Any, delay_ms: int | None = None, **options: Any) -> None:
    """Enqueue `actor_name(*args)` once the surrounding transaction commits (at once
    outside one): a rolled-back change never starts work."""

    def send() -> None:
        actor = dramatiq.get_broker().get_actor(actor_name)
        actor.send_with_options(args=args, delay=delay_ms or None, **options)

    transaction.on_commit(send)


class WorkerDbConnections(Middleware):
    """Django's database connections of Dramatiq worker threads (in place of django_dramatiq's
    `DbConnectionsMiddleware`, which it otherwise repeats): before and after every message,
    a broken or obsolete connection is closed, and all of them when the worker stops. One
    difference: a worker thread keeps its SQLite connection from one message to the next
    (the embedded workers: opening one costs about 2 ms of the process's interpreter lock,
    three times per feature), whatever `CONN_MAX_AGE` says for the web threads. A
    PostgreSQL connection follows its `CONN_MAX_AGE` (fusion_site/settings.py)."""

    def _close_old_connections(self, *args: Any, **kwargs: Any) -> None:
        for connection in connections.all(initialized_only=True):
            if connection.vendor == "sqlite" and connection.connection is not None:
                connection.close_at = None  # never too old (Django still closes a broken one)
        close_old_connections()

    before_process_message = _close_old_connections
    after_process_message = _close_old_connections

    def _close_connections(self, *args: Any, **kwargs: Any) -> None:
        connections.close_all()

    before_consumer_thread_shutdown = _close_connections
    before_worker_thread_shutdown = _close_connections
    before_worker_shutdown = _close_connections
