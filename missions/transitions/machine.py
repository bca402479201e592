"""The engine under every state machine, the plan's and the validation floor's
(docs/ARCHITECTURE.md, "State machines").

A `Machine` is one state field of one model and its table (`missions.transitions.tables`,
which says how a table reads). `move` is the one way to change such a field. It

1. refuses a move the table does not hold (`missions.errors.IllegalTransition`);
2. takes the mission's row lock first (`lock_mission`: one lock order everywhere);
3. is a compare-and-swap on the old state, `filter(pk=…, <field>=old).update(<field>=new,
   updated_at=now, **fields)`: zero rows means another writer won, and `move` returns
   False (not an error: the caller just stops);
4. appends the audit row and publishes the pair's named event after commit
   (`missions.outbox.publish_on_commit`) with the payload
   `{<machine name>: pk, "from": old, <field>: new, "cause": cause, **payload}`.

A pair (old, new) with old == new is a move only where the table says so (the mission's
autopilot halting or going on keeps its status and changes its reason). A row without a
mission (a review asked for outside one) has no lock and no stream: it moves by the
compare-and-swap alone. Services ask `Machine.allows` (or `.names`) whether a state may
move, rather than list the states the table already names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from missions import fastpaths
from missions.errors import IllegalTransition
from missions.locks import lock_mission
from missions.outbox import publish_on_commit
from missions.transitions.tables import Table


@dataclass(frozen=True, eq=False)  # one object per machine: compared and hashed by identity
class Machine:
    name: str  # what the object is called in messages and event payloads ("task", "slice", ...)
    model: type[models.Model]
    field: str
    table: Table
    # Where the row names its mission; "pk" for the mission itself.
    mission_field: str = "mission_id"
    # False: the caller publishes the move's event itself, later in its transaction, with
    # what the move led to (`machine.event(...)` names it); the engine publishes none.
    publishes: bool = True

    @property
    def states(self) -> list[str]:
        """Every value the field may hold (its choices)."""
        choices = getattr(self.model._meta.get_field(self.field), "choices", None) or ()
        return [value for value, _label in choices]

    @property
    def open_states(self) -> list[str]:
        """The states with a move out; the others are final."""
        return [state for state in self.states if self.table.get(state)]

    def event(self, old: str, new: str, cause: str) -> str | None:
        """The event of moving from `old` to `new` by `cause`; None if that move is illegal."""
        entry = self.table.get(old, {}).get(new)
        if entry is None or isinstance(entry, str):
            return entry
        return entry.get(cause)

    def causes(self, old: str, new: str) -> frozenset[str] | None:
        """The causes that may move `old` to `new`: None = any cause; empty = illegal."""
        entry = self.table.get(old, {}).get(new)
        if entry is None:
            return frozenset()
        return None if isinstance(entry, str) else frozenset(entry)

    def allows(self, old: str, new: str, cause: str | None = None) -> bool:
        """Whether the table moves `old` to `new` (by `cause`; by some cause when None)."""
        causes = self.causes(old, new)
        if cause is None or causes is None:
            return causes is None or bool(causes)
        return cause in causes

    def names(self, old: str, new: str, cause: str) -> bool:
        """Whether the table names `cause` for moving `old` to `new`. An entry open to any
        cause does not count: a reopening is by whatever undid a completion, and a
        person's action named for other moves (activate, resume) is not one."""
        causes = self.causes(old, new)
        return causes is not None and cause in causes

    def mission_of(self, pk: int) -> int | None:
        if self.mission_field == "pk":
            return pk
        return self.model._default_manager.values_list(self.mission_field, flat=True).get(pk=pk)


def legal_event(machine: Machine, old: str, new: str, cause: str) -> str:
    """The event of the move, or `IllegalTransition` (before anything is written)."""
    event = machine.event(old, new, cause)
    if event is None:
        raise IllegalTransition(
            f"a {machine.name} cannot go from {old} to {new} by {cause}",
            extra={"from": old, "to": new, "cause": cause},
        )
    return event


def move(
    machine: Machine,
    *,
    pk: int,
    old: str,
    new: str,
    cause: str,
    actor_id: int | None = None,
    fields: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
    mission_id: int | None = None,
    instance: models.Model | None = None,
) -> bool:
    """Move row `pk` of `machine` from `old` to `new`. Returns False when another writer won.
    `mission_id`: the row's mission when the caller has it loaded (one query fewer);
    `instance`: the row, locked by the caller, given the values written (no re-read)."""
    event = legal_event(machine, old, new, cause)
    updates: dict[str, Any] = {machine.field: new, "updated_at": timezone.now(), **(fields or {})}
    with transaction.atomic(savepoint=False):
        if mission_id is None:
            mission_id = machine.mission_of(pk)
        if mission_id is not None:
            lock_mission(mission_id)
        if not fastpaths.compare_and_set(model=machine.model, pk=pk, field=machine.field, old=old, updates=updates):
            return False
        if instance is not None:
            for name, value in updates.items():
                setattr(instance, name, value)
        if mission_id is None or not machine.publishes:
            return True
        publish_on_commit(
            mission_id,
            event,
            {machine.name: pk, "from": old, machine.field: new, "cause": cause, **(payload or {})},
            actor_id=actor_id,
        )
    return True
