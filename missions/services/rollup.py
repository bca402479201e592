"""Milestone rollup (docs/TRUTH.md), recomputed in the caller's transaction.

Precedence: not_started (no assertions) > failed > blocked > needs_coverage (a
feature-scoped assertion linked to no feature) > passed (all passed) > ready. The stored
`validation_state` changes only here, through its machine
(`missions.transitions.moves.milestone_validation_transition`).
"""

from __future__ import annotations

from collections.abc import Iterable

from missions.models import Milestone
from missions.outbox import publish_on_commit
from missions.selectors import milestone_rollup_and_stored
from missions.transitions import milestone_validation_transition
from missions.transitions.tables import ROLLUP_EVENT


def milestone_rollup_refresh(*, milestone_ids: Iterable[int]) -> None:
    """Recompute, store and announce the rollup of each milestone whose inputs changed."""
    for milestone_id in sorted(set(milestone_ids)):
        found = milestone_rollup_and_stored(milestone_id=milestone_id)
        if found is None:
            continue  # deleted
        rollup, row = found
        while True:  # a lost compare-and-swap reads the winner's state and moves on from it
            mission_id, state = row
            if state == rollup["state"]:
                publish_on_commit(mission_id, ROLLUP_EVENT, rollup)
                break
            if milestone_validation_transition(milestone=milestone_id, old=state, new=rollup["state"], rollup=rollup):
                break  # the move published the rollup
            again = Milestone.objects.filter(pk=milestone_id).values_list("mission_id", "validation_state").first()
            if again is None:
                break
            row = again
