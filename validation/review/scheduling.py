"""Where the next stage goes: to its Dramatiq actor, or (inside `captured_stages`) to a
list that the caller runs in its own thread (`manage.py review --sync`, tests)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any

from django.db import transaction

_inline = threading.local()


def enqueue(stage: str, review_id: int, *args: Any) -> None:
    queue = getattr(_inline, "queue", None)
    if queue is not None:
        queue.append((stage, review_id, args))
    else:
        from validation.review.pipeline import ACTORS

        ACTORS[stage].send(review_id, *args)


def enqueue_on_commit(stage: str, review_id: int, *args: Any) -> None:
    transaction.on_commit(lambda: enqueue(stage, review_id, *args))


@contextmanager
def captured_stages():
    """Stages enqueued inside the block are collected instead of sent (CLI --sync, tests)."""
    previous = getattr(_inline, "queue", None)
    _inline.queue = queue = []
    try:
        yield queue
    finally:
        _inline.queue = previous


def run_captured(queue: list) -> None:
    """Run captured stages (and the stages they enqueue) in this thread, in order."""
    from validation.review.pipeline import STAGES, guarded

    while queue:
        stage, review_id, args = queue.pop(0)
        guarded(stage, STAGES[stage], review_id, *args)
