"""Live resources: the mission's event stream turned into `resources/updated`.

One follower per mission per process joins the mission's Channels group — the stream the
dashboard's WebSocket clients follow (`missions/delivery.py` sends every event there) — and
maps each event to the resources it touches: the mission's tree always, the run a
`validator-run:*` event names, the review of a `review:progress`. Two kinds of client
hear about it, each an `Audience` (a user, and the resources it hears about with their
mission):

- 2026-07-28 clients listen (`subscriptions/listen`): each listen stream is the SDK's
  listen handler over a bus of its own, which hears only what its audience holds;
- earlier clients subscribe (`resources/subscribe`) and get the notification on their
  session's standalone stream; a connection that started a review is told when it ends
  (the review's resource updated, and a log message) whether it subscribed or not.

Who may hear is checked as a read would be, and again after the registration (with the
mission's follower already joined), so that a revocation is either seen by that check or
reaches the follower after it. The group also carries the mission's access revocations
(`missions.access.revoke_on_commit`, the message that closes WebSockets with 4403): a
user removed from a mission loses every registration for its resources at once, and a
listen stream left with nothing to hear ends. A follower that stops (a broken layer) may
have missed one: its mission's registrations go with it, and a client listens again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from channels.layers import get_channel_layer
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

from missions.delivery import group_name
from validation.mcp.tooling import resource_not_found

logger = logging.getLogger(__name__)

TERMINAL_REVIEW_EVENTS = frozenset({"completed", "failed", "cancelled"})
# One commit sends several events that touch the same resource (a run's end: the assertions
# judged, the rollup, the run, the feature). `resources/updated` carries only the URI, so
# the first one goes out at once and the rest of the burst becomes one trailing notification.
COALESCE_SECONDS = 0.05
# Open listen streams per process (the SDK's own default for one listen handler).
MAX_STREAMS = 1024
# An audience's credential and access are checked again before it is told anything, at
# most this often: a deleted token, a logged-out session or a deactivated user stops
# hearing within this time (a removal from the mission at once, through the group).
RECHECK_SECONDS = 60.0

Check = Callable[[], Awaitable[Any]]


def mission_uri(mission_id: int) -> str:
    return f"fusion://missions/{mission_id}"


def touched(mission_id: int, event: str, data: dict[str, Any]) -> list[str]:
    uris = [mission_uri(mission_id)]
    if event.startswith("validator-run:") and isinstance(data.get("run"), int):
        uris.append(f"fusion://runs/{data['run']}")
    if event == "review:progress" and isinstance(data.get("review"), int):
        uris.append(f"fusion://reviews/{data['review']}")
    return uris


def _connection(ctx: Any) -> Any:
    # The SDK hands handlers a per-request ServerSession; what outlives the request is its
    # connection (the standalone stream, and a teardown stack for our registrations).
    return getattr(ctx.session, "_connection", None)


@dataclass(eq=False)
class Audience:
    """One user's way to hear about resources: a handshake-era connection (its
    subscriptions, and the reviews it started) or one listen stream."""

    user_id: int
    send: Callable[[str], Awaitable[Any]]
    connection: Any = None  # a handshake-era connection: it is also told of its reviews' ends
    end: Callable[[], None] | None = None  # a listen stream's graceful end
    uris: dict[str, int] = field(default_factory=dict)  # uri -> the mission whose events touch it
    reviews: dict[int, int] = field(default_factory=dict)  # review started here -> its mission
    recheck: Check | None = None  # the last registration's check (the credential, the access)
    checked: float = 0.0  # when it last passed (time.monotonic())

    async def allowed(self) -> bool:
        """Whether the audience may still hear; False drops everything it holds."""
        if self.recheck is None or time.monotonic() - self.checked < RECHECK_SECONDS:
            return True
        self.checked = time.monotonic()  # one check at a time, however many events come
        try:
            await self.recheck()
        except Exception:  # noqa: BLE001 — any refusal (not signed in, not found) ends it
            held = bool(self.uris)
            self.uris, self.reviews = {}, {}
            if held and self.end is not None:
                self.end()
            return False
        return True

    def lose(self, mission_id: int) -> None:
        """The user may no longer see the mission: nothing of it reaches them here again."""
        held = bool(self.uris)
        self.uris = {uri: m for uri, m in self.uris.items() if m != mission_id}
        self.reviews = {r: m for r, m in self.reviews.items() if m != mission_id}
        if held and not self.uris and self.end is not None:
            self.end()


@dataclass
class _Follower:
    task: asyncio.Task
    joined: asyncio.Future  # done once the group is joined (an exception if it could not be)


class Live:
    def __init__(self) -> None:
        self._followers: dict[int, _Follower] = {}
        self._audiences: set[Audience] = set()
        self._connections: dict[Any, Audience] = {}  # handshake-era connection -> its audience
        self._streams: set[ListenHandler] = set()
        self._windows: dict[str, asyncio.Task] = {}  # uri -> its open coalescing window
        self._dirty: set[str] = set()  # uris touched again inside their window

    # --- following missions -----------------------------------------------------------

    async def follow(self, mission_id: int) -> None:
        """Follow the mission; returns once its group is joined: from then on, every event
        and revocation of the mission reaches this process's audiences."""
        follower = self._followers.get(mission_id)
        if follower is None or follower.task.done():
            loop = asyncio.get_running_loop()
            joined = loop.create_future()
            follower = _Follower(loop.create_task(self._follow(mission_id, joined)), joined)
            self._followers[mission_id] = follower
        await asyncio.shield(follower.joined)

    async def _follow(self, mission_id: int, joined: asyncio.Future) -> None:
        layer = get_channel_layer()
        if layer is None:
            joined.set_result(None)  # nothing is ever delivered, nor revoked
            return
        channel = None
        try:
            channel = await layer.new_channel()
            await layer.group_add(group_name(mission_id), channel)
            joined.set_result(None)
            while True:
                await self._deliver(mission_id, await layer.receive(channel))
        except asyncio.CancelledError:
            if not joined.done():
                joined.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 — a broken layer must not kill the server; the next follow() restarts it
            logger.exception("MCP follower of mission %s stopped", mission_id)
            if not joined.done():
                joined.set_exception(exc)
        finally:
            for audience in list(self._audiences):
                audience.lose(mission_id)  # a revocation may have been missed meanwhile
            if channel is not None:
                with contextlib.suppress(Exception):
                    await layer.group_discard(group_name(mission_id), channel)

    async def _deliver(self, mission_id: int, message: dict[str, Any]) -> None:
        """One message of the mission's group: its events, or the users it no longer admits."""
        if message.get("type") == "mission.events":
            for event in message["events"]:
                await self.dispatch(mission_id, event["event"], event["data"])
        elif message.get("type") == "mission.event":
            await self.dispatch(mission_id, message["event"], message["data"])
        elif message.get("type") == "mission.access":
            self.revoke(mission_id, set(message["revoked"]))

    def revoke(self, mission_id: int, user_ids: set[int]) -> None:
        for audience in list(self._audiences):
            if audience.user_id in user_ids:
                audience.lose(mission_id)

    async def dispatch(self, mission_id: int, event: str, data: dict[str, Any]) -> None:
        for uri in touched(mission_id, event, data):
            if uri in self._windows:
                self._dirty.add(uri)  # told at the window's end, once
                continue
            self._windows[uri] = asyncio.get_running_loop().create_task(self._window(uri))
            await self._notify(uri)
        if event == "review:progress" and data.get("event") in TERMINAL_REVIEW_EVENTS:
            await self._review_ended(data["review"], data["event"])

    async def _notify(self, uri: str) -> None:
        audiences = [a for a in self._audiences if uri in a.uris]
        allowed = await asyncio.gather(*(a.allowed() for a in audiences))  # the rechecks due, at once
        for audience in [a for a, ok in zip(audiences, allowed, strict=True) if ok]:
            try:
                await audience.send(uri)
            except Exception:  # noqa: BLE001 — one gone client must not keep the others from hearing
                logger.warning("MCP notification of %s to user %s failed", uri, audience.user_id, exc_info=True)

    async def _window(self, uri: str) -> None:
        try:
            while True:
                await asyncio.sleep(COALESCE_SECONDS)
                if uri not in self._dirty:
                    return
                self._dirty.discard(uri)
                await self._notify(uri)
        except Exception:  # noqa: BLE001 — a failed notification must not keep the window open
            logger.exception("MCP notification of %s failed", uri)
        finally:
            self._windows.pop(uri, None)
            self._dirty.discard(uri)

    async def _review_ended(self, review_id: int, how: str) -> None:
        uri = f"fusion://reviews/{review_id}"
        for audience in [a for a in self._audiences if a.reviews.pop(review_id, None) is not None]:
            try:
                if not await audience.allowed():
                    continue
                if uri not in audience.uris:
                    await audience.send(uri)
                with warnings.catch_warnings():
                    # The logging capability is deprecated for 2026-07-28 clients (and dropped
                    # for them by the SDK); earlier clients read the message.
                    warnings.simplefilter("ignore")
                    await audience.connection.log(
                        "info",
                        {"review": review_id, "taskId": str(review_id), "state": how, "next": "call bg_result once"},
                        logger="fusion.review",
                    )
            except Exception:  # noqa: BLE001 — as in _notify: the others are told all the same
                logger.warning("MCP end of review %s to user %s failed", review_id, audience.user_id, exc_info=True)

    # --- registrations ----------------------------------------------------------------

    async def _admit(
        self,
        audience: Audience,
        check: Check,
        *,
        uris: dict[str, int] | None = None,
        reviews: dict[int, int] | None = None,
    ) -> None:
        """Register, then check: a revocation committed before the check's read fails it,
        one committed after reaches the (joined) follower, which finds the registration."""
        uris, reviews = uris or {}, reviews or {}
        if not uris and not reviews:
            return
        for mission_id in {*uris.values(), *reviews.values()}:
            await self.follow(mission_id)
        audience.uris.update(uris)
        audience.reviews.update(reviews)
        try:
            await check()
            audience.recheck, audience.checked = check, time.monotonic()
        except BaseException:
            for uri in uris:
                audience.uris.pop(uri, None)
            for review_id in reviews:
                audience.reviews.pop(review_id, None)
            raise

    def _audience_of(self, connection: Any, user_id: int) -> Audience:
        audience = self._connections.get(connection)
        if audience is None:
            audience = Audience(user_id=user_id, send=connection.send_resource_updated, connection=connection)
            self._connections[connection] = audience
            self._audiences.add(audience)
            connection.exit_stack.callback(lambda: self._gone(connection))
        return audience

    def _gone(self, connection: Any) -> None:
        audience = self._connections.pop(connection, None)
        if audience is not None:
            self._audiences.discard(audience)

    async def watch_review(
        self, ctx: Any, *, review_id: int, mission_id: int | None, user_id: int, check: Check
    ) -> None:
        connection = _connection(ctx)
        if mission_id is None or connection is None or not connection.has_standalone_channel:
            return  # a single-exchange client hears about it by listening to the resource
        await self._admit(self._audience_of(connection, user_id), check, reviews={review_id: mission_id})

    async def subscribe(self, ctx: Any, *, uris: dict[str, int], user_id: int, check: Check) -> None:
        connection = _connection(ctx)
        if connection is not None:
            await self._admit(self._audience_of(connection, user_id), check, uris=uris)

    def unsubscribe(self, ctx: Any, *, uri: str) -> None:
        audience = self._connections.get(_connection(ctx))
        if audience is not None:
            audience.uris.pop(uri, None)

    async def listen(
        self,
        ctx: Any,
        params: types.SubscriptionsListenRequestParams,
        *,
        uris: dict[str, int],
        user_id: int,
        check: Check,
    ) -> types.SubscriptionsListenResult:
        """One listen stream: the SDK's handler over a bus of its own, fed by this stream's
        audience alone (the SDK's handler filters by URI only, not by who listens)."""
        if len(self._streams) >= MAX_STREAMS:
            raise MCPError(types.INTERNAL_ERROR, "Subscription limit reached")
        bus = InMemorySubscriptionBus()
        stream = ListenHandler(bus)
        audience = Audience(user_id=user_id, send=lambda uri: bus.publish(ResourceUpdated(uri=uri)), end=stream.close)
        self._audiences.add(audience)
        self._streams.add(stream)
        try:
            await self._admit(audience, check, uris=uris)
            if uris and not audience.uris:
                raise resource_not_found(next(iter(uris)))  # revoked while it was being admitted
            return await stream(ctx, params)
        finally:
            self._audiences.discard(audience)
            self._streams.discard(stream)

    def stop(self) -> None:
        for stream in list(self._streams):
            stream.close()
        for task in [*(f.task for f in self._followers.values()), *self._windows.values()]:
            task.cancel()
        self._followers.clear()
        self._windows.clear()
