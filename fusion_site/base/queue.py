"""Sending Dramatiq messages by actor name, after commit.

Services send work to actors without importing the modules that declare them: those
modules import the services (the actors are thin wrappers), so a direct import would be
a cycle (docs/ARCHITECTURE.md, "Floors"). Each app imports its actor module in its
`AppConfig.ready`, so every actor is declared before a message can be sent.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from django.db import transaction


def send_on_commit(actor_name: str, *args: Any, delay_ms: int | None = None, **options: Any) -> None:
    """Enqueue `actor_name(*args)` once the surrounding transaction commits (at once
    outside one): a rolled-back change never starts work."""

    def send() -> None:
        actor = dramatiq.get_broker().get_actor(actor_name)
        actor.send_with_options(args=args, delay=delay_ms or None, **options)

    transaction.on_commit(send)
