"""The review state machine: one function changes a review's state.

initializing -> candidates_running -> candidates_complete -> evaluating ->
evaluation_complete -> rendering -> completed, or failed / cancelled from any
non-terminal state. A transition is a compare-and-swap on the old state plus a
`review:progress` event on the mission's stream after commit; zero rows updated means
another worker (or a cancel) won, and the caller stops.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from missions.errors import Conflict
from missions.locks import lock_mission
from missions.outbox import publish_on_commit
from validation.models import Review, ReviewState

S = ReviewState
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
ACTIVE = tuple(s for s in S.values if s not in TERMINAL)
NEXT: dict[str, str] = {
    S.INITIALIZING: S.CANDIDATES_RUNNING,
    S.CANDIDATES_RUNNING: S.CANDIDATES_COMPLETE,
    S.CANDIDATES_COMPLETE: S.EVALUATING,
    S.EVALUATING: S.EVALUATION_COMPLETE,
    S.EVALUATION_COMPLETE: S.RENDERING,
    S.RENDERING: S.COMPLETED,
}
TERMINAL_EVENT: dict[str, str] = {S.COMPLETED: "completed", S.FAILED: "failed", S.CANCELLED: "cancelled"}


def progress(review: Review | int, event: str, **data: Any) -> None:
    """A `review:progress` event on the review's mission stream (after commit)."""
    if isinstance(review, int):
        review = Review.objects.only("pk", "mission_id", "state").get(pk=review)
    if review.mission_id is None:
        return  # a review without a mission has no stream; its state is read from the API
    publish_on_commit(review.mission_id, "review:progress", {"review": review.pk, "event": event, **data})


def transition(review_id: int, *, old: str | Iterable[str], new: str, **fields: Any) -> bool:
    olds = [old] if isinstance(old, str) else list(old)
    if new not in TERMINAL and any(NEXT.get(o) != new for o in olds):
        raise ValueError(f"no review transition {olds} -> {new}")
    now = timezone.now()
    if new in TERMINAL:
        fields.setdefault("completed_at", now)
    with transaction.atomic():
        review = Review.objects.filter(pk=review_id).only("pk", "mission_id", "state").first()
        if review is None or review.state not in olds:
            return False
        if review.mission_id is not None:
            # The mission's lock before the review's row, as every step takes it (its
            # event's counter is on the mission's row): never the other way round.
            lock_mission(review.mission_id)
        previous = review.state
        if new == S.CANCELLED:
            fields.setdefault("failure_stage", previous)
        if not Review.objects.filter(pk=review_id, state=previous).update(state=new, updated_at=now, **fields):
            return False
        review.state = new
        progress(review, "state", state=new, previous=previous, **_why(fields))
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
