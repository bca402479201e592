"""A mission's forge: written from the mission file's `forge:` section, its webhook
secret rotated, and what each user may read of it (docs/FORGES.md).

The secret is created with the forge (`forges.models.new_secret`), never read from a
file, and shown only to the mission's owner and staff (`forge_view`); it is never put
in an event, a log line or the audit.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import reverse

from forges.models import Forge, new_secret
from fusion_site.repos.sources import credentials_allowed
from missions.errors import Forbidden, Invalid, NotFound, StaffOnly
from missions.locks import lock_mission
from missions.models import Mission
from missions.selectors import visible_missions

# The values of a forge a mission file sets (`missions/services/files/schema.py: MissionFileForge`).
FILE_FIELDS = ("provider", "api_url", "repository", "token_env", "feature_pattern", "statuses", "comments", "context")


def _staff(user: Any) -> bool:
    return user is None or bool(getattr(user, "is_staff", False))  # None: the command line


def is_owner(*, user: Any, mission: Mission) -> bool:
    """The mission's owner or staff: who sees and rotates the hook's secret."""
    return bool(getattr(user, "is_staff", False)) or (
        mission.owner_id is not None and mission.owner_id == getattr(user, "pk", None)
    )


def _refused(error: type[Invalid] | type[Forbidden], line: str, code: str) -> Exception:
    return error(line, code=code, fields={"errors": [line]})


def _check_token_env(current: Forge | None, values: dict[str, Any], user: Any) -> None:
    """The credentials rule (docs/REPOSITORIES.md, "Credentials"): the variable must be one
    FUSION_GIT_CREDENTIALS lists with a prefix covering `api_url`, and only staff name it
    (unless FUSION_MEMBERS_SET_CREDENTIALS). An unchanged pair is not judged again."""
    name = values["token_env"].strip()
    named = current is None or current.token_env != name
    moved = current is None or current.api_url != values["api_url"]
    if not name or not (named or moved):
        return
    url = values["api_url"].strip()
    allowed = credentials_allowed(name, url) if url else name in settings.FUSION_GIT_CREDENTIALS
    if not allowed:
        where = f" for {url}" if url else ""
        line = f"forge.token_env: {name!r} may not be used{where} (FUSION_GIT_CREDENTIALS)"
        raise _refused(Invalid, line, "credentials_not_allowed")
    if named and not _staff(user) and not settings.FUSION_MEMBERS_SET_CREDENTIALS:
        raise _refused(StaffOnly, "forge.token_env: only staff may set this field", "staff_only")


def forge_from_file(*, mission: Mission, values: dict[str, Any], user: Any) -> bool:
    """Create or update the mission's forge from the file's section (in the import's
    transaction); whether anything changed. The secret is made with the forge and kept."""
    values = {name: values[name] for name in FILE_FIELDS}
    current = Forge.objects.select_for_update().filter(mission=mission).first()
    _check_token_env(current, values, user)
    if current is None:
        Forge.objects.create(mission=mission, **values)
        return True
    dirty = [name for name, value in values.items() if getattr(current, name) != value]
    for name in dirty:
        setattr(current, name, values[name])
    if dirty:
        current.save(update_fields=[*dirty, "updated_at"])
    return bool(dirty)


def visible_forge(*, user: Any, mission_id: int) -> Forge:
    """The forge of a mission `user` sees; `NotFound` for any other (or none)."""
    mission = visible_missions(user=user).filter(pk=mission_id).first()
    forge = Forge.objects.select_related("mission").filter(mission=mission).first() if mission else None
    if forge is None:
        raise NotFound("no such mission, or it follows no forge")
    return forge


@transaction.atomic
def forge_rotate_secret(*, user: Any, forge: Forge) -> Forge:
    """A new webhook secret (the forge must be told it): the owner's or staff's to do."""
    if not is_owner(user=user, mission=forge.mission):
        raise Forbidden("only the owner or staff may rotate the hook's secret", code="owner_only")
    lock_mission(forge.mission_id)
    forge.secret = new_secret()
    forge.save(update_fields=["secret", "updated_at"])
    return forge


def hook_path(forge: Forge) -> str:
    return reverse("forge-hook", kwargs={"provider": forge.provider, "mission_key": forge.mission.key})


def forge_view(*, user: Any, forge: Forge) -> dict[str, Any]:
    """What `user` may read of the forge: its configuration; the owner and staff also the
    secret (the forge's own: the deployment's is never shown) and the hook's path."""
    view: dict[str, Any] = {"mission": forge.mission_id, **{name: getattr(forge, name) for name in FILE_FIELDS}}
    view["refusal"] = forge.refusal
    view["secret_source"] = "forge" if forge.secret else ("deployment" if settings.FUSION_FORGE_WEBHOOK_SECRET else "")
    if is_owner(user=user, mission=forge.mission):
        view["secret"] = forge.secret
        view["hook_path"] = hook_path(forge)
    return view
