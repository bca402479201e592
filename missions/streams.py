"""The transport side of live events: the SSE view, who may read which stream, token
sign-in for programs, and an in-memory channel layer that is safe to publish to from any
thread.

Streams (django-eventstream, database storage):
- `mission-<id>`: anyone who may see the mission (`can_see_mission`);
- `missions` (the list feed): staff only — it carries every mission's ids, states and
  reasons. A signed-in non-staff user who asks for `/events/missions/` is given the
  channels of their own missions instead (at most `MAX_CHANNELS`, the most recently
  active), so their list is live without seeing anyone else's events.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import time

from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer as _InMemoryChannelLayer
from django.contrib.auth.models import AnonymousUser
from django.db import connections
from django.http import HttpResponseBadRequest, StreamingHttpResponse
from django.utils.functional import SimpleLazyObject
from django_eventstream.channelmanager import DefaultChannelManager
from django_eventstream.eventrequest import EventRequest
from django_eventstream.eventstream import EventPermissionError, get_events
from django_eventstream.utils import (
    add_default_headers,
    make_id,
    sse_encode_error,
    sse_encode_event,
    sse_error_response,
)
from django_eventstream.views import Listener, get_listener_manager

from missions.events import GLOBAL_CHANNEL, mission_channel
from missions.selectors import can_see_mission, visible_missions

logger = logging.getLogger(__name__)

# django-eventstream refuses a request for more than 10 channels.
MAX_CHANNELS = 10


def user_channels(user) -> set[str]:
    """The channels that stand for `/events/missions/` for this user."""
    if user is None or not user.is_authenticated or user.is_staff:
        return {GLOBAL_CHANNEL}
    ids = list(visible_missions(user=user).order_by("-updated_at").values_list("pk", flat=True)[:MAX_CHANNELS])
    # No mission yet: ask for the global channel, which is refused (stream-error forbidden).
    return {mission_channel(pk) for pk in ids} or {GLOBAL_CHANNEL}


class MissionChannelManager(DefaultChannelManager):
    def get_channels_for_request(self, request, view_kwargs):
        channels = super().get_channels_for_request(request, view_kwargs)
        if channels == {GLOBAL_CHANNEL}:
            return user_channels(getattr(request, "user", None))
        return channels

    def can_read_channel(self, user, channel: str) -> bool:
        if user is None or not user.is_authenticated:
            return False
        if channel == GLOBAL_CHANNEL:
            return bool(user.is_staff)
        mission_id = channel_mission_id(channel)
        return mission_id is not None and can_see_mission(user=user, mission_id=mission_id)


def channel_mission_id(channel: str) -> int | None:
    """The mission of a `mission-<id>` channel; None for any other channel."""
    prefix, _, raw_id = channel.partition("-")
    return int(raw_id) if prefix == "mission" and raw_id.isdigit() else None


def kick_listeners(*, channel: str, user_ids: set[int]) -> int:
    """End this process's streams of `user_ids` that read `channel`. A stream of that one
    mission gets `stream-error` forbidden; a list stream (several channels) gets
    `channels-changed`, upon which the page reconnects and is given its new channels."""
    manager = get_listener_manager()
    with manager.lock:
        hit = [x for x in manager.listeners_by_channel.get(channel, ()) if x.user_id in user_ids]
        for listener in hit:
            listener.error = _revoked(listener.channels, [channel])
    for listener in hit:
        listener.wake_threadsafe()
    return len(hit)


def _revoked(channels, lost) -> dict:
    if len(channels) == 1:
        return {
            "condition": "forbidden",
            "text": f"Permission denied to channels: {', '.join(sorted(lost))}",
            "extra": {"channels": sorted(lost)},
        }
    return {
        "condition": "channels-changed",
        "text": "the missions you may see changed; reconnect",
        "extra": {"channels": sorted(lost)},
    }


def _still_allowed(user_id, channels) -> bool:
    """Whether the user may still read every channel of the stream, in two queries."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(pk=user_id, is_active=True).first() if user_id != "anonymous" else None
    if user is None:
        return False
    if user.is_staff:
        return True
    ids = {channel_mission_id(c) for c in channels}
    if None in ids:
        return False  # the global channel (staff only), or a channel that is not a mission's
    return visible_missions(user=user).filter(pk__in=ids).count() == len(ids)


class _AccessRecheck:
    """Access revoked in another process reaches no listener of this one: a stream checks
    again every KEEP_ALIVE_SECONDS, whether it is idle or busy. A failed check (say the
    database is away) is not a revocation: the stream goes on and checks next time."""

    def __init__(self, listener):
        self.listener = listener
        self.last = time.monotonic()

    async def __call__(self) -> str | None:
        if time.monotonic() - self.last < KEEP_ALIVE_SECONDS:
            return None
        self.last = time.monotonic()
        try:
            allowed = await _db(_still_allowed)(self.listener.user_id, self.listener.channels)
        except Exception:  # noqa: BLE001
            logger.warning("stream access re-check failed; checking again later", exc_info=True)
            return None
        if allowed:
            return None
        error = _revoked(self.listener.channels, self.listener.channels)
        return sse_encode_error(error["condition"], error["text"], extra=error["extra"])


def token_user(key: str):
    """The active user a DRF token names, or an anonymous user (a bad token never falls
    back to another credential)."""
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return AnonymousUser()
    return token.user


def authorization_token(header: str | bytes | None) -> str | None:
    """`Authorization: Token <key>` -> key."""
    if not header:
        return None
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != "token":
        return None
    return key.strip() or None


class EventsTokenMiddleware:
    """Lets programs read the SSE streams with `Authorization: Token <key>` (browsers
    use their session). Only GET requests under /events/ are affected: a token never
    signs in a request that could change something, so CSRF stays intact."""

    prefix = "/events/"

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "GET" and request.path.startswith(self.prefix):
            key = authorization_token(request.META.get("HTTP_AUTHORIZATION"))
            if key is not None:
                # Lazy: resolved where the stream reads the database (see `_db`).
                request.user = SimpleLazyObject(lambda: token_user(key))
        return self.get_response(request)


class InMemoryChannelLayer(_InMemoryChannelLayer):
    """Channels' in-memory layer, fixed for many WebSocket clients fed from worker threads.

    1. Its asyncio queues belong to the server's event loop. Events are published from
       Dramatiq worker threads (through `async_to_sync`, i.e. on another loop), and a
       cross-loop `put` does not wake the waiting consumer: clients would get the event
       only when the server loop next woke for some other reason. This layer remembers
       the loop that receives and runs every send on it.
    2. The parent sweeps every channel and group for expired messages on every receive
       and group send: with N clients of a group, one event costs N^2 steps. Expiry is
       measured in tens of seconds, so sweeping once a second changes nothing else.
    3. A group send copies the message once, not once per member, and makes no task per
       member. Members therefore share one copy: consumers must not mutate messages
       (ours do not). A receiver's queue lives as long as the receiver.
    """

    SWEEP_EVERY = 1.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._home: asyncio.AbstractEventLoop | None = None
        self._swept = 0.0

    def _clean_expired(self):
        now = time.monotonic()
        if now - self._swept >= self.SWEEP_EVERY:
            self._swept = now
            super()._clean_expired()

    def _queue(self, channel) -> asyncio.Queue:
        queue = self.channels.get(channel)
        if queue is None:  # (the parent builds a new Queue on every call just to discard it)
            queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
        return queue

    async def receive(self, channel):
        self._home = asyncio.get_running_loop()
        self.require_valid_channel_name(channel)
        self._clean_expired()
        queue = self._queue(channel)
        try:
            _, message = await queue.get()
        except BaseException:
            # The receiver went away (its consumer ended): drop its queue. A live receiver
            # keeps its queue, so that each event does not build one per client.
            if queue.empty() and self.channels.get(channel) is queue:
                self.channels.pop(channel, None)
            raise
        return message

    async def send(self, channel, message):
        return await self._at_home(super().send(channel, message))

    async def group_send(self, group, message):
        return await self._at_home(self._group_send(group, message))

    async def _group_send(self, group, message):
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        shared = (time.time() + self.expiry, copy.deepcopy(message))
        for channel in list(self.groups.get(group, ())):
            try:
                self._queue(channel).put_nowait(shared)
            except asyncio.QueueFull:
                pass  # as the parent (ChannelFull): a full client misses the event

    async def _at_home(self, coro):
        home = self._home
        if home is None or home is asyncio.get_running_loop() or home.is_closed() or not home.is_running():
            return await coro
        future = asyncio.run_coroutine_threadsafe(coro, home)
        # A server loop that is shutting down must not hang the publisher.
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout=5)


# --- the SSE view --------------------------------------------------------------------
# django-eventstream's own view, rewritten for ASGI with the same protocol (stream-open,
# ids "channel:id", stream-reset, stream-error, keep-alive every 20 s). Its view is sync
# and reads the database from the request's own thread: every open stream then keeps a
# thread *and a database connection* for as long as it is open (N PostgreSQL connections
# for N browser tabs). Here each database read runs in the shared pool and gives its
# connection back at once. (No GRIP proxy support: this project does not use one.)

KEEP_ALIVE_SECONDS = 20


def _db(fn):
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()  # this pool thread serves other requests next

    return sync_to_async(run, thread_sensitive=False)


async def events(request, **kwargs):
    """`/events/missions/<id>/` and `/events/missions/`: see `MissionChannelManager`."""
    try:
        event_request = await _db(EventRequest)(request, view_kwargs=kwargs)
    except EventRequest.ResumeNotAllowedError as exc:
        response = HttpResponseBadRequest(f"Invalid request: {exc}.\n")
    except EventRequest.Error as exc:
        response = sse_error_response("bad-request", f"Invalid request: {exc}.")
    else:
        listener = Listener()
        listener.user_id = event_request.user.pk if event_request.user else "anonymous"
        listener.channels = event_request.channels
        response = StreamingHttpResponse(_stream(event_request, listener), content_type="text/event-stream")
    add_default_headers(response, request=request)
    return response


class _Sent:
    """Ids recently sent on one stream. An event is stored before it is queued to the
    live listeners: one stored just before a database read can be read *and* arrive
    live a moment later. It is sent once."""

    KEEP = 512

    def __init__(self):
        self.ids: set[tuple[str, int]] = set()
        self.order: collections.deque = collections.deque()

    def add(self, channel: str, event_id) -> bool:
        """False when it was sent already."""
        key = (channel, int(event_id))
        if key in self.ids:
            return False
        self.ids.add(key)
        self.order.append(key)
        if len(self.order) > self.KEEP:
            self.ids.discard(self.order.popleft())
        return True


async def _stream(event_request, listener):
    read = _db(get_events)
    sent = _Sent()
    listener.assign_loop()
    manager = get_listener_manager()
    manager.add_listener(listener)
    recheck = _AccessRecheck(listener)
    try:
        first = True
        while True:  # read what is stored since the last id, then relay live events
            try:
                response = await read(event_request)
            except EventPermissionError as exc:
                yield sse_encode_error("forbidden", str(exc), extra={"channels": exc.channels})
                return
            last_ids = copy.deepcopy(response.channel_last_ids)
            yield ("" if not first else ":" + " " * 2048 + "\n\nevent: stream-open\ndata:\n\n") + _stored(
                response, last_ids, sent
            )
            first = False
            if response.channel_more or _queued_meanwhile(listener, manager):
                # Read on from what was just sent. (The library re-reads from the old ids:
                # duplicates, or, on a first connection, the event that came meanwhile lost.)
                event_request.channel_last_ids = last_ids
                continue
            while True:
                waiter = asyncio.ensure_future(listener.aevent.wait())
                while not (await asyncio.wait([waiter], timeout=KEEP_ALIVE_SECONDS))[0]:
                    yield "event: keep-alive\ndata:\n\n"
                    if (error := await recheck()) is not None:
                        waiter.cancel()
                        yield error
                        return
                if (error := await recheck()) is not None:
                    yield error
                    return
                body, overflow, refused = _take(listener, manager, last_ids, sent)
                if body:
                    yield body
                if refused:
                    return
                if overflow:
                    break  # more than the listener queues: catch up from the database
            event_request.channel_last_ids = last_ids
    finally:
        listener.aevent.set()
        manager.remove_listener(listener)


def _stored(response, last_ids: dict, sent: _Sent) -> str:
    body = ""
    if response.channel_reset:
        body += sse_encode_event(
            "stream-reset", {"channels": sorted(response.channel_reset)}, event_id=make_id(last_ids), json_encode=True
        )
    for channel, items in response.channel_items.items():
        for item in items:
            if sent.add(channel, item.id):
                last_ids[channel] = item.id
                body += sse_encode_event(item.type, item.data, event_id=make_id(last_ids))
    return body


def _queued_meanwhile(listener, manager) -> bool:
    """Events queued while we read the database are in what we read, or will be read
    again: drop them, and read again."""
    with manager.lock:
        if not listener.channel_items:
            return False
        listener.aevent.clear()
        listener.channel_items = {}
        return True


def _encoded(item, event_id: str | None) -> str:
    """The SSE text of a live event. Every listener of a channel is handed the same event
    object with the same id: it is encoded once, not once per client."""
    cached = getattr(item, "_fusion_sse", None)
    if cached is None or cached[0] != event_id:
        cached = item._fusion_sse = (event_id, sse_encode_event(item.type, item.data, event_id=event_id))
    return cached[1]


def _take(listener, manager, last_ids: dict, sent: _Sent) -> tuple[str, bool, bool]:
    """(the queued events as SSE, overflowed, refused) and reset the listener."""
    with manager.lock:
        items, overflow, error = listener.channel_items, listener.overflow, listener.error
        listener.aevent.clear()
        listener.channel_items, listener.overflow = {}, False
    if error:
        items = {}  # refused: nothing queued is sent, some of it may be from after the revocation
    body = ""
    for channel, queued in items.items():
        for item in queued:
            if item.id is not None and channel in last_ids:
                if not sent.add(channel, item.id):
                    continue
                # Two publishers can queue out of order: the id to resume from never goes back.
                last_ids[channel] = max(int(last_ids[channel]), int(item.id))
            body += _encoded(item, make_id(last_ids) if last_ids else None)
    if error:
        body += sse_encode_error(error["condition"], error["text"], extra=error.get("extra"))
    return body, overflow, bool(error)
