"""The webhook actor: thin, an id in. Services send to it by name after commit
(`forges/inbound/receive.py`), so this module may import the service it wraps."""

from __future__ import annotations

import dramatiq

from forges.inbound.process import delivery_process


@dramatiq.actor(max_retries=3, min_backoff=1000, max_backoff=30_000, time_limit=600_000, queue_name="fusion")
def process_delivery(delivery_id: int) -> None:
    # Idempotent: a delivery no longer `received` was processed already.
    delivery_process(delivery_id=delivery_id)
