"""The contract assertion state machine (docs/ARCHITECTURE.md, "State machines"):
`ContractAssertion.status`, set by the verdicts of validator runs
(`validation/services/verdicts/complete.py`).

| from                             | to                               | cause   | event            |
|----------------------------------|----------------------------------|---------|------------------|
| pending, passed, failed, blocked | passed, failed, blocked (≠ from) | verdict | assertion:judged |

An assertion is created `pending` (`assertion:created`) and never goes back to it. A verdict
that repeats the assertion's status is no move (the run records it).
"""

from __future__ import annotations

from typing import Any

from missions.models import AssertionStatus, ContractAssertion
from missions.transitions.machine import Machine, Table, move

S = AssertionStatus
EVENT = "assertion:judged"
JUDGED = (S.PASSED, S.FAILED, S.BLOCKED)

TRANSITIONS: Table = {old: {new: {"verdict": EVENT} for new in JUDGED if new != old} for old in S.values}

ASSERTION = Machine(name="assertion", model=ContractAssertion, field="status", table=TRANSITIONS)


def assertion_transition(
    *,
    assertion: ContractAssertion | int,
    old: str,
    new: str,
    cause: str,
    actor_id: int | None = None,
    fields: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
) -> bool:
    """Move one assertion from `old` to `new`. Returns False when another writer won; a
    `ContractAssertion` passed in holds the new status after a move."""
    pk = assertion if isinstance(assertion, int) else assertion.pk
    mission_id = None if isinstance(assertion, int) else assertion.mission_id
    moved = move(
        ASSERTION,
        pk=pk,
        old=old,
        new=new,
        cause=cause,
        actor_id=actor_id,
        fields=fields,
        payload=payload,
        mission_id=mission_id,
    )
    if moved and isinstance(assertion, ContractAssertion):
        assertion.status = new
    return moved
