"""Milestone rollup (docs/TRUTH.md), recomputed in the caller's transaction.

Precedence: not_started (no assertions) > failed > blocked > needs_coverage (a
feature-scoped assertion linked to no feature) > passed (all passed) > ready.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone

from missions.events import publish_on_commit
from missions.models import AssertionScope, AssertionStatus, ContractAssertion, Milestone, RollupState


def rollup_counts(*, milestone_id: int) -> dict[str, int]:
    qs = ContractAssertion.objects.filter(milestone_id=milestone_id)
    return qs.aggregate(
        total=Count("id", distinct=True),
        passed=Count("id", filter=Q(status=AssertionStatus.PASSED), distinct=True),
        failed=Count("id", filter=Q(status=AssertionStatus.FAILED), distinct=True),
        blocked=Count("id", filter=Q(status=AssertionStatus.BLOCKED), distinct=True),
        pending=Count("id", filter=Q(status=AssertionStatus.PENDING), distinct=True),
        unlinked=Count("id", filter=Q(scope=AssertionScope.FEATURE, feature_links__isnull=True), distinct=True),
    )


def rollup_state(counts: dict[str, int]) -> str:
    if counts["total"] == 0:
        return RollupState.NOT_STARTED
    if counts["failed"]:
        return RollupState.FAILED
    if counts["blocked"]:
        return RollupState.BLOCKED
    if counts["unlinked"]:
        return RollupState.NEEDS_COVERAGE
    if counts["passed"] == counts["total"]:
        return RollupState.PASSED
    return RollupState.READY


def milestone_rollup(*, milestone_id: int) -> dict[str, Any]:
    counts = rollup_counts(milestone_id=milestone_id)
    return {"milestone": milestone_id, "state": rollup_state(counts), **counts}


def milestone_rollup_refresh(*, milestone_ids: Iterable[int]) -> None:
    """Recompute, store and announce the rollup of each milestone whose inputs changed."""
    for milestone_id in sorted(set(milestone_ids)):
        rollup = milestone_rollup(milestone_id=milestone_id)
        row = Milestone.objects.filter(pk=milestone_id).values("mission_id", "validation_state").first()
        if row is None:
            continue
        if row["validation_state"] != rollup["state"]:
            Milestone.objects.filter(pk=milestone_id).update(
                validation_state=rollup["state"], updated_at=timezone.now()
            )
        publish_on_commit(row["mission_id"], "milestone:validation:updated", rollup)
