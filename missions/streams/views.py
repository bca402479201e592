"""The SSE view of `/events/missions/<id>/` and `/events/missions/`, and the bookkeeping
of its open streams (listeners): ending them when access is revoked (`kick_listeners`)
and re-checking access while they are open (docs/DASHBOARD.md, "Streams for programs").

django-eventstream's own view, rewritten for ASGI with the same protocol (stream-open,
ids "channel:id", stream-reset, stream-error, keep-alive every 20 s). Its view is sync
and reads the database from the request's own thread: every open stream then keeps a
thread *and a database connection* for as long as it is open (N PostgreSQL connections
for N browser tabs). Here each database read runs in the shared pool and gives its
connection back at once. (No GRIP proxy support: this project does not use one.)
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import threading
import time

from asgiref.sync import sync_to_async
from django.db import connections
from django.dispatch import receiver
from django.http import HttpResponseBadRequest, HttpResponseBase, StreamingHttpResponse
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

from missions.access import access_revoked
from missions.streams.auth import still_allowed

logger = logging.getLogger(__name__)

# Idle streams send a keep-alive this often; every stream re-checks its access this often.
KEEP_ALIVE_SECONDS = 20

# The clock of the access re-check (a module attribute, so that tests can drive it).
clock = time.monotonic


# --- revocation ------------------------------------------------------------------------


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


@receiver(access_revoked, dispatch_uid="missions.streams.kick_listeners")
def _kick_revoked(sender, *, channel: str, user_ids: set[int], **kwargs) -> None:
    # Connected when this module is imported, which is before any stream of this process
    # opens (the streams are this module's): no listener misses its kick.
    kick_listeners(channel=channel, user_ids=user_ids)


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


class _AccessRecheck:
    """Access revoked in another process reaches no listener of this one: a stream checks
    again every KEEP_ALIVE_SECONDS, whether it is idle or busy. A failed check (say the
    database is away) is not a revocation: the stream goes on and checks next time."""

    def __init__(self, listener):
        self.listener = listener
        self.last = clock()

    async def __call__(self) -> str | None:
        if clock() - self.last < KEEP_ALIVE_SECONDS:
            return None
        self.last = clock()
        try:
            allowed = await _db(still_allowed)(self.listener.user_id, self.listener.channels)
        except Exception:  # noqa: BLE001
            logger.warning("stream access re-check failed; checking again later", exc_info=True)
            return None
        if allowed:
            return None
        error = _revoked(self.listener.channels, self.listener.channels)
        return sse_encode_error(error["condition"], error["text"], extra=error["extra"])


# --- the view --------------------------------------------------------------------------


# Database reads of the streams still running in pool threads. A stream whose client went
# away is cancelled at once, but a read it started runs to its end: `reads_done` waits for
# those (a server that stops, a test that empties the database after its streams).
_reads = {"running": 0}
_reads_changed = threading.Condition()


def _db(fn):
    def run(*args, **kwargs):
        with _reads_changed:
            _reads["running"] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()  # this pool thread serves other requests next
            with _reads_changed:
                _reads["running"] -= 1
                _reads_changed.notify_all()

    return sync_to_async(run, thread_sensitive=False)


def reads_done(timeout: float) -> bool:
    """Wait until no stream's database read is running; False if one still is at `timeout`."""
    with _reads_changed:
        return _reads_changed.wait_for(lambda: _reads["running"] == 0, timeout)


async def events(request, **kwargs) -> HttpResponseBase:
    """`/events/missions/<id>/` and `/events/missions/`: see `auth.MissionChannelManager`."""
    response: HttpResponseBase
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
