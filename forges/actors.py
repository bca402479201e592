"""Dramatiq actors of the forges: thin, ids in, idempotent (a row is sent once per claim;
a message for a row delivered, refused or claimed elsewhere does nothing). Services send
to them by name after commit (`fusion_site.runtime.queue.send_on_commit`)."""

from __future__ import annotations

import dramatiq
from django.conf import settings

from forges.services.delivery import deliver

# Up to two requests (a comment edit, then its creation when a person deleted it).
TIME_LIMIT_MS = int((2 * settings.FUSION_FORGE_TIMEOUT + 30) * 1000)


# No Dramatiq retries: a failed attempt is recorded on the row (its next attempt, or its
# claim left to expire), and the row's own retries and the sweep send it again.
@dramatiq.actor(max_retries=0, time_limit=TIME_LIMIT_MS, queue_name="fusion")
def deliver_outbox(outbox_id: int) -> None:
    deliver(outbox_id=outbox_id)
