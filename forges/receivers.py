"""What the forges app hears from the plan (`missions/hooks.py`, docs/ARCHITECTURE.md
"Floors"): the mission file's `forge:` section, written in the import's transaction and
answered for its export; and from the loop (`validation/hooks.py`), its recovery sweep."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from forges.config import FILE_FIELDS, forge_from_file
from forges.inbound.recovery import deliveries_redrive
from forges.models import Forge
from missions import hooks
from validation import hooks as loop_hooks


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


@receiver(loop_hooks.recovery_sweep, dispatch_uid="forges.recovery_sweep")
def on_recovery_sweep(sender: Any, **kwargs: Any) -> dict[str, Any]:
    return {"forge_deliveries_redriven": deliveries_redrive()}
