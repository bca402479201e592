"""The slice state machine (docs/ARCHITECTURE.md, "State machines"):
`Slice.status`.

| from     | to       | cause               | event           | who                                      |
|----------|----------|---------------------|-----------------|------------------------------------------|
| pending  | active   | activate            | slice:activated | progress.slice_activate (`activated_at`) |
| active   | complete | complete            | slice:completed | every feature done (1)                   |
| complete | active   | any (what undid it) | slice:reopened  | progress.reopen_slice, a fix lands in it |

(1) The autopilot, or a person validating the slice's milestone, who starts a pending
slice first (`validation/services/operator.py: milestone_validate`).

A slice is created `pending` (`slice:created`).
"""

from __future__ import annotations

from typing import Any

from missions.models import Slice, SliceStatus
from missions.transitions.machine import Machine, Table, move

S = SliceStatus

TRANSITIONS: Table = {
    S.PENDING: {S.ACTIVE: {"activate": "slice:activated"}},
    S.ACTIVE: {S.COMPLETE: {"complete": "slice:completed"}},
    # Anything that undoes a completion reopens the slice; the cause is what undid it.
    S.COMPLETE: {S.ACTIVE: "slice:reopened"},
}

SLICE = Machine(name="slice", model=Slice, field="status", table=TRANSITIONS)


def slice_transition(
    *,
    slice_: Slice | int,
    old: str,
    new: str,
    cause: str,
    actor_id: int | None = None,
    fields: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
) -> bool:
    """Move one slice from `old` to `new`. Returns False when another writer won (a
    `Slice` passed in is not refreshed)."""
    pk = slice_ if isinstance(slice_, int) else slice_.pk
    return move(SLICE, pk=pk, old=old, new=new, cause=cause, actor_id=actor_id, fields=fields, payload=payload)
