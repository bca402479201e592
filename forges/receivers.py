"""What the forges app hears from the floors below (docs/ARCHITECTURE.md, "Floors"): from
the plan (`missions/hooks.py`), the mission file's `forge:` section, written in the
import's transaction and answered for its export; from the verdicts
(`validation/hooks.py`), a run's start and end (the outbox rows they arm, in the run's
transaction) and the recovery sweep."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.dispatch import receiver

from forges.config import FILE_FIELDS, forge_from_file
from forges.inbound.recovery import deliveries_redrive
from forges.models import Forge
from forges.services.arming import arm_run_ended, arm_run_started
from forges.services.delivery import outbox_sweep
from missions import hooks
from validation import hooks as loop_hooks
from validation.models import ValidatorRun


@receiver(hooks.mission_file_imported, dispatch_uid="forges.mission_file_imported")
def on_mission_file_imported(sender: Any, *, mission: Any, forge: dict | None, user: Any, **kwargs: Any) -> bool:
    if forge is None:  # a file without `forge:` leaves the stored forge alone
        return False
    return forge_from_file(mission=mission, values=forge, user=user)


@receiver(hooks.mission_file_sections, dispatch_uid="forges.mission_file_sections")
def on_mission_file_sections(sender: Any, *, mission: Any, **kwargs: Any) -> dict[str, Any] | None:
    """The mission's forge as its file's `forge:` section (never its secret)."""
    forge = Forge.objects.filter(mission=mission).first()
    if forge is None:
        return None
    return {"forge": {name: getattr(forge, name) for name in FILE_FIELDS}}


@receiver(loop_hooks.run_started, dispatch_uid="forges.run_started")
def on_run_started(sender: Any, *, run: ValidatorRun, **_: Any) -> None:
    arm_run_started(run=run)


@receiver(loop_hooks.run_ended, dispatch_uid="forges.run_ended")
def on_run_ended(sender: Any, *, run: ValidatorRun, **_: Any) -> None:
    arm_run_ended(run=run)


@receiver(loop_hooks.recovery_swept, dispatch_uid="forges.recovery_swept")
def on_recovery_swept(sender: Any, *, now: datetime, **_: Any) -> dict[str, Any]:
    return {"forge_deliveries_redriven": deliveries_redrive(), "forge_outbox_sent": outbox_sweep(now=now)}
