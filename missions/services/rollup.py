"""Milestone rollup (docs/TRUTH.md), recomputed in the caller's transaction.

Precedence: not_started (no assertions) > failed > blocked > needs_coverage (a
feature-scoped assertion linked to no feature) > passed (all passed) > ready.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.utils import timezone

from missions.events import publish_on_commit
from missions.models import Milestone
from missions.selectors import milestone_rollup


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
