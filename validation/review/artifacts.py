"""Review artifacts: every prompt, answer, contract event and result, stored with its
UTF-8 byte length and sha256, and verified before anything is answered from them.

Names are unique per review, and storing is idempotent by name (a redelivered stage
finds what it stored before and does not pay for it again). JSON artifacts are stored in
their RFC 8785 canonical form, so the same content always has the same hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from django.db import IntegrityError, transaction

from validation.journal import canonical
from validation.models import Review, ReviewArtifact

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
