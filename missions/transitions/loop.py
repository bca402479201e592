"""The feature loop's machine (docs/TRUTH.md; docs/ARCHITECTURE.md, "State machines"):
`MissionFeature.loop_state` on its table (`missions.transitions.tables.FEATURE`, the
causes of each move in `LOOP_CAUSES`), and the one function that changes it.

A move is the engine's (`missions.transitions.machine`): a compare-and-swap on the old
state, an audit row naming the cause (and the user for operator actions) and a
`feature:updated` event after commit. Zero rows updated means another worker won the race:
not an error, the caller just stops. `status` follows the loop (`STATUS_FOR_LOOP`), and a
feature that leaves a done state reopens its slice, milestone and mission
(`missions.transitions.progress`).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from missions.models import FeatureStatus, LoopState, MissionFeature
from missions.transitions import tables
from missions.transitions.machine import Machine, legal_event, move
from missions.transitions.progress import reopen_for_feature

S = LoopState

# Loop states that count as done for slices, milestones, the mission and the autopilot.
DONE_STATES = frozenset({S.PASSED, S.SUPERSEDED})

# Feature.status follows the loop; idle keeps whatever planning status it has.
STATUS_FOR_LOOP: dict[str, str] = {
    S.IMPLEMENTING: FeatureStatus.IN_PROGRESS,
    S.VALIDATING: FeatureStatus.IN_PROGRESS,
    S.NEEDS_FIX: FeatureStatus.IN_PROGRESS,
    S.PASSED: FeatureStatus.DONE,
    S.BLOCKED: FeatureStatus.BLOCKED,
    S.SUPERSEDED: FeatureStatus.DONE,
}

FEATURE = Machine(name="feature", model=MissionFeature, field="loop_state", table=tables.FEATURE)


def feature_transition(
    *,
    feature: MissionFeature | int,
    old: str,
    new: str,
    cause: str,
    actor_id: int | None = None,
    reason: str = "",
    fields: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
    mission_id: int | None = None,
) -> bool:
    """Move one feature from `old` to `new`. Returns False when another writer won.
    `mission_id`: the feature's mission, when the caller has it (one query fewer)."""
    feature_id = feature if isinstance(feature, int) else feature.pk
    if mission_id is None and isinstance(feature, MissionFeature):
        mission_id = feature.mission_id
    updates: dict[str, Any] = dict(fields or {})
    if new in STATUS_FOR_LOOP:
        updates.setdefault("status", STATUS_FOR_LOOP[new])
    legal_event(FEATURE, old, new, cause)  # an illegal pair is refused before the transaction
    # No savepoint (two statements fewer on every move of the loop): the move and the
    # reopening fail together, and with them the caller's transaction.
    with transaction.atomic(savepoint=False):
        if not move(
            FEATURE,
            pk=feature_id,
            old=old,
            new=new,
            cause=cause,
            actor_id=actor_id,
            fields=updates,
            payload={"status": updates.get("status"), **({"reason": reason} if reason else {}), **(payload or {})},
            mission_id=mission_id,
        ):
            return False
        if old in DONE_STATES and new not in DONE_STATES:
            reopen_for_feature(feature_id=feature_id, cause=cause)
    if isinstance(feature, MissionFeature):
        feature.refresh_from_db()
    return True
