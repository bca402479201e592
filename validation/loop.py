"""The feature loop state machine (DESIGN §4.1): the table, and the one function that
changes a feature's `loop_state`.

A transition is a compare-and-swap on the old state, an audit row naming the cause (and
the user for operator actions) and a `feature:updated` event after commit. Zero rows
updated means another worker won the race: not an error, the caller just stops.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from missions.errors import IllegalTransition
from missions.events import lock_mission, publish_on_commit
from missions.models import Feature, FeatureStatus, LoopState

S = LoopState

# old state -> {new state: the causes that may move it there}
TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    S.IDLE: {
        S.IMPLEMENTING: frozenset({"task_linked"}),
        S.VALIDATING: frozenset({"validate", "recovery"}),
        S.BLOCKED: frozenset({"no_assertions", "workspace_unavailable", "fingerprint_failures"}),
        S.PASSED: frozenset({"fingerprint_reuse"}),
    },
    S.IMPLEMENTING: {
        S.VALIDATING: frozenset({"task_done", "validate", "recovery", "re_run", "root_revalidation"}),
        S.BLOCKED: frozenset({"fingerprint_failures", "operator", "budget_exhausted", "no_assertions",
                              "workspace_unavailable"}),
        S.PASSED: frozenset({"fingerprint_reuse", "superseded"}),
    },
    S.VALIDATING: {
        S.PASSED: frozenset({"pass", "fingerprint_reuse"}),
        S.NEEDS_FIX: frozenset({"fail"}),
        S.BLOCKED: frozenset({"blocked", "validator_unavailable", "operator", "fingerprint_failures",
                              "workspace_unavailable", "no_assertions"}),
        S.IMPLEMENTING: frozenset({"recovery", "clear"}),
    },
    S.NEEDS_FIX: {
        S.IMPLEMENTING: frozenset({"fix_created", "task_linked", "clear"}),
        S.VALIDATING: frozenset({"validate", "re_run", "task_done", "recovery", "root_revalidation"}),
        S.BLOCKED: frozenset({"budget_exhausted", "operator", "fingerprint_failures", "no_assertions",
                              "workspace_unavailable"}),
        S.PASSED: frozenset({"superseded", "fingerprint_reuse"}),
    },
    S.PASSED: {
        S.IMPLEMENTING: frozenset({"clear", "task_linked"}),
        S.VALIDATING: frozenset({"re_run", "validate", "root_revalidation", "milestone_regression"}),
        S.BLOCKED: frozenset({"fingerprint_failures", "no_assertions", "workspace_unavailable"}),
        S.NEEDS_FIX: frozenset({"milestone_regression"}),
    },
    S.BLOCKED: {
        S.IMPLEMENTING: frozenset({"clear", "resume"}),
        S.VALIDATING: frozenset({"re_run", "resume"}),
        S.PASSED: frozenset({"fingerprint_reuse"}),
    },
}

# Feature.status follows the loop; idle keeps whatever planning status it has.
STATUS_FOR_LOOP = {
    S.IMPLEMENTING: FeatureStatus.IN_PROGRESS,
    S.VALIDATING: FeatureStatus.IN_PROGRESS,
    S.NEEDS_FIX: FeatureStatus.IN_PROGRESS,
    S.PASSED: FeatureStatus.DONE,
    S.BLOCKED: FeatureStatus.BLOCKED,
}


def is_allowed(old: str, new: str, cause: str) -> bool:
    return cause in TRANSITIONS.get(old, {}).get(new, frozenset())


def feature_transition(
    *, feature: Feature | int, old: str, new: str, cause: str, actor_id: int | None = None,
    reason: str = "", fields: dict[str, Any] | None = None, payload: dict[str, Any] | None = None,
) -> bool:
    """Move one feature from `old` to `new`. Returns False when another writer won."""
    if not is_allowed(old, new, cause):
        raise IllegalTransition(f"a feature cannot go from {old} to {new} by {cause}",
                                extra={"from": old, "to": new, "cause": cause})
    feature_id = feature if isinstance(feature, int) else feature.pk
    updates: dict[str, Any] = {"loop_state": new, "updated_at": timezone.now(), **(fields or {})}
    if new in STATUS_FOR_LOOP:
        updates.setdefault("status", STATUS_FOR_LOOP[new])
    with transaction.atomic():
        lock_mission(Feature.objects.values_list("mission_id", flat=True).get(pk=feature_id))
        if not Feature.objects.filter(pk=feature_id, loop_state=old).update(**updates):
            return False
        mission_id = Feature.objects.filter(pk=feature_id).values_list("mission_id", flat=True).get()
        publish_on_commit(mission_id, "feature:updated", {
            "feature": feature_id, "from": old, "loop_state": new, "status": updates.get("status"), "cause": cause,
            **({"reason": reason} if reason else {}), **(payload or {}),
        }, actor_id=actor_id)
    if isinstance(feature, Feature):
        feature.refresh_from_db()
    return True
