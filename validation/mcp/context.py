"""Who is calling and about which mission: the principal of one MCP request.

HTTP requests carry it in the ASGI scope (`validation/mcp/transports.py` signs in every
request with the API's tokens, or the session); stdio carries one for the whole process
(`manage.py mcp --user NAME`). Every handler that reads or writes checks the principal
again in its own database trip (`load_user`: the HTTP request's credential, the user's
`is_active`), and every selector it calls checks the mission's visibility: a revoked
token, a deactivated user or a removed membership is refused on the very next call.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from types import SimpleNamespace
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user as session_user
from django.contrib.auth import get_user_model
from django.db import connections

from missions import selectors
from missions.errors import Invalid, NotFound
from missions.models import Mission
from missions.streams.auth import token_user

SCOPE_KEY = "fusion.mcp"

T = TypeVar("T")

# ("token" | "session", key): how an HTTP request signed in.
Credential = tuple[str, str]


@dataclass(frozen=True)
class Principal:
    user_id: int
    # The connection's mission (a mission endpoint, or stdio's --mission): the mission a
    # review reads and the default of every loop tool.
    mission_id: int | None = None
    # The HTTP request's credential, checked again by `load_user`; None on stdio, whose
    # user is the process's. Never in a repr (a log line must not carry a token).
    credential: Credential | None = field(default=None, repr=False)


def credential_user(credential: Credential):
    """The active user of an API token or a session key, or None."""
    via, key = credential
    if via == "token":
        user = token_user(key)
    else:
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
        # Django reads only the request's session to find its user.
        user = session_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    return user if user.is_authenticated and user.is_active else None


class SignedIn:
    """The principals of the credentials that signed in lately, so that an HTTP request
    with one of them needs no database trip of its own before its handler's: a tool call
    costs one trip, as a REST read does. Safe because the handler's trip checks the
    credential again (`load_user`); a refusal there forgets it, and its next request is
    answered 401 again. An entry lives TTL seconds: a mission renamed meanwhile (its key
    now another's) is resolved afresh soon."""

    TTL = 60.0
    SIZE = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the event loop reads, pool threads forget
        self._entries: dict[tuple[bytes, str | None], tuple[Principal, float]] = {}

    @staticmethod
    def _digest(credential: Credential) -> bytes:
        return hashlib.sha256("\0".join(credential).encode()).digest()

    def get(self, credential: Credential, mission_ref: str | None) -> Principal | None:
        key = (self._digest(credential), mission_ref)
        with self._lock:
            principal, expires = self._entries.get(key, (None, 0.0))
            if principal is not None and expires < time.monotonic():
                del self._entries[key]
                return None
        return principal

    def remember(self, principal: Principal, mission_ref: str | None) -> None:
        assert principal.credential is not None
        with self._lock:
            if len(self._entries) >= self.SIZE:
                del self._entries[next(iter(self._entries))]  # the oldest
            key = (self._digest(principal.credential), mission_ref)
            self._entries[key] = (principal, time.monotonic() + self.TTL)

    def forget(self, credential: Credential) -> None:
        digest = self._digest(credential)
        with self._lock:
            for key in [k for k in self._entries if k[0] == digest]:
                del self._entries[key]


signed_in = SignedIn()


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
    """The principal's user, read in the caller's database trip: the HTTP request's
    credential must still sign in as that user (a deleted token, a logged-out session or
    a deactivated user is refused), stdio's user must still be active."""
    if principal.credential is None:
        user = get_user_model().objects.filter(pk=principal.user_id, is_active=True).first()
    else:
        user = credential_user(principal.credential)
    if user is None or user.pk != principal.user_id:
        if principal.credential is not None:
            signed_in.forget(principal.credential)
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
