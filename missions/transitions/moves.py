"""The plan's machines (docs/ARCHITECTURE.md, "State machines"): each state field bound to
its table (`missions.transitions.tables`), and the one function that changes it. The
feature loop's is `missions.transitions.loop` (its moves also set `status` and reopen
what a feature leaving `passed` undoes).

| function                          | field                        | who moves it                           |
|-----------------------------------|------------------------------|----------------------------------------|
| `task_transition`                 | `Task.status`                | `missions/services/tasks.py`           |
| `mission_transition`              | `Mission.status` (+ reason)  | lifecycle, progress, the autopilot     |
| `milestone_transition`            | `Milestone.status`           | `missions.transitions.progress`        |
| `milestone_validation_transition` | `Milestone.validation_state` | `missions/services/rollup.py` only     |
| `slice_transition`                | `Slice.status`               | progress, the autopilot, operator, fix |
| `assertion_transition`            | `ContractAssertion.status`   | verdicts (`validation/services/verdicts/complete.py`) |
"""

from __future__ import annotations

from typing import Any

from missions.models import ContractAssertion, Milestone, Mission, Slice, Task
from missions.transitions import tables
from missions.transitions.machine import Machine, move

TASK = Machine(name="task", model=Task, field="status", table=tables.TASK)
MISSION = Machine(name="mission", model=Mission, field="status", table=tables.MISSION, mission_field="pk")
MILESTONE = Machine(name="milestone", model=Milestone, field="status", table=tables.MILESTONE)
MILESTONE_VALIDATION = Machine(
    name="milestone", model=Milestone, field="validation_state", table=tables.MILESTONE_VALIDATION
)
SLICE = Machine(name="slice", model=Slice, field="status", table=tables.SLICE)
ASSERTION = Machine(name="assertion", model=ContractAssertion, field="status", table=tables.ASSERTION)

# The mission's moves that clear the autopilot's stop reason (a halt sets it).
CLEARS_REASON = frozenset({"activate", "pause", "resume", "complete", "continue"})


def task_transition(
    *,
    task: Task | int,
    old: str,
    new: str,
    cause: str,
    actor_id: int | None = None,
    fields: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
) -> bool:
    """Move one task from `old` to `new`. Returns False when another writer won; a `Task`
    passed in (locked by the caller: `missions/services/tasks.py`) holds the values written
    after a move."""
    instance = task if isinstance(task, Task) else None
    return move(
        TASK,
        pk=task.pk if isinstance(task, Task) else task,
        old=old,
        new=new,
        cause=cause,
        actor_id=actor_id,
        fields=fields,
        payload=payload,
        mission_id=instance.mission_id if instance is not None else None,
        instance=instance,
    )


def mission_transition(
    *,
    mission: Mission | int,
    old: str,
    new: str,
    cause: str,
    reason: str = "",
    actor_id: int | None = None,
    fields: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
) -> bool:
    """Move one mission from `old` to `new`; `reason` is the autopilot's stop reason of a
    halt (halting sets `status_reason`, the moves in `CLEARS_REASON` clear it, reopening
    leaves it). Returns False when another writer won. A `Mission` passed in is not
    refreshed (callers that read it again refresh it)."""
    pk = mission if isinstance(mission, int) else mission.pk
    if cause == "halt":
        fields, payload = {**(fields or {}), "status_reason": reason}, {**(payload or {}), "reason": reason}
    elif cause in CLEARS_REASON:
        fields = {**(fields or {}), "status_reason": ""}
    return move(MISSION, pk=pk, old=old, new=new, cause=cause, actor_id=actor_id, fields=fields, payload=payload)


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
