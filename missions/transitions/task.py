"""The task state machine (docs/ARCHITECTURE.md, "State machines"):
`Task.status`, changed by `missions/services/tasks.py`.

| from        | to          | cause    | event        | who           |
|-------------|-------------|----------|--------------|---------------|
| todo        | in_progress | start    | task:updated | task_start    |
| todo        | done        | complete | task:updated | task_complete |
| in_progress | done        | complete | task:updated | task_complete |
| todo        | failed      | fail     | task:updated | task_fail     |
| in_progress | failed      | fail     | task:updated | task_fail     |

`done`, `failed` and `cancelled` are final (nothing cancels a task today). A task is
created `todo` (`task_create`, event `task:updated` with `change: created`).
"""

from __future__ import annotations

from typing import Any

from missions.models import Task, TaskStatus
from missions.transitions.machine import Machine, Table, move

S = TaskStatus
EVENT = "task:updated"

TRANSITIONS: Table = {
    S.TODO: {S.IN_PROGRESS: {"start": EVENT}, S.DONE: {"complete": EVENT}, S.FAILED: {"fail": EVENT}},
    S.IN_PROGRESS: {S.DONE: {"complete": EVENT}, S.FAILED: {"fail": EVENT}},
    S.DONE: {},
    S.FAILED: {},
    S.CANCELLED: {},
}

TASK = Machine(name="task", model=Task, field="status", table=TRANSITIONS)


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
