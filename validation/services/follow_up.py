"""Steps that follow a recorded verdict (a fix to create, a root to judge again)."""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from missions.errors import DomainError
from missions.outbox import publish_on_commit


def follow_up(mission_id: int, step: str, action: Callable[[], object]) -> None:
    """Run a step that follows a recorded verdict in a savepoint: if it is refused, the
    verdict stays recorded and the refusal is an event, never a rolled-back outcome."""
    try:
        with transaction.atomic():
            action()
    except DomainError as exc:
        publish_on_commit(
            mission_id,
            "follow-up:refused",
            {
                "mission": mission_id,
                "step": step,
                "code": exc.code,
                "reason": str(exc)[:500],
            },
        )
