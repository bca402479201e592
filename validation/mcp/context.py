"""Who is calling and about which mission: the principal of one MCP request.

HTTP requests carry it in the ASGI scope (`validation/mcp/http.py` authenticates every
request with the API's tokens, or the session); stdio carries one for the whole process
(`manage.py mcp --user NAME`). The user is read again on every call, so a deactivated
user or a removed membership takes effect at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import connections

from missions import selectors
from missions.errors import Invalid, NotFound
from missions.models import Mission

SCOPE_KEY = "fusion.mcp"

T = TypeVar("T")


@dataclass(frozen=True)
class Principal:
    user_id: int
    # The connection's mission (a mission endpoint, or stdio's --mission): the mission a
    # review reads and the default of every loop tool.
    mission_id: int | None = None


_stdio: dict[str, Principal] = {}


def set_process_principal(principal: Principal) -> None:
    """stdio: one principal for the life of the process."""
    _stdio["principal"] = principal


def principal_of(ctx: Any) -> Principal:
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    if scope is not None and SCOPE_KEY in scope:
        return scope[SCOPE_KEY]
    if "principal" in _stdio:
        return _stdio["principal"]
    raise NotFound("no authenticated user on this connection", code="not_authenticated")


def db(fn: Callable[..., T]) -> Callable[..., Any]:
    """`fn` in a pool thread that gives its database connection back when it returns: a
    tool that waits (wait_for_verdict, the live followers) never holds one between reads."""

    def run(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return sync_to_async(run, thread_sensitive=False)


def load_user(principal: Principal):
    user = get_user_model().objects.filter(pk=principal.user_id, is_active=True).first()
    if user is None:
        raise NotFound("the connection's user no longer exists or is inactive", code="not_authenticated")
    return user


def find_mission(*, user, ref: int | str) -> Mission:
    """A visible mission by id or key; another user's mission is "not found", as in the API."""
    missions = selectors.visible_missions(user=user)
    if isinstance(ref, int) or (isinstance(ref, str) and ref.isascii() and ref.isdigit()):
        found = missions.filter(pk=int(ref)).first()
    else:
        found = missions.filter(key=ref).first()
    if found is None:
        raise NotFound(f"no mission {ref!r}", code="not_found")
    return found


def tool_mission(*, user, principal: Principal, ref: int | str | None) -> Mission:
    """The mission a loop tool acts on: the argument, else the connection's mission."""
    if ref is None or ref == "":
        if principal.mission_id is None:
            raise Invalid(
                "name the mission (id or key), or connect to /mcp/missions/<key>/",
                code="mission_required",
                fields={"mission": ["required on this connection"]},
            )
        return find_mission(user=user, ref=principal.mission_id)
    mission = find_mission(user=user, ref=ref)
    if principal.mission_id is not None and mission.pk != principal.mission_id:
        raise Invalid(
            "this connection is scoped to another mission",
            code="mission_mismatch",
            fields={"mission": ["not the connection's mission"]},
        )
    return mission
