"""WebSocket stream of a mission's live events: the same JSON as SSE, with the event id.

`/ws/missions/<id>/` sends `{"id": <seq>, "event": <type>, "data": {...}}` for every
event of the mission. Browsers sign in with their session; programs with a DRF token,
`?token=<key>` or an `Authorization: Token <key>` header. Anyone who may not see the
mission, signed-in or not, is refused with close code 4403, and so is a handshake signed
in by its session cookie whose `Origin` is not one of the site's own (`own_origin`): a
page on another origin (a sibling subdomain gets the `SameSite=Lax` cookie) must not read
a signed-in user's stream. A token handshake carries no ambient credential: its origin
is not judged.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.middleware import BaseMiddleware
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

from missions.delivery import group_name
from missions.selectors import can_see_mission
from missions.streams.auth import authorization_token, token_user

FORBIDDEN = 4403


def scope_token(scope) -> str | None:
    """The token a connection offers: the query string first, then the header."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get("token"):
        return query["token"][-1].strip() or None
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            return authorization_token(value)
    return None


def header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def own_origin(origin: str, *, host: str | None) -> bool:
    """Whether a browser's `Origin` is this site: the handshake's own host (when it is one
    of ALLOWED_HOSTS), a host named exactly in ALLOWED_HOSTS (any port), or an origin of
    CSRF_TRUSTED_ORIGINS (with its `*.` subdomain patterns, as Django's CSRF check).
    ALLOWED_HOSTS patterns (`.example.com`, `*`) name hosts to answer for, not pages to
    trust: a sibling subdomain matches them."""
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    if not parsed.scheme or not parsed.netloc or parsed.hostname is None:
        return False
    netloc = parsed.netloc.lower()
    if host:
        domain, _port = split_domain_port(host)
        if domain and validate_host(domain, settings.ALLOWED_HOSTS) and netloc == host.lower():
            return True
    exact = {h.lower() for h in settings.ALLOWED_HOSTS if h != "*" and not h.startswith(".")}
    if parsed.hostname.lower() in exact:
        return True
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        if origin == trusted:
            return True
        pattern = urlsplit(trusted)
        if (
            pattern.scheme == parsed.scheme
            and pattern.netloc.startswith("*.")
            and is_same_domain(netloc, pattern.netloc[1:])
        ):
            return True
    return False


def session_origin_refused(scope) -> bool:
    """A session-signed handshake from another origin (see the module's docstring)."""
    if scope.get("auth_via") == "token":
        return False
    origin = header(scope, b"origin")
    return origin is not None and not own_origin(origin, host=header(scope, b"host"))


class TokenAuthMiddleware(BaseMiddleware):
    """Runs inside Channels' AuthMiddlewareStack: a connection that offers a token is
    the token's user (an unknown token is anonymous, never the session's user)."""

    async def __call__(self, scope, receive, send):
        key = scope_token(scope)
        if key is not None:
            scope = dict(scope, user=await database_sync_to_async(token_user)(key), auth_via="token")
        return await self.inner(scope, receive, send)  # type: ignore[call-arg,misc]  # an ASGI 3 app; the stubs also allow ASGI 2


class MissionConsumer(AsyncWebsocketConsumer):
    @classmethod
    def as_asgi(cls, **initkwargs):
        # Token sign-in wraps the consumer itself, so the routing module stays as it is.
        return TokenAuthMiddleware(super().as_asgi(**initkwargs))

    async def connect(self) -> None:
        self.mission_id = int(self.scope["url_route"]["kwargs"]["mission_id"])
        user = self.scope.get("user")
        allowed = not session_origin_refused(self.scope) and await database_sync_to_async(can_see_mission)(
            user=user, mission_id=self.mission_id
        )
        if not allowed:
            # Accept, then close: a close before the handshake completes reaches the
            # client as a plain HTTP 403, and programs could not tell why.
            await self.accept()
            await self.close(code=FORBIDDEN)
            return
        assert user is not None  # can_see_mission refuses a missing user
        self.user_id = user.pk
        self.group = group_name(self.mission_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        # A read-only stream: whatever a client sends (its own pings, say) is ignored.
        return None

    async def dispatch(self, message: dict) -> None:
        if message["type"] in ("mission.events", "mission.event"):
            # Channels closes stale database connections before every handler, by a hop
            # to its one database thread; with N clients that is N hops in a row for
            # every event. These handlers touch no database: they skip the hop.
            await (self.mission_events if message["type"] == "mission.events" else self.mission_event)(message)
            return
        await super().dispatch(message)

    async def mission_events(self, message: dict) -> None:
        """The events of one committed transaction (`missions.delivery`), one frame each."""
        for frame in _frames(message):
            await self.send(text_data=frame)

    async def mission_event(self, message: dict) -> None:
        await self.send(text_data=_frames(message)[0])

    async def mission_access(self, message: dict) -> None:
        """The user was removed from the mission (events.revoke_on_commit)."""
        if self.user_id in message["revoked"]:
            await self.close(code=FORBIDDEN)


_last_encoded: tuple[dict | None, list[str]] = (None, [])


def _frames(message: dict) -> list[str]:
    """The JSON texts of a group message's events (`mission.events`: each of its list; a
    `mission.event`: itself). The in-memory layer hands every member the same message
    object, one after the other: it is encoded once, not once per client."""
    global _last_encoded
    if _last_encoded[0] is not message:
        events = message["events"] if message["type"] == "mission.events" else [message]
        frames = [json.dumps({"id": e["id"], "event": e["event"], "data": e["data"]}) for e in events]
        _last_encoded = (message, frames)
    return _last_encoded[1]
