"""The feature loop state machine (docs/TRUTH.md; docs/ARCHITECTURE.md, "State
machines"): the table, and the one function that changes a feature's `loop_state`.

A transition is a move of the engine (`missions.transitions.machine`): a compare-and-swap
on the old state, an audit row naming the cause (and the user for operator actions) and a
`feature:updated` event after commit. Zero rows updated means another worker won the race:
not an error, the caller just stops. `status` follows the loop (`STATUS_FOR_LOOP`), and a
feature that leaves a done state reopens its slice, milestone and mission
(`missions.transitions.progress`).

| from         | to                                                    | causes (see TRANSITIONS)   |
|--------------|-------------------------------------------------------|----------------------------|
| idle         | implementing, validating, blocked, passed, superseded | task_linked, validate, ... |
| implementing | validating, blocked, passed, superseded               | task_done, validate, ...   |
| validating   | passed, needs_fix, blocked, implementing, superseded  | pass, fail, blocked, ...   |
| needs_fix    | implementing, validating, blocked, passed, superseded | fix_created, re_run, ...   |
| passed       | idle, implementing, validating, blocked, needs_fix    | contract_changed, ...      |
| blocked      | implementing, validating, superseded                  | clear, re_run, resume      |
| superseded   | (closed)                                              |                            |

Every move publishes `feature:updated`.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from missions.models import FeatureStatus, LoopState, MissionFeature
from missions.transitions.machine import Machine, legal_event, move
from missions.transitions.progress import reopen_for_feature

S = LoopState

# old state -> {new state: the causes that may move it there}
SUPERSEDE = frozenset({"superseded"})

TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    S.IDLE: {
        S.IMPLEMENTING: frozenset({"task_linked"}),
        S.VALIDATING: frozenset({"validate", "recovery", "root_revalidation", "contract_changed"}),
        S.BLOCKED: frozenset({"no_assertions", "workspace_unavailable", "fingerprint_failures"}),
        S.PASSED: frozenset({"fingerprint_reuse"}),
        S.SUPERSEDED: SUPERSEDE,
    },
    S.IMPLEMENTING: {
        S.VALIDATING: frozenset({"task_done", "validate", "recovery", "re_run", "root_revalidation"}),
        S.BLOCKED: frozenset(
            {"fingerprint_failures", "operator", "budget_exhausted", "no_assertions", "workspace_unavailable"}
        ),
        S.PASSED: frozenset({"fingerprint_reuse"}),
        S.SUPERSEDED: SUPERSEDE,
    },
    S.VALIDATING: {
        S.PASSED: frozenset({"pass", "fingerprint_reuse"}),
        S.NEEDS_FIX: frozenset({"fail"}),
        S.BLOCKED: frozenset(
            {
                "blocked",
                "validator_unavailable",
                # A run that ended `error` for want of a sandbox or an environment
                # (validation/services/verdicts/complete.py ERROR_STOP_REASONS).
                "sandbox_unavailable",
                "environment_failed",
                "operator",
                "fingerprint_failures",
                "workspace_unavailable",
                "no_assertions",
            }
        ),
        S.IMPLEMENTING: frozenset({"recovery", "clear"}),
        S.SUPERSEDED: SUPERSEDE,
    },
    S.NEEDS_FIX: {
        S.IMPLEMENTING: frozenset({"fix_created", "task_linked", "clear"}),
        S.VALIDATING: frozenset({"validate", "re_run", "task_done", "recovery", "root_revalidation"}),
        S.BLOCKED: frozenset(
            {"budget_exhausted", "operator", "fingerprint_failures", "no_assertions", "workspace_unavailable"}
        ),
        S.PASSED: frozenset({"fingerprint_reuse"}),
        S.SUPERSEDED: SUPERSEDE,
    },
    S.PASSED: {
        S.IDLE: frozenset({"contract_changed"}),
        S.IMPLEMENTING: frozenset({"clear", "task_linked"}),
        S.VALIDATING: frozenset({"re_run", "validate", "root_revalidation", "milestone_regression"}),
        S.BLOCKED: frozenset({"fingerprint_failures", "no_assertions", "workspace_unavailable"}),
        S.NEEDS_FIX: frozenset({"milestone_regression"}),
    },
    # Only an operator's clear or re-run, or a mission resume, leaves `blocked`; never a
    # reused pass (docs/TRUTH.md). A blocked fix whose root passed is closed as superseded.
    # `source_available`: the commit a `workspace_unavailable` block waited for is now at
    # the source, and the recovery sweep judges it (a new run, never a reuse).
    S.BLOCKED: {
        S.IMPLEMENTING: frozenset({"clear", "resume"}),
        S.VALIDATING: frozenset({"re_run", "resume", "source_available"}),
        S.SUPERSEDED: SUPERSEDE,
    },
    # Closed: a superseded fix is done for rollups and the autopilot and is never judged again.
    S.SUPERSEDED: {},
}

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


EVENT = "feature:updated"

FEATURE = Machine(
    name="feature",
    model=MissionFeature,
    field="loop_state",
    table={
        old: {new: dict.fromkeys(causes, EVENT) for new, causes in moves.items()} for old, moves in TRANSITIONS.items()
    },
)


def is_allowed(old: str, new: str, cause: str) -> bool:
    return cause in TRANSITIONS.get(old, {}).get(new, frozenset())


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
