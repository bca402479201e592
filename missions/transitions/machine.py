"""The engine under every state machine of the plan (docs/ARCHITECTURE.md, "State
machines").

A `Machine` is one state field of one model and its table as data:

    old state -> {new state: event name}            any cause may make the move
    old state -> {new state: {cause: event name}}   only these causes, each with its event

`move` is the one way to change such a field. It

1. refuses a move the table does not hold (`missions.errors.IllegalTransition`);
2. takes the mission's row lock first (`lock_mission`: one lock order everywhere);
3. is a compare-and-swap on the old state, `filter(pk=…, <field>=old).update(<field>=new,
   updated_at=now, **fields)`: zero rows means another writer won, and `move` returns
   False (not an error: the caller just stops);
4. appends the audit row and publishes the pair's named event after commit
   (`missions.outbox.publish_on_commit`) with the payload
   `{<machine name>: pk, "from": old, <field>: new, "cause": cause, **payload}`.

A pair (old, new) with old == new is a move only where the table says so (the mission's
autopilot halting or going on keeps its status and changes its reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from fusion_site.base.prepared import compare_and_set
from missions.errors import IllegalTransition
from missions.locks import lock_mission
from missions.outbox import publish_on_commit

# An entry of a table: the event of the move (any cause), or {cause: event} (only these).
Entry = str | Mapping[str, str]
Table = Mapping[str, Mapping[str, Entry]]


@dataclass(frozen=True, eq=False)  # one object per machine: compared and hashed by identity
class Machine:
    name: str  # what the object is called in messages and event payloads ("task", "slice", ...)
    model: type[models.Model]
    field: str
    table: Table
    # Where the row names its mission; "pk" for the mission itself.
    mission_field: str = "mission_id"

    @property
    def states(self) -> list[str]:
        """Every value the field may hold (its choices)."""
        choices = getattr(self.model._meta.get_field(self.field), "choices", None) or ()
        return [value for value, _label in choices]

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

    def mission_of(self, pk: int) -> int:
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
        lock_mission(mission_id)
        if not compare_and_set(machine.model, pk=pk, field=machine.field, old=old, updates=updates):
            return False
        if instance is not None:
            for name, value in updates.items():
                setattr(instance, name, value)
        publish_on_commit(
            mission_id,
            event,
            {machine.name: pk, "from": old, machine.field: new, "cause": cause, **(payload or {})},
            actor_id=actor_id,
        )
    return True
