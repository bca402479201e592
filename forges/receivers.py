"""The forges' subscriptions to the verdicts' hooks (`validation/hooks.py`), connected in
`ForgesConfig.ready` (docs/ARCHITECTURE.md, "Floors")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.dispatch import receiver

from forges.services.arming import arm_run_ended, arm_run_started
from forges.services.delivery import outbox_sweep
from validation import hooks
from validation.models import ValidatorRun


@receiver(hooks.run_started, dispatch_uid="forges.run_started")
def on_run_started(sender: Any, *, run: ValidatorRun, **_: Any) -> None:
    arm_run_started(run=run)


@receiver(hooks.run_ended, dispatch_uid="forges.run_ended")
def on_run_ended(sender: Any, *, run: ValidatorRun, **_: Any) -> None:
    arm_run_ended(run=run)


@receiver(hooks.recovery_swept, dispatch_uid="forges.recovery_swept")
def on_recovery_swept(sender: Any, *, now: datetime, **_: Any) -> tuple[str, list[int]]:
    return "forge_outbox_sent", outbox_sweep(now=now)
