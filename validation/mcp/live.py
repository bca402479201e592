"""Live resources: the mission's event stream turned into `resources/updated`.

One follower per mission per process joins the mission's Channels group — the stream the
dashboard's WebSocket clients follow (`missions/events.py` sends every event there) — and
maps each event to the resources it touches: the mission's tree always, the run a
`validator-run:*` event names, the review of a `review:progress`. Two kinds of client
hear about it:

- 2026-07-28 clients listen (`subscriptions/listen`): the SDK's listen handler reads the
  events from `bus`, after `may_listen` has checked that the user may read every
  resource asked for;
- earlier clients subscribe (`resources/subscribe`) and get the notification on their
  session's standalone stream; a connection that started a review is told when it ends
  (the review's resource updated, and a log message) whether it subscribed or not.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections import defaultdict
from typing import Any

from channels.layers import get_channel_layer
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated

from missions.events import group_name

logger = logging.getLogger(__name__)

TERMINAL_REVIEW_EVENTS = frozenset({"completed", "failed", "cancelled"})
# One commit sends several events that touch the same resource (a run's end: the assertions
# judged, the rollup, the run, the feature). `resources/updated` carries only the URI, so
# the first one goes out at once and the rest of the burst becomes one trailing notification.
COALESCE_SECONDS = 0.05


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


class Live:
    def __init__(self) -> None:
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)
        self._followers: dict[int, asyncio.Task] = {}
        self._subscribers: dict[str, set[Any]] = defaultdict(set)  # uri -> legacy connections
        self._review_watchers: dict[int, set[Any]] = defaultdict(set)  # review id -> connections
        self._windows: dict[str, asyncio.Task] = {}  # uri -> its open coalescing window
        self._dirty: set[str] = set()  # uris touched again inside their window

    # --- following missions -----------------------------------------------------------

    def follow(self, mission_id: int) -> None:
        task = self._followers.get(mission_id)
        if task is None or task.done():
            self._followers[mission_id] = asyncio.get_running_loop().create_task(self._follow(mission_id))

    async def _follow(self, mission_id: int) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        channel = await layer.new_channel()
        await layer.group_add(group_name(mission_id), channel)
        try:
            while True:
                message = await layer.receive(channel)
                if message.get("type") == "mission.event":
                    await self.dispatch(mission_id, message["event"], message["data"])
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 — a broken layer must not kill the server; the next follow() restarts it
            logger.exception("MCP follower of mission %s stopped", mission_id)
        finally:
            try:
                await layer.group_discard(group_name(mission_id), channel)
            except Exception:  # noqa: BLE001
                pass

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
        await self.bus.publish(ResourceUpdated(uri=uri))
        for connection in list(self._subscribers.get(uri, ())):
            await connection.send_resource_updated(uri)

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
        for connection in self._review_watchers.pop(review_id, set()):
            if connection not in self._subscribers.get(uri, set()):
                await connection.send_resource_updated(uri)
            with warnings.catch_warnings():
                # The logging capability is deprecated for 2026-07-28 clients (and dropped
                # for them by the SDK); earlier clients read the message.
                warnings.simplefilter("ignore")
                await connection.log(
                    "info",
                    {"review": review_id, "taskId": str(review_id), "state": how, "next": "call bg_result once"},
                    logger="fusion.review",
                )

    # --- registrations ----------------------------------------------------------------

    async def watch_review(self, ctx: Any, *, review_id: int, mission_id: int | None) -> None:
        if mission_id is not None:
            self.follow(mission_id)
        connection = _connection(ctx)
        if connection is None or not connection.has_standalone_channel:
            return  # a single-exchange client hears about it by listening to the resource
        self._review_watchers[review_id].add(connection)
        connection.exit_stack.callback(lambda: self._review_watchers.get(review_id, set()).discard(connection))

    def subscribe(self, ctx: Any, *, uri: str, mission_id: int) -> None:
        self.follow(mission_id)
        connection = _connection(ctx)
        if connection is None:
            return
        self._subscribers[uri].add(connection)
        connection.exit_stack.callback(lambda: self.unsubscribe(ctx, uri=uri))

    def unsubscribe(self, ctx: Any, *, uri: str) -> None:
        connection = _connection(ctx)
        subscribers = self._subscribers.get(uri)
        if subscribers is not None:
            subscribers.discard(connection)
            if not subscribers:
                self._subscribers.pop(uri, None)

    def stop(self) -> None:
        self.listen.close()
        for task in [*self._followers.values(), *self._windows.values()]:
            task.cancel()
        self._followers.clear()
        self._windows.clear()
