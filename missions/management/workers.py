"""In-process Dramatiq workers for the embedded mode (no REDIS_URL): `manage.py serve`
(validation) and `manage.py demo --wait` start them through this one function."""

from __future__ import annotations

import dramatiq
from django.conf import settings
from dramatiq import Worker


def start_embedded_worker(threads: int) -> Worker:
    broker = dramatiq.get_broker()
    broker.emit_after("process_boot")
    worker = Worker(broker, worker_threads=threads, worker_timeout=settings.FUSION_WORKER_POLL_MS)
    worker.start()
    return worker
