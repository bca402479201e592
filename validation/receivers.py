"""The upper floor's subscriptions to the plan's hooks (`missions/hooks.py`), connected in
`ValidationConfig.ready` (docs/ARCHITECTURE.md, "The walk of a task completion")."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from missions import hooks
from validation import protect
from validation.services.operator import revalidate_changed_contracts
from validation.services.queueing import autopilot_notify, send_task_outcome


@receiver(hooks.task_completed, dispatch_uid="validation.task_completed")
def on_task_completed(sender: Any, *, task_id: int, **_: Any) -> None:
    send_task_outcome(task_id)


@receiver(hooks.mission_may_advance, dispatch_uid="validation.mission_may_advance")
def advance_mission(sender: Any, *, mission_id: int, **_: Any) -> None:
    autopilot_notify(mission_id)


@receiver(hooks.contract_changed, dispatch_uid="validation.contract_changed")
def revalidate_contracts(sender: Any, *, milestone_ids: list[int], cause: str, **_: Any) -> None:
    revalidate_changed_contracts(milestone_ids=milestone_ids, cause=cause)


@receiver(hooks.protected_paths_unmatched, dispatch_uid="validation.protected_paths_unmatched")
def unmatched_protected_paths(sender: Any, *, source: Any, commit: str, patterns: list[str], **_: Any) -> list[str]:
    return protect.unmatched_at(source, commit, patterns)
