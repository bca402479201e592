"""Review artifacts, and the result answered from them.

Every prompt, answer, contract event and result is stored with its UTF-8 byte length and
sha256, and verified before anything is answered from it. Names are unique per review,
and storing is idempotent by name (a redelivered stage finds what it stored before and
does not pay for it again). JSON artifacts are stored in their RFC 8785 canonical form,
so the same content always has the same hash.

Retrieval never blocks, never truncates, never answers from unverified data:
- running: the state, and where to follow it;
- failed / cancelled: a view without an answer, with the reason;
- completed: the report and the accounting, after every stored artifact, the request
  and the manifest have been verified (a mismatch is `review_integrity_error`).
  Content larger than the inline limit is not cut: its verified download link is given.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from django.db import IntegrityError, transaction

from missions.errors import Conflict, NotFound
from validation.journal import canonical
from validation.models import Review, ReviewArtifact
from validation.review.state import TERMINAL, S

MANIFEST = "result.json"
REPORT = "report.md"
ACCOUNTING = "accounting.json"


def digest(content: str) -> tuple[int, str]:
    data = content.encode("utf-8")
    return len(data), hashlib.sha256(data).hexdigest()


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(content: str) -> str:
    """Text every database can hold: NUL and lone surrogates (a model may answer them)
    become U+FFFD before the content is hashed, so the hash is of what is stored."""
    return _UNSTORABLE.sub("\ufffd", content)


def store(review_id: int, *, kind: str, name: str, content: str) -> ReviewArtifact:
    existing = ReviewArtifact.objects.filter(review_id=review_id, name=name).first()
    if existing is not None:
        return existing
    content = storable(content)
    length, sha = digest(content)
    try:
        with transaction.atomic():
            return ReviewArtifact.objects.create(
                review_id=review_id, kind=kind, name=name, content=content, byte_length=length, sha256=sha
            )
    except IntegrityError:  # a concurrent delivery of the same stage stored it first
        return ReviewArtifact.objects.get(review_id=review_id, name=name)


def store_json(review_id: int, *, kind: str, name: str, value: Any) -> ReviewArtifact:
    return store(review_id, kind=kind, name=name, content=canonical(value).decode("utf-8"))


def text(review_id: int, name: str) -> str | None:
    return ReviewArtifact.objects.filter(review_id=review_id, name=name).values_list("content", flat=True).first()


def load_json(review_id: int, name: str) -> Any:
    content = text(review_id, name)
    return None if content is None else json.loads(content)


def exists(review_id: int, name: str) -> bool:
    return ReviewArtifact.objects.filter(review_id=review_id, name=name).exists()


def ref(artifact: ReviewArtifact) -> dict[str, Any]:
    return {
        "name": artifact.name,
        "kind": artifact.kind,
        "byte_length": artifact.byte_length,
        "sha256": artifact.sha256,
    }


# --- verification -------------------------------------------------------------------------


def _artifact_problem(artifact: ReviewArtifact) -> str | None:
    try:
        data = artifact.content.encode("utf-8")  # strict: a lone surrogate is corruption
    except UnicodeEncodeError:
        return f"{artifact.name}: the content is not valid UTF-8"
    if len(data) != artifact.byte_length:
        return f"{artifact.name}: {len(data)} bytes stored, {artifact.byte_length} recorded"
    if hashlib.sha256(data).hexdigest() != artifact.sha256:
        return f"{artifact.name}: the sha256 of the content does not match the recorded one"
    return None


def _request_problems(review: Review) -> list[str]:
    problems = []
    if canonical(review.request).decode("utf-8") != review.canonical_request:
        problems.append("request: the stored request does not match its canonical JSON")
    if hashlib.sha256(review.canonical_request.encode("utf-8")).hexdigest() != review.request_sha256:
        problems.append("request: the canonical JSON does not match the recorded sha256")
    return problems


def _manifest_problems(review: Review, artifacts: dict[str, ReviewArtifact]) -> list[str]:
    manifest_row = artifacts.get(MANIFEST)
    if manifest_row is None:
        return [f"{MANIFEST}: the result manifest is missing"]
    try:
        manifest = json.loads(manifest_row.content)
    except ValueError:
        return [f"{MANIFEST}: not JSON"]
    problems = []
    if manifest.get("review") != review.pk or manifest.get("request_sha256") != review.request_sha256:
        problems.append(f"{MANIFEST}: names another review or request")
    listed = manifest.get("artifacts", [])
    for entry in listed:
        row = artifacts.get(entry.get("name"))
        if row is None:
            problems.append(f"{entry.get('name')}: listed in the manifest but missing")
        elif (row.byte_length, row.sha256) != (entry.get("byte_length"), entry.get("sha256")):
            problems.append(f"{row.name}: differs from the manifest")
    for key, name in (("report", REPORT), ("accounting", ACCOUNTING)):
        entry = manifest.get(key) or {}
        row = artifacts.get(name)
        if row is None or (row.byte_length, row.sha256) != (entry.get("byte_length"), entry.get("sha256")):
            problems.append(f"{name}: missing or different from the manifest")
    label_map = artifacts.get("anonymous_map.json")
    try:
        stored_map = json.loads(label_map.content) if label_map is not None else None
    except ValueError:
        stored_map = None
    if stored_map != review.label_map:
        problems.append("anonymous_map.json: the stored label map does not match the review")
    return problems


def verify(review: Review, *, complete: bool) -> list[str]:
    """Every integrity problem of a review's stored data ([] when it all verifies)."""
    artifacts = {a.name: a for a in ReviewArtifact.objects.filter(review=review)}
    problems = [p for p in (_artifact_problem(a) for a in artifacts.values()) if p]
    problems += _request_problems(review)
    if complete:
        problems += _manifest_problems(review, artifacts)
    return problems


INLINE_LIMIT = 48 * 1024


# The result, answered from verified artifacts.
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
    problems = verify(review, complete=review.state == S.COMPLETED)
    if problems:
        raise ReviewIntegrityError(
            "the stored review does not verify; no result is given", fields={"artifacts": problems}
        )


def _content(review: Review, name: str, *, as_json: bool) -> dict[str, Any]:
    row = ReviewArtifact.objects.get(review=review, name=name)
    out: dict[str, Any] = ref(row)
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
        "report": _content(review, REPORT, as_json=False),
        "accounting": _content(review, ACCOUNTING, as_json=True),
    }


def verified_artifact(review: Review, name: str) -> ReviewArtifact:
    row = ReviewArtifact.objects.filter(review=review, name=name).first()
    if row is None:
        raise NotFound(f"review {review.pk} has no artifact {name!r}", code="not_found")
    _verified(review)
    return row
