"""The plan's floor's fast paths: its hot statements, each behind a named function.

Every judged feature runs these a few times (the API's token and the completion's task,
the task and mission locked for a completion, every state machine's compare-and-swap, the
audit log's rows): the same statement each time, only the ids change. Building and
compiling a queryset costs about ten times as much interpreter time as running its SQL,
so each is compiled once per process (`fusion_site/runtime/prepared.py`) or written once
(`fusion_site/runtime/inserts.py`): about half the Python calls of a feature
(docs/BENCHMARKS.md, "Loop throughput": "Statements compiled once per process").

This module is the only one of the floor that imports those two: domain code calls the
functions below like any selector. With `FUSION_FAST_PATHS=off`
(`fusion_site/runtime/fast_paths.py`) each of them evaluates the plain queryset,
`.update()` or `bulk_create` it describes: the same rows and return values, through the ORM.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import connections
from django.db.models import Model, Q
from rest_framework.authtoken.models import Token

from fusion_site.runtime import inserts
from fusion_site.runtime.prepared import Prepared
from fusion_site.runtime.prepared import compare_and_set as _compare_and_set
from missions.models import Mission, MissionEvent, Task

M = TypeVar("M", bound=Model)

# --- the mission's row lock (missions/locks.py): its autopilot and status come with it.

_LOCK: Prepared[tuple[bool, str]] = Prepared(
    lambda pk: Mission.objects.select_for_update().filter(pk=pk).values_list("autopilot", "status")
)
_AUTOPILOT: Prepared[tuple[bool, str]] = Prepared(
    lambda pk: Mission.objects.filter(pk=pk).values_list("autopilot", "status")
)


def mission_lock(*, mission_id: int) -> tuple[bool, str] | None:
    """`SELECT autopilot, status … FOR UPDATE` of the mission (None: no such mission)."""
    return _LOCK.first(pk=mission_id)


def mission_autopilot(*, mission_id: int) -> tuple[bool, str] | None:
    """The mission's autopilot and status, read without a lock (None: no such mission)."""
    return _AUTOPILOT.first(pk=mission_id)


# --- the API: every request's token, every completion's task.

_TOKEN: Prepared[Token] = Prepared(lambda key: Token.objects.select_related("user").filter(key=key), key=str)


def token_with_user(*, key: str) -> Token:
    """The API token `key` with its user; `Token.DoesNotExist` when there is none."""
    return _TOKEN.get(key=key)


_ANY_TASK: Prepared[Task] = Prepared(lambda pk: Task.objects.select_related("mission").filter(pk=pk))
# The missions a user who is not staff sees (`missions.selectors.visible_missions`): owned
# or a member's. The user's id twice: a prepared statement's parameter stands in one place.
_MEMBERS_TASK: Prepared[Task] = Prepared(
    lambda pk, owner, member: Task.objects.select_related("mission").filter(
        pk=pk, mission__in=Mission.objects.filter(Q(owner_id=owner) | Q(members=member)).values("pk")
    )
)


def task_with_mission(*, task_id: int, user_id: int | None) -> Task | None:
    """The task with its mission; with `user_id`, only where that user owns or is a member
    of its mission (None: no such task, or not theirs)."""
    if user_id is None:
        return _ANY_TASK.first(pk=task_id)
    return _MEMBERS_TASK.first(pk=task_id, owner=user_id, member=user_id)


def _locked_with_feature(pk: int) -> Any:
    """The task locked `FOR UPDATE` with its mission (as `select_related("mission")` locked
    it), its feature read in the same query but not locked (a nullable join)."""
    if connections[Task.objects.db].features.has_select_for_update_of:
        tasks = Task.objects.select_for_update(of=("self", "mission")).select_related("mission", "feature")
    else:
        tasks = Task.objects.select_for_update().select_related("mission", "feature")
    return tasks.filter(pk=pk)


_LOCKED_TASK: Prepared[Task] = Prepared(_locked_with_feature)


def task_locked_with_feature(*, task_id: int) -> Task:
    """The task and its mission locked, its feature read with them; `Task.DoesNotExist`."""
    return _LOCKED_TASK.get(pk=task_id)


# --- the state machines (missions/transitions/machine.py) and the audit log (missions/audit.py).


def compare_and_set(*, model: type[Model], pk: int, field: str, old: str, updates: dict[str, Any]) -> int:
    """`model.objects.filter(pk=pk, <field>=old).update(**updates)`: the rows changed (0:
    another writer moved the row first)."""
    return _compare_and_set(model, pk=pk, field=field, old=old, updates=updates)


def audit_insert(*, events: list[MissionEvent]) -> list[MissionEvent]:
    """The unsaved audit rows (their `seq` given) inserted in one statement; returns them saved."""
    return inserts.insert(events)
