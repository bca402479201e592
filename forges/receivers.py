"""What the forges app hears from the plan (`missions/hooks.py`, docs/ARCHITECTURE.md
"Floors"): the mission file's `forge:` section, in the import's transaction."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from forges.config import forge_from_file
from missions import hooks


@receiver(hooks.mission_file_imported, dispatch_uid="forges.mission_file_imported")
def on_mission_file_imported(sender: Any, *, mission: Any, forge: dict | None, user: Any, **kwargs: Any) -> bool:
    if forge is None:  # a file without `forge:` leaves the stored forge alone
        return False
    return forge_from_file(mission=mission, values=forge, user=user)
