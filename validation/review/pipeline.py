"""The review pipeline: one Dramatiq actor per stage, each thin (ids in, re-fetch, bail
out when the review is no longer in the state the stage expects).

    start       initializing -> candidates_running, enqueues three `candidate` stages
    candidate   one reviewer (read-only tools on a snapshot of the pinned revision); the
                last one to finish moves candidates_running -> candidates_complete
    evaluate    candidates_complete -> evaluating: anonymize (label map stored first),
                parse, assign source ids, blind evaluator, at most one repair
                -> evaluation_complete
    render      evaluation_complete -> rendering: report + accounting + manifest
                -> completed

The stages are in `validation.review.stages`. A stage that is delivered again resumes
from its stored artifacts and never repeats a model call that was answered. A cancel is
seen between stages (the compare-and-swap fails) and in flight (the model call stops).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import dramatiq
from django.db import DatabaseError
from django.db.models import Max
from django.utils import timezone

from validation.models import Review
from validation.review import artifacts
from validation.review.stages import SLOTS, outcome_name, stage_candidate, stage_evaluate, stage_render, stage_start
from validation.review.state import ACTIVE, Captured, S, actor_name, enqueue, review_fail

logger = logging.getLogger(__name__)

STAGE_TIME_LIMIT_MS = 2 * 3600 * 1000  # a backstop; each model call has the profile's own timeout


def guarded(stage: str, fn: Callable[..., Any], review_id: int, *args: Any) -> Any:
    """Known outcomes are states; a database hiccup is retried by Dramatiq; anything else
    is a host defect that fails the review with its reason instead of leaving it hanging."""
    try:
        return fn(review_id, *args)
    except DatabaseError:
        raise
    except Exception as exc:  # noqa: BLE001
        logger.exception("review %s: stage %s crashed", review_id, stage)
        review_fail(review_id, code="internal_error", stage=stage, reason=f"{type(exc).__name__}: {exc}")
        return "failed"


# --- actors -----------------------------------------------------------------------------------

_ACTOR: dict[str, Any] = dict(
    max_retries=3, min_backoff=1000, max_backoff=30_000, time_limit=STAGE_TIME_LIMIT_MS, queue_name="fusion"
)


@dramatiq.actor(**_ACTOR)
def review_start(review_id: int) -> None:
    guarded("start", stage_start, review_id)


@dramatiq.actor(**_ACTOR)
def review_candidate(review_id: int, slot: int) -> None:
    guarded("candidate", stage_candidate, review_id, slot)


@dramatiq.actor(**_ACTOR)
def review_evaluate(review_id: int) -> None:
    guarded("evaluation", stage_evaluate, review_id)


@dramatiq.actor(**_ACTOR)
def review_render(review_id: int) -> None:
    guarded("render", stage_render, review_id)


ACTORS = {"start": review_start, "candidate": review_candidate, "evaluate": review_evaluate, "render": review_render}
STAGES: dict[str, Callable[..., str]] = {
    "start": stage_start,
    "candidate": stage_candidate,
    "evaluate": stage_evaluate,
    "render": stage_render,
}
# `state.enqueue` sends to these by name.
assert all(actor.actor_name == actor_name(stage) for stage, actor in ACTORS.items())


def run_captured(queue: Captured) -> None:
    """Run captured stages (and the stages they enqueue) in this thread, in order."""
    while queue:
        stage, review_id, args = queue.pop(0)
        guarded(stage, STAGES[stage], review_id, *args)


def live_snapshot_labels() -> set[str]:
    """Snapshot labels of reviews still running (for the recovery sweep's cleanup)."""
    return {f"review-{pk}" for pk in Review.objects.filter(state__in=ACTIVE).values_list("pk", flat=True)}


def reviews_redrive(*, startup: bool = False, grace_seconds: int = 600) -> list[int]:
    """Send again the stage each unfinished review waits for (a lost message, an embedded
    restart). Stages are idempotent and reuse stored answers, so a stage that was in fact
    still running costs at most a duplicate model call, never a wrong state. At start-up
    every unfinished review is re-driven; later only those quiet for `grace_seconds`."""
    quiet_since = timezone.now() - timedelta(seconds=grace_seconds)
    redriven = []
    reviews = Review.objects.filter(state__in=ACTIVE).annotate(last_artifact=Max("artifacts__created_at"))
    for review in reviews:
        last = max(filter(None, [review.updated_at, review.last_artifact]))
        if not startup and last > quiet_since:
            continue
        if review.state == S.INITIALIZING:
            enqueue("start", review.pk)
        elif review.state == S.CANDIDATES_RUNNING:
            missing = [s for s in SLOTS if not artifacts.exists(review.pk, outcome_name(s))]
            for slot in missing or SLOTS[:1]:  # none missing: the last one re-checks completion
                enqueue("candidate", review.pk, slot)
        elif review.state in (S.CANDIDATES_COMPLETE, S.EVALUATING):
            enqueue("evaluate", review.pk)
        else:
            enqueue("render", review.pk)
        redriven.append(review.pk)
    return redriven
