"""Creating a review: the durable preflight, and the request filled from a feature.

`review_create` validates, resolves, pins and records — then, after commit, starts. It
commits the normalized request, its RFC 8785 canonical JSON and sha256, the pinned
revision, the resolved profile and the review in state `initializing` (with the request
and canonical input as artifacts) in one transaction. The first pipeline stage is
enqueued only by `transaction.on_commit`: nothing runs before the record exists, and
nothing runs at all if the transaction rolls back.

`feature_review` is the "Review" action on a feature: title + description -> objective;
mission and acceptance-criteria text -> background; linked assertions ->
acceptanceCriteria; the latest task -> changeSummary and revision; the latest judged
validator run -> verification evidence (or `not_run` with the reason). The review is
advisory: nothing here touches the feature's loop state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from fusion_site.repos import snapshots
from missions import selectors
from missions.errors import Conflict, Invalid
from missions.locks import lock_mission
from missions.models import AssertionScope, Mission, MissionFeature, Task
from missions.selectors import latest_done_task
from validation.models import Review, RunStatus, ValidatorRun
from validation.review import artifacts
from validation.review.profiles import public_model, resolve_profile
from validation.review.request import normalize_request, request_digest, review_subject
from validation.review.state import enqueue, progress

INPUT_SCHEMA = "fusion-missions.review-input.v1"
IDEMPOTENCY_KEY = re.compile(r"\A[\x21-\x7e]{1,200}\Z")


@dataclass
class Preflight:
    review: Review
    created: bool


def _visible(user, *, unrestricted: bool):
    return Mission.objects.all() if unrestricted else selectors.visible_missions(user=user)


def _resolve(request: dict[str, Any], user, *, unrestricted: bool) -> tuple[Mission | None, MissionFeature | None]:
    missions = _visible(user, unrestricted=unrestricted)
    mission = feature = None
    ref = request.get("mission")
    if ref is not None:
        mission = missions.filter(**({"pk": ref} if isinstance(ref, int) else {"key": ref})).first()
        if mission is None:
            raise Invalid(f"no mission {ref!r}", code="unknown_reference", fields={"mission": ["no such mission"]})
    ref = request.get("feature")
    if ref is not None:
        features = MissionFeature.objects.filter(mission__in=missions).select_related("mission")
        if isinstance(ref, str):
            if mission is None:
                raise Invalid(
                    "a feature key needs the mission too",
                    code="unknown_reference",
                    fields={"feature": ["give a feature id, or the mission with the key"]},
                )
            features = features.filter(mission=mission, key=ref)
        else:
            features = features.filter(pk=ref)
        feature = features.first()
        if feature is None:
            raise Invalid(f"no feature {ref!r}", code="unknown_reference", fields={"feature": ["no such feature"]})
        if mission is not None and feature.mission_id != mission.pk:
            raise Invalid(
                "the feature belongs to another mission",
                code="unknown_reference",
                fields={"feature": ["belongs to another mission"]},
            )
        mission = feature.mission
    return mission, feature


def _pin(mission: Mission | None, revision: str | None) -> str:
    """The full commit the reviewers will read ('' when no repository is attached)."""
    if mission is None or not mission.repository:
        if revision:
            raise Invalid(
                "a revision needs a mission with a repository",
                code="revision_unavailable",
                fields={"revision": ["no repository to resolve it in"]},
            )
        return ""
    try:
        return snapshots.pin_revision(mission.source(), revision or "HEAD")
    except snapshots.SnapshotError as exc:
        raise Invalid(str(exc), code="revision_unavailable", fields={"revision": [str(exc)]}) from exc


def canonical_input(*, request_text: str, sha256: str, revision: str, source: str) -> dict[str, Any]:
    return {
        "schema_version": INPUT_SCHEMA,
        "workflow": "review",
        "revision": revision,
        "request": {"source": source, "authority": "user", "text": request_text, "sha256": sha256},
        "context": {"kind": "clean_task", "declared_sources": []},
    }


def _check_key(key: str | None) -> str:
    key = (key or "").strip()
    if key and not IDEMPOTENCY_KEY.match(key):
        raise Invalid(
            "the Idempotency-Key header must be 1-200 visible ASCII characters",
            code="invalid_idempotency_key",
            fields={"Idempotency-Key": ["1-200 visible ASCII characters"]},
        )
    return key


def _replay(existing: Review, sha256: str, profile: str) -> Preflight:
    if existing.request_sha256 != sha256 or existing.profile != profile:
        raise Conflict(
            "this Idempotency-Key was used for a different review request",
            code="idempotency_key_reused",
            extra={"review": existing.pk},
        )
    return Preflight(existing, created=False)


def review_create(
    *,
    body: Any,
    user=None,
    idempotency_key: str | None = None,
    profile: str | None = None,
    source: str = "api",
    unrestricted: bool = False,
) -> Preflight:
    request = normalize_request(body)
    key = _check_key(idempotency_key)
    resolved = resolve_profile(profile)
    text, sha256 = request_digest(request)
    owner = user if getattr(user, "is_authenticated", False) else None
    if key and owner is not None:
        existing = Review.objects.filter(created_by=owner, idempotency_key=key).first()
        if existing is not None:
            return _replay(existing, sha256, resolved["name"])
    mission, feature = _resolve(request, user, unrestricted=unrestricted)
    revision = _pin(mission, request.get("revision"))
    try:
        with transaction.atomic():
            if mission is not None:
                lock_mission(mission.pk)  # before the review's row: the lock order of every step
            review = Review.objects.create(
                mission=mission,
                feature=feature,
                request=request,
                canonical_request=text,
                request_sha256=sha256,
                revision=revision,
                profile=resolved["name"],
                idempotency_key=key if owner else "",
                created_by=owner,
                source=source,
            )
            _record_inputs(review, resolved, request)
            progress(review, "state", state=review.state)
            transaction.on_commit(lambda: _start(review.pk))
    except IntegrityError:
        existing = Review.objects.filter(created_by=owner, idempotency_key=key).first() if key and owner else None
        if existing is None:
            raise
        return _replay(existing, sha256, resolved["name"])  # a concurrent request with the same key won
    return Preflight(review, created=True)


def _record_inputs(review: Review, profile: dict[str, Any], request: dict[str, Any]) -> None:
    public = {
        "name": profile["name"],
        "candidates": [public_model(m) for m in profile["candidates"]],
        "evaluator": public_model(profile["evaluator"]),
        **{k: v for k, v in profile.items() if k not in ("name", "candidates", "evaluator")},
    }
    artifacts.store_json(review.pk, kind="request", name="request.json", value=request)
    artifacts.store_json(review.pk, kind="profile", name="profile.json", value=public)
    subject_text, subject_sha = request_digest(review_subject(request))
    artifacts.store_json(
        review.pk,
        kind="input",
        name="canonical_input.json",
        value=canonical_input(
            request_text=subject_text, sha256=subject_sha, revision=review.revision, source=review.source
        ),
    )


def _start(review_id: int) -> None:
    enqueue("start", review_id)


# A review of a feature: the request filled from it.
MAX_ITEM = 2000


def _clip(text: str) -> str:
    text = " ".join(text.split()) if "\n" not in text else text.strip()
    return text if len(text) <= MAX_ITEM else text[: MAX_ITEM - 1] + "…"


def _criteria(feature: MissionFeature) -> list[str]:
    assertions = feature.assertions.filter(scope=AssertionScope.FEATURE).order_by("order", "id")
    criteria = [_clip(f"{a.key}: {a.title}. {a.statement}") for a in assertions]
    if not criteria and feature.acceptance_criteria.strip():
        criteria = [_clip(line.lstrip("-* ")) for line in feature.acceptance_criteria.splitlines() if line.strip(" -*")]
    return criteria


def _task(feature: MissionFeature) -> Task | None:
    done = latest_done_task(features=feature)
    return done or Task.objects.filter(feature=feature).order_by("-id").first()


def _verification(feature: MissionFeature) -> dict[str, Any]:
    run = (
        ValidatorRun.objects.filter(feature=feature, verdict__isnull=False)
        .exclude(status__in=[RunStatus.RUNNING, RunStatus.CANCELLED])
        .order_by("-id")
        .first()
    )
    if run is None:
        last = ValidatorRun.objects.filter(feature=feature).order_by("-id").first()
        reason = (
            "no validator run has judged this feature yet"
            if last is None
            else f"the latest validator run ({last.pk}) ended {last.status} without a verdict"
        )
        return {"status": "not_run", "reason": reason}
    evidence = []
    for item in (run.verdict or {}).get("assertions", []):
        outcome = item.get("verdict", "?") + (f": {item['message']}" if item.get("message") else "")
        evidence.append(
            {
                "check": _clip(
                    f"{item.get('key', '?')} ({run.validator} validator, run {run.pk}, "
                    f"revision {run.revision[:12] or 'unknown'})"
                ),
                "outcome": _clip(outcome),
            }
        )
    if not evidence:
        evidence.append({"check": f"{run.validator} validator, run {run.pk}", "outcome": run.status})
    return {"status": "provided", "evidence": evidence[:100]}


def feature_review_body(feature: MissionFeature) -> dict[str, Any]:
    mission = feature.mission
    criteria = _criteria(feature)
    task = _task(feature)
    summary = (task.summary.strip() or task.title.strip()) if task else ""
    problems = {}
    if not criteria:
        problems["acceptanceCriteria"] = ["the feature has no linked assertions and no acceptance criteria"]
    if not summary:
        problems["changeSummary"] = ["the feature has no task that describes its change"]
    if problems:
        raise Conflict("the feature has nothing to review against yet", code="nothing_to_review", fields=problems)
    background = [_clip(f"Mission {mission.key}: {mission.title}")]
    if mission.description.strip():
        background.append(_clip(mission.description))
    if feature.acceptance_criteria.strip():
        background.append(_clip(f"Acceptance criteria as written on the feature: {feature.acceptance_criteria}"))
    body: dict[str, Any] = {
        "objective": _clip(
            f"{feature.title}\n\n{feature.description}" if feature.description.strip() else feature.title
        ),
        "background": background,
        "changeSummary": _clip(summary),
        "scope": [_clip(f"The change that implements feature {mission.key}/{feature.key} ({feature.title})")],
        "acceptanceCriteria": criteria,
        "verification": _verification(feature),
        "mission": mission.pk,
        "feature": feature.pk,
    }
    if task is not None and task.revision and mission.repository:
        body["revision"] = task.revision
    return body


def feature_review(
    *,
    feature: MissionFeature,
    user=None,
    idempotency_key: str | None = None,
    profile: str | None = None,
    source: str = "feature",
) -> Preflight:
    return review_create(
        body=feature_review_body(feature),
        user=user,
        idempotency_key=idempotency_key,
        profile=profile,
        source=source,
        unrestricted=user is None or bool(getattr(user, "is_staff", False)),
    )
