"""The two live transports of `missions.events`, given channel and group names: the
event stream (django-eventstream: stored, then published) and the Channels groups.

Both take every event of one committed transaction at once (`missions.events._Outbox`):
the stream stores them in one write transaction (`EventLogStorage.append_events`), the
groups get them in one hop to the sender loop. Failures are the caller's to log: a
transport must never undo a committed change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from typing import Any

from channels.layers import get_channel_layer
from django_eventstream import eventstream as eventstream_module
from django_eventstream.event import Event as StreamEvent
from django_eventstream.utils import get_channelmanager, get_storage, publish_event
from django_grip import get_pubcontrol

logger = logging.getLogger(__name__)


def stream(items: list[tuple[str, str, str]]) -> None:
    """django-eventstream's `send_event` for several events `(channel, type, JSON)`: the
    stored ones in one storage call, then published as `send_event` publishes each (Redis
    pub/sub or this process's listeners, then GRIP), all of them in one Redis round trip."""
    storage, channels = get_storage(), get_channelmanager()
    reliable = [bool(storage) and channels.is_channel_reliable(channel) for channel, _t, _d in items]
    kept = [item for item, keep in zip(items, reliable, strict=True) if keep]
    stored = iter(storage.append_events(kept) if kept else [])
    _publish([next(stored) if keep else StreamEvent(*item) for item, keep in zip(items, reliable, strict=True)])


def _publish(events: list[StreamEvent]) -> None:
    """The part of `django_eventstream.send_event` after storage (the library has no call
    for an event stored already), for several events: one pipelined round trip to Redis
    instead of one per event, and no GRIP publishing when no GRIP proxy is configured (the
    library builds every event's GRIP item, then finds no one to give it to). An event
    with an id (`event.id`) was stored."""
    from django_eventstream.views import get_listener_manager  # as send_event does: the views import late

    ids = [(str(event.id), str(event.id - 1)) if event.id is not None else (None, None) for event in events]
    redis_client = eventstream_module.redis_client
    if redis_client:
        pipe = redis_client.pipeline(transaction=False)
        for event, (pub_id, _prev) in zip(events, ids, strict=True):
            message = {"channel": event.channel, "event_type": event.type, "data": event.data, "pub_id": pub_id}
            pipe.publish("events_channel", json.dumps(message))
        pipe.execute()
    else:
        for event in events:
            get_listener_manager().add_to_queues(event.channel, event)
    if _grip_configured():
        for event, (pub_id, pub_prev_id) in zip(events, ids, strict=True):
            publish_event(event.channel, event.type, event.data, pub_id, pub_prev_id, skip_user_ids=[], blocking=False)


def _grip_configured() -> bool:
    """Whether django-grip has anywhere to publish (GRIP_URL / GRIP_PROXIES, or ZeroMQ)."""
    control = get_pubcontrol()
    return bool(control.clients) or getattr(control, "_zmq_pub_controller", None) is not None


def group_send(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """`(group, message)` pairs to the Channels layer, in order, on the event loop of this
    process's sender thread (one hop for all); returns once they are sent."""
    layer = get_channel_layer()
    listened = getattr(layer, "has_members", None)  # an in-process layer knows its groups
    if listened is not None:
        messages = [(group, message) for group, message in messages if listened(group)]
    if layer is None or not messages:
        return
    try:
        asyncio.run_coroutine_threadsafe(_send_each(layer, messages), _sender_loop()).result(timeout=GROUP_SEND_TIMEOUT)
    except Exception:  # noqa: BLE001
        logger.exception("channel layer delivery failed for %s", ", ".join(m.get("event", "?") for _g, m in messages))


async def _send_each(layer: Any, messages: list[tuple[str, dict[str, Any]]]) -> None:
    for group, message in messages:
        try:
            await layer.group_send(group, message)
        except Exception:  # noqa: BLE001 — one lost send must not lose the ones after it
            logger.exception("channel layer delivery failed for %s", message.get("event", "?"))


# `async_to_sync` from a worker thread runs each call on a new event loop (in a new
# thread), and channels-redis keeps its connections per loop: every send connected to
# Redis anew. One long-lived loop per process keeps them.
GROUP_SEND_TIMEOUT = 30.0
_loop: dict[str, Any] = {"loop": None, "pid": None}
_loop_lock = threading.Lock()


def _sender_loop() -> asyncio.AbstractEventLoop:
    with _loop_lock:
        loop = _loop["loop"]
        if loop is None or _loop["pid"] != os.getpid() or loop.is_closed():  # a fork has no thread of it
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="fusion-event-sender", daemon=True).start()
            _loop.update(loop=loop, pid=os.getpid())
        return loop
