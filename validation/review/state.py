"""The review's state machine, and where the next stage goes.

`Review.state` moves on its table (`missions.transitions.tables.REVIEW`: each stage
advances to the next, and any stage may fail or be cancelled), by the plan's engine
(`missions.transitions.machine`). A transition is a compare-and-swap on the old state
plus a `review:progress` event on the mission's stream after commit (its audit row);
zero rows updated means another worker (or a cancel) won, and the caller stops. A review
without a mission has no stream: its state is read from the API.

The next stage goes to its Dramatiq actor, or (inside `captured_stages`) to a list that
the caller runs in its own thread (`manage.py review --sync`, tests; the list is run by
`validation.review.pipeline.run_captured`). The actors are sent to by name
(`review_<stage>`), not imported: `pipeline` declares them and imports the stages, which
enqueue through here, so an import would be a cycle. `validation.apps` imports them
(through `validation.actors`) before a message can be sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
from django.db import transaction
from django.utils import timezone

from missions.errors import Conflict
from missions.outbox import publish_on_commit
from missions.transitions import tables
from missions.transitions.machine import Machine, legal_event, move
from validation.models import Review, ReviewState

S = ReviewState
REVIEW = Machine(name="review", model=Review, field="state", table=tables.REVIEW)
ACTIVE = tuple(REVIEW.open_states)
TERMINAL = frozenset(state for state in S.values if state not in ACTIVE)
TERMINAL_EVENT: dict[str, str] = {S.COMPLETED: "completed", S.FAILED: "failed", S.CANCELLED: "cancelled"}
# The cause of a move to a state (the table names it): any other state is the next stage.
CAUSE: dict[str, str] = {S.FAILED: "fail", S.CANCELLED: "cancel"}


def progress(review: Review | int, event: str, **data: Any) -> None:
    """A `review:progress` event on the review's mission stream (after commit)."""
    if isinstance(review, int):
        review = Review.objects.only("pk", "mission_id", "state").get(pk=review)
    if review.mission_id is None:
        return  # a review without a mission has no stream; its state is read from the API
    publish_on_commit(review.mission_id, "review:progress", {"review": review.pk, "event": event, **data})


def transition(review_id: int, *, old: str | Iterable[str], new: str, **fields: Any) -> bool:
    """Move the review from its state, if that is one of `old`, to `new`. A pair the
    table does not hold raises `IllegalTransition` before anything is read."""
    olds = [old] if isinstance(old, str) else list(old)
    cause = CAUSE.get(new, "advance")
    for each in olds:
        legal_event(REVIEW, each, new, cause)
    if new in TERMINAL:
        fields.setdefault("completed_at", timezone.now())
    with transaction.atomic():
        review = Review.objects.filter(pk=review_id).only("pk", "mission_id", "state").first()
        if review is None or review.state not in olds:
            return False
        previous = review.state
        if new == S.CANCELLED:
            fields.setdefault("failure_stage", previous)
        # The engine takes the mission's lock before the review's row, as every step takes
        # it (its event's counter is on the mission's row): never the other way round.
        if not move(
            REVIEW,
            pk=review_id,
            old=previous,
            new=new,
            cause=cause,
            fields=fields,
            payload={"event": "state", "previous": previous, **_why(fields)},
            mission_id=review.mission_id,
            instance=review,
        ):
            return False
        if new in TERMINAL:
            progress(review, TERMINAL_EVENT[new], state=new, **_why(fields))
    return True


def _why(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: fields[k] for k in ("failure_code", "failure_stage") if fields.get(k)}


def review_fail(review_id: int, *, code: str, stage: str, reason: str) -> bool:
    return transition(
        review_id, old=ACTIVE, new=S.FAILED, failure_code=code, failure_stage=stage, failure_reason=reason[:4000]
    )


def review_cancel(*, review: Review, user=None) -> Review:
    who = getattr(user, "get_username", lambda: "")() if user is not None else ""
    reason = f"cancelled by {who}" if who else "cancelled"
    if not transition(review.pk, old=ACTIVE, new=S.CANCELLED, failure_code="cancelled", failure_reason=reason):
        review.refresh_from_db()
        raise Conflict(f"the review is already {review.state}", code="review_finished", extra={"state": review.state})
    review.refresh_from_db()
    return review


def is_cancelled(review_id: int) -> bool:
    return Review.objects.filter(pk=review_id, state=S.CANCELLED).exists()


# Where the next stage goes.
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
