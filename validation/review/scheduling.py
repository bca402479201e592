"""Where the next stage goes: to its Dramatiq actor, or (inside `captured_stages`) to a
list that the caller runs in its own thread (`manage.py review --sync`, tests; the list is
run by `validation.review.pipeline.run_captured`).

The actors are sent to by name (`review_<stage>`), not imported: `pipeline` declares them
and imports the stages, which enqueue through here, so an import would be a cycle.
`validation.apps` imports them (through `validation.actors`) before a message can be sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
from django.db import transaction

_inline = threading.local()


def enqueue(stage: str, review_id: int, *args: Any) -> None:
    queue = getattr(_inline, "queue", None)
    if queue is not None:
        queue.append((stage, review_id, args))
    else:
        dramatiq.get_broker().get_actor(actor_name(stage)).send(review_id, *args)


def actor_name(stage: str) -> str:
    """The Dramatiq actor of a stage (declared in `validation.review.pipeline`)."""
    return f"review_{stage}"


def enqueue_on_commit(stage: str, review_id: int, *args: Any) -> None:
    transaction.on_commit(lambda: enqueue(stage, review_id, *args))


Captured = list[tuple[str, int, tuple[Any, ...]]]


@contextmanager
def captured_stages() -> Iterator[Captured]:
    """Stages enqueued inside the block are collected instead of sent (CLI --sync, tests)."""
    previous = getattr(_inline, "queue", None)
    queue: Captured = []
    _inline.queue = queue
    try:
        yield queue
    finally:
        _inline.queue = previous
