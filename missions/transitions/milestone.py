"""The milestone state machines (docs/ARCHITECTURE.md, "State machines"):
`Milestone.status` (how far the plan has come) and `Milestone.validation_state` (the
rollup of its assertions, derived: written only by
`missions/services/rollup.py:milestone_rollup_refresh`).

`status`:

| from                     | to       | cause               | event               | who                                     |
|--------------------------|----------|---------------------|---------------------|-----------------------------------------|
| pending                  | active   | activate            | milestone:activated | progress.milestone_activate (1)         |
| pending, active, blocked | complete | complete            | milestone:completed | progress.milestone_complete             |
| complete                 | active   | any (what undid it) | milestone:reopened  | progress.reopen_milestone               |

(1) when a slice of it starts (the autopilot; a person validating the milestone), or a
milestone run a person asked for starts (`validation/services/operator.py`).

A milestone is created `pending` (`milestone:created`); nothing sets `blocked` today.

`validation_state` (precedence not_started > failed > blocked > needs_coverage > passed
> ready, `missions.selectors.rollup_state`): any state may move to any other, as the
assertions under the milestone are added, moved, deleted, linked, unlinked or judged;
every move has cause `rollup` and publishes the rollup as `milestone:validation:updated`
(which the refresh also publishes when the state stays).
"""

from __future__ import annotations

from typing import Any

from missions.models import Milestone, MilestoneStatus, RollupState
from missions.transitions.machine import Machine, Table, move

S = MilestoneStatus

TRANSITIONS: Table = {
    S.PENDING: {S.ACTIVE: {"activate": "milestone:activated"}, S.COMPLETE: {"complete": "milestone:completed"}},
    S.ACTIVE: {S.COMPLETE: {"complete": "milestone:completed"}},
    S.BLOCKED: {S.COMPLETE: {"complete": "milestone:completed"}},
    # Anything that undoes a completion reopens the milestone; the cause is what undid it.
    S.COMPLETE: {S.ACTIVE: "milestone:reopened"},
}

MILESTONE = Machine(name="milestone", model=Milestone, field="status", table=TRANSITIONS)

ROLLUP_EVENT = "milestone:validation:updated"

VALIDATION_TRANSITIONS: Table = {
    old: {new: {"rollup": ROLLUP_EVENT} for new in RollupState.values if new != old} for old in RollupState.values
}

MILESTONE_VALIDATION = Machine(
    name="milestone", model=Milestone, field="validation_state", table=VALIDATION_TRANSITIONS
)


def milestone_transition(
    *,
    milestone: Milestone | int,
    old: str,
    new: str,
    cause: str,
    actor_id: int | None = None,
    fields: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
) -> bool:
    """Move one milestone's `status` from `old` to `new`. Returns False when another
    writer won (a `Milestone` passed in is not refreshed)."""
    pk = milestone if isinstance(milestone, int) else milestone.pk
    return move(MILESTONE, pk=pk, old=old, new=new, cause=cause, actor_id=actor_id, fields=fields, payload=payload)


def milestone_validation_transition(*, milestone: Milestone | int, old: str, new: str, rollup: dict[str, Any]) -> bool:
    """Store a milestone's new rollup state (the one writer is the rollup refresh) and
    publish the rollup. Returns False when another writer won."""
    pk = milestone if isinstance(milestone, int) else milestone.pk
    return move(MILESTONE_VALIDATION, pk=pk, old=old, new=new, cause="rollup", payload=rollup)
