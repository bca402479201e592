"""Retrieval: never blocks, never truncates, never answers from unverified data.

- running: the state, and where to follow it;
- failed / cancelled: a view without an answer, with the reason;
- completed: the report and the accounting, after every stored artifact, the request
  and the manifest have been verified (a mismatch is `review_integrity_error`).
  Content larger than the inline limit is not cut: its verified download link is given.
"""

from __future__ import annotations

import json
from typing import Any

from missions.errors import Conflict, NotFound
from validation.models import Review, ReviewArtifact
from validation.review import artifacts
from validation.review.state import TERMINAL, S

INLINE_LIMIT = 48 * 1024


class ReviewIntegrityError(Conflict):
    code = "review_integrity_error"


def urls(review: Review) -> dict[str, Any]:
    base = f"/api/reviews/{review.pk}/"
    return {
        "review_url": base,
        "result_url": f"{base}result/",
        "cancel_url": f"{base}cancel/",
        "events_url": f"/events/missions/{review.mission_id}/" if review.mission_id else None,
    }


def receipt(review: Review) -> dict[str, Any]:
    return {
        "id": review.pk,
        "state": review.state,
        "mission": review.mission_id,
        "feature": review.feature_id,
        "revision": review.revision,
        "profile": review.profile,
        "request_sha256": review.request_sha256,
        **urls(review),
        "detail": "The review runs in the background. Follow review:progress on the event stream, then read "
        "the result once; the result is verified when it is read.",
    }


def _verified(review: Review) -> None:
    problems = artifacts.verify(review, complete=review.state == S.COMPLETED)
    if problems:
        raise ReviewIntegrityError(
            "the stored review does not verify; no result is given", fields={"artifacts": problems}
        )


def _content(review: Review, name: str, *, as_json: bool) -> dict[str, Any]:
    row = ReviewArtifact.objects.get(review=review, name=name)
    out: dict[str, Any] = artifacts.ref(row)
    if row.byte_length <= INLINE_LIMIT:
        out["content"] = json.loads(row.content) if as_json else row.content
    else:
        out["content"] = None
        out["url"] = f"/api/reviews/{review.pk}/artifact/?name={name}"
    return out


def review_result(review: Review) -> dict[str, Any]:
    base = {"id": review.pk, "state": review.state, **urls(review)}
    if review.state not in TERMINAL:
        return {**base, "ready": False, "detail": f"the review is {review.state}; wait for its completed event"}
    if review.state != S.COMPLETED:
        return {
            **base,
            "ready": False,
            "reason": review.failure_reason,
            "failure_code": review.failure_code,
            "failure_stage": review.failure_stage,
        }
    _verified(review)
    return {
        **base,
        "ready": True,
        "verified": True,
        "revision": review.revision,
        "request_sha256": review.request_sha256,
        "evaluator_attempts": review.evaluator_attempts,
        "tokens_in": review.tokens_in,
        "tokens_out": review.tokens_out,
        "report": _content(review, artifacts.REPORT, as_json=False),
        "accounting": _content(review, artifacts.ACCOUNTING, as_json=True),
    }


def verified_artifact(review: Review, name: str) -> ReviewArtifact:
    row = ReviewArtifact.objects.filter(review=review, name=name).first()
    if row is None:
        raise NotFound(f"review {review.pk} has no artifact {name!r}", code="not_found")
    _verified(review)
    return row
