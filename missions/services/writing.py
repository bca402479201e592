"""What every writer of the plan (`missions.services.hierarchy`) does around its change:
one transaction that takes the mission's row lock first, a duplicate key as a 400, only
staff setting code, and a write of the changed fields alone."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import IntegrityError, transaction

from missions.errors import Invalid, StaffOnly
from missions.locks import lock_mission
from missions.models import Mission

_F = TypeVar("_F", bound=Callable[..., Any])

# The keyword arguments that name what a service changes, the object edited first: a new
# parent given with it (a move) must be of the same mission, which the service checks.
_MISSION_OF = ("feature", "assertion", "slice_", "milestone", "mission")


def require_staff_for_code(*, user, old: Any, new: Any, field: str) -> None:
    """Checks and executor commands execute code on the host: only staff may set them."""
    if old == new or user is None or getattr(user, "is_staff", False):
        return
    raise StaffOnly(f"only staff may set {field}", fields={field: ["only staff may set this field"]})


def apply_fields(instance, fields: dict[str, Any]) -> list[str]:
    """Set the fields that differ and save; nothing differs -> no write at all."""
    changed = [name for name, value in fields.items() if getattr(instance, name) != value]
    for name in changed:
        setattr(instance, name, fields[name])
    if changed:
        # Only what this edit changed: a full save would write back states a worker
        # changed meanwhile (loop_state, last_run, statuses).
        instance.save(update_fields=[*changed, "updated_at"])
    return changed


def _mission_id(kwargs: dict[str, Any]) -> int | None:
    for name in _MISSION_OF:
        obj = kwargs.get(name)
        if obj is not None:
            return obj.pk if isinstance(obj, Mission) else obj.mission_id
    return None


def in_mission(fn: _F) -> _F:
    """One transaction that takes the mission's row lock first (a new mission has none to
    take): every row this service then writes or locks comes after it, as in every step
    of the loop; written the other way round, an edit of an assertion and a verdict that
    judges it could each hold what the other waits for."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with transaction.atomic():
            mission_id = _mission_id(kwargs)
            if mission_id is not None:
                lock_mission(mission_id)
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def unique_key_guard(fn: _F) -> _F:
    """`in_mission`, and a duplicate key surfaces as the same 400 the serializer gives,
    never a 500."""
    locked = in_mission(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return locked(*args, **kwargs)
        except IntegrityError as exc:
            raise Invalid(
                "this key is already used in the mission",
                code="duplicate_key",
                fields={"key": ["already used in this mission"]},
            ) from exc

    return wrapper  # type: ignore[return-value]
