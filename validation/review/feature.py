"""The "Review" action on a feature: a review request filled from the feature.

title + description -> objective; mission and acceptance-criteria text -> background;
linked assertions -> acceptanceCriteria; the latest task -> changeSummary and revision;
the latest judged validator run -> verification evidence (or `not_run` with the reason).
The review is advisory: nothing here touches the feature's loop state.
"""

from __future__ import annotations

from typing import Any

from missions.errors import Conflict
from missions.models import AssertionScope, MissionFeature, Task
from missions.selectors import latest_done_task
from validation.models import RunStatus, ValidatorRun
from validation.review.preflight import Preflight, review_create

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
