"""The two ways to reach the server.

stdio: one local agent, acting as one user, for the life of the process
(`manage.py mcp`).

The streamable HTTP transport at `/mcp/` and `/mcp/missions/<key>/`, in the project's
ASGI application (`fusion_site/asgi.py`), served by `serve` / Daphne beside the API.

Each request is authenticated before the SDK sees it: `Authorization: Bearer <key>` or
`Token <key>` (the API's tokens), else the session cookie. A session-signed request whose
`Origin` is not the site's own is refused (`missions.consumers.own_origin`, the rule of the
WebSocket streams); the `Host` must be one of ALLOWED_HOSTS (the SDK's DNS-rebinding
check, which only knows localhost, is replaced by the site's own). The principal (user,
and the mission of a mission endpoint) rides the ASGI scope to every tool call, and the
SDK binds each MCP session to it: another credential cannot use the session's id. A
credential that signed in lately is remembered (`context.SignedIn`): its next POST reaches
the SDK without a database trip of its own, and the handler checks it again in the trip
it makes anyway, so a tool call costs one trip, as a REST read does.

Daphne runs no ASGI lifespan, and the SDK's session manager needs its task group
running: the first request starts it (a lifespan, where the server sends one, too).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from http.cookies import SimpleCookie
from typing import Any

import anyio
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from missions.consumers import header, own_origin
from validation.mcp.context import (
    SCOPE_KEY,
    Credential,
    Principal,
    credential_user,
    db,
    find_mission,
    set_process_principal,
    signed_in,
)
from validation.mcp.live import Live
from validation.mcp.server import build_server

logger = logging.getLogger(__name__)


# stdio.
async def serve_stdio(*, principal: Principal) -> None:
    set_process_principal(principal)
    live = Live()
    server = build_server(live=live)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        live.stop()


def run_stdio(*, principal: Principal) -> None:
    anyio.run(lambda: serve_stdio(principal=principal))


# Streamable HTTP.
PATH = re.compile(r"\A/mcp(?:/missions/(?P<mission>[^/]{1,200}))?/?\Z")


def handles(path: str) -> bool:
    return path == "/mcp" or path.startswith("/mcp/")


def _credential(scope) -> tuple[str, str | None]:
    """("token", key) for an Authorization header of either scheme, else ("session", key)."""
    value = header(scope, b"authorization")
    if value:
        scheme, _, key = value.strip().partition(" ")
        if scheme.lower() in ("bearer", "token"):
            return "token", key.strip() or None
        return "token", None  # another scheme: refused, never a fall-back to the session
    cookies = SimpleCookie()
    try:
        cookies.load(header(scope, b"cookie") or "")
    except Exception:  # noqa: BLE001 — a malformed cookie header is no session
        return "session", None
    morsel = cookies.get(settings.SESSION_COOKIE_NAME)
    return "session", morsel.value if morsel else None


def _authenticate(credential: Credential, mission_ref: str | None) -> Principal | None:
    user = credential_user(credential)
    if user is None:
        return None
    mission_id = find_mission(user=user, ref=mission_ref).pk if mission_ref else None
    return Principal(user_id=user.pk, mission_id=mission_id, credential=credential)


async def _answer(send, status: int, body: dict[str, Any], headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": data})


class McpApp:
    def __init__(self) -> None:
        self.live = Live()
        self.server = build_server(live=self.live)
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            # The Host is checked below against ALLOWED_HOSTS, the Origin by the site's rule.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2 * 1024 * 1024),  # FUSION_MAX_BODY_BYTES
            session_idle_timeout=settings.FUSION_MCP_SESSION_IDLE_SECONDS,
        )
        self._ready: asyncio.Future | None = None
        self._stop: asyncio.Event | None = None

    async def _started(self) -> None:
        if self._ready is None:
            loop = asyncio.get_running_loop()
            self._ready, self._stop = loop.create_future(), asyncio.Event()
            loop.create_task(self._run(self._ready, self._stop))
        await asyncio.shield(self._ready)

    async def _run(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        try:
            async with self.manager.run():
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self.live.stop()

    async def lifespan(self, scope, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self._started()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._stop is not None:
                    self._stop.set()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _principal(self, scope, credential: Credential, mission_ref: str | None) -> Principal | None:
        """The request's principal, or None (not signed in); a mission endpoint of a mission
        the user may not see raises. A POST whose credential signed in lately skips this
        trip: the handler's own trip checks it again (`load_user`), and a POST that reaches
        no handler's trip (tools/list, initialize, a notification) shows nothing of any
        mission. A GET (the standalone stream of earlier clients, which carries their
        notifications) or a DELETE is signed in afresh every time."""
        if scope.get("method") == "POST":
            known = signed_in.get(credential, mission_ref)
            if known is not None:
                return known
        principal = await db(_authenticate)(credential, mission_ref)
        if principal is not None:
            signed_in.remember(principal, mission_ref)
        return principal

    async def __call__(self, scope, receive, send) -> None:
        match = PATH.match(scope["path"])
        if match is None:
            await _answer(send, 404, {"code": "not_found", "detail": "not found", "fields": {}})
            return
        host = header(scope, b"host") or ""
        domain, _port = split_domain_port(host)
        if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            await _answer(send, 421, {"code": "bad_request", "detail": "the Host is not served here", "fields": {}})
            return
        via, key = _credential(scope)
        origin = header(scope, b"origin")
        if via == "session" and origin is not None and not own_origin(origin, host=host):
            await _answer(
                send,
                403,
                {"code": "origin_refused", "detail": f"origin {origin} may not use this session", "fields": {}},
            )
            return
        try:
            principal = await self._principal(scope, (via, key), match.group("mission")) if key else None
        except Exception:  # noqa: BLE001 — an unknown or foreign mission: not found, as in the API
            await _answer(send, 404, {"code": "not_found", "detail": "no such mission", "fields": {}})
            return
        if principal is None:
            await _answer(
                send,
                401,
                {"code": "not_authenticated", "detail": "send Authorization: Bearer <token>", "fields": {}},
                ((b"www-authenticate", b'Bearer realm="fusion", Token'),),
            )
            return
        # The SDK binds a session to the identity that opened it; a request with another
        # user, or for another mission endpoint, is answered as an unknown session.
        identity = AccessToken(
            token="", client_id=f"user:{principal.user_id}:mission:{principal.mission_id}", scopes=[]
        )
        await self._started()
        await self.manager.handle_request(
            {**scope, SCOPE_KEY: principal, "user": AuthenticatedUser(identity)}, receive, send
        )
