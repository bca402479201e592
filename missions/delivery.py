"""The live transports of committed events (`send_all`), and their channel and group
names: the event stream (django-eventstream: stored, then published) and the Channels
groups.

Both take every event of one committed transaction at once (`missions.outbox`):
the stream stores them in one write transaction (`EventLogStorage.append_events`), the
groups get them in one hop to the sender loop. A group no WebSocket client is in gets no
send at all: the stream's publishing round trip also asks Redis which of the groups have
members (`stream(…, groups=…)`), and an in-process layer knows its own. Failures are the
caller's to log: a transport must never undo a committed change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from channels.layers import get_channel_layer
from django.core.serializers.json import DjangoJSONEncoder
from django_eventstream import eventstream as eventstream_module
from django_eventstream.event import Event as StreamEvent
from django_eventstream.utils import get_channelmanager, get_storage, publish_event
from django_grip import get_pubcontrol
from redis.connection import parse_url

from missions.event_catalogue import GLOBAL_TYPES

logger = logging.getLogger(__name__)

GLOBAL_CHANNEL = "missions"


def mission_channel(mission_id: int) -> str:
    return f"mission-{mission_id}"


def group_name(mission_id: int) -> str:
    return f"mission-{mission_id}"


def send_all(events: list[tuple[int, str, dict[str, Any]]]) -> None:
    """Send committed events `(mission id, type, data)` now: stored for the event streams,
    then to the missions' Channels groups (the outbox at commit, `missions.relay` later)."""
    # A failing transport must never undo or break the committed business change:
    # the database is the source of truth and clients reload their state on reset.
    groups = list(dict.fromkeys(group_name(mission_id) for mission_id, _t, _d in events))
    listened = None  # not known: every group gets its send
    try:
        listened = _stream_events(events, groups)
    except Exception:  # noqa: BLE001
        logger.exception("eventstream delivery failed for %s", ", ".join(type for _m, type, _d in events))
    _send_groups(events, listened)


def _stream_events(events: list[tuple[int, str, dict[str, Any]]], groups: list[str]) -> set[str] | None:
    """Store and publish; which of `groups` have members, when the stream's Redis tells."""
    items = []
    for mission_id, type, data in events:
        encoded = json.dumps(data, cls=DjangoJSONEncoder)  # as django-eventstream's send_event encodes it
        items.append((mission_channel(mission_id), type, encoded))
        if type in GLOBAL_TYPES:
            items.append((GLOBAL_CHANNEL, type, encoded))
    return stream(items, groups=groups)


def _send_groups(events: list[tuple[int, str, dict[str, Any]]], listened: set[str] | None = None) -> None:
    """One `mission.events` message per mission group with that mission's events in order
    (`{"event", "data", "id"}` each): a group send costs Redis round trips and a hop to
    the sender loop whatever it carries. Listeners also take a single `mission.event`.
    `listened`: the groups known to have members (None: not known); no other gets a send."""
    batches: dict[int, list[dict[str, Any]]] = {}
    for mission_id, type, data in events:
        batches.setdefault(mission_id, []).append({"event": type, "data": data, "id": data["seq"]})
    group_send(
        [
            (group_name(mission_id), {"type": "mission.events", "events": items})
            for mission_id, items in batches.items()
            if listened is None or group_name(mission_id) in listened
        ]
    )


def stream(items: list[tuple[str, str, str]], *, groups: Sequence[str] = ()) -> set[str] | None:
    """django-eventstream's `send_event` for several events `(channel, type, JSON)`: the
    stored ones in one storage call, then published as `send_event` publishes each (Redis
    pub/sub or this process's listeners, then GRIP), all of them in one Redis round trip.

    `groups`: the Channels groups these events go to next. Returned: those of them that
    have members, asked in the same round trip; None when that is not told here (no Redis
    for the stream, or a layer that keeps its groups elsewhere): then send to every one."""
    storage, channels = get_storage(), get_channelmanager()
    reliable = [bool(storage) and channels.is_channel_reliable(channel) for channel, _t, _d in items]
    kept = [item for item, keep in zip(items, reliable, strict=True) if keep]
    stored = iter(storage.append_events(kept) if kept else [])
    events = [next(stored) if keep else StreamEvent(*item) for item, keep in zip(items, reliable, strict=True)]
    return _publish(events, list(groups))


def _publish(events: list[StreamEvent], groups: list[str]) -> set[str] | None:
    """The part of `django_eventstream.send_event` after storage (the library has no call
    for an event stored already), for several events: one pipelined round trip to Redis
    instead of one per event, and no GRIP publishing when no GRIP proxy is configured (the
    library builds every event's GRIP item, then finds no one to give it to). An event
    with an id (`event.id`) was stored. Returns `stream`'s answer about `groups`."""
    from django_eventstream.views import get_listener_manager  # as send_event does: the views import late

    ids = [(str(event.id), str(event.id - 1)) if event.id is not None else (None, None) for event in events]
    redis_client = eventstream_module.redis_client
    listened = None
    if redis_client:
        keys = _group_keys(groups, redis_client)
        pipe = redis_client.pipeline(transaction=False)
        for event, (pub_id, _prev) in zip(events, ids, strict=True):
            message = {"channel": event.channel, "event_type": event.type, "data": event.data, "pub_id": pub_id}
            pipe.publish("events_channel", json.dumps(message))
        for key in keys or ():
            pipe.exists(key)
        answers = pipe.execute()
        if keys is not None:
            listened = {group for group, n in zip(groups, answers[len(events) :], strict=True) if n}
    else:
        for event in events:
            get_listener_manager().add_to_queues(event.channel, event)
    if _grip_configured():
        for event, (pub_id, pub_prev_id) in zip(events, ids, strict=True):
            publish_event(event.channel, event.type, event.data, pub_id, pub_prev_id, skip_user_ids=[], blocking=False)
    return listened


def _group_keys(groups: list[str], client: Any) -> list[bytes] | None:
    """The Redis keys of `groups`' member sets when the Channels layer is channels-redis on
    one server, the stream's own (server and database): a group send first reads that set,
    and sends nothing when it is empty. An empty set is deleted, so `EXISTS` tells. None
    for any other layer (sharded, elsewhere, in-process)."""
    layer = get_channel_layer()
    key_of = getattr(layer, "_group_key", None)
    if not groups or key_of is None or not _same_server(getattr(layer, "hosts", None), client):
        return None
    return [key_of(group) for group in groups]


def _same_server(hosts: Any, client: Any) -> bool:
    """Whether the layer's `hosts` are one Redis, the one `client` talks to (its server and
    database)."""
    if not isinstance(hosts, list) or len(hosts) != 1 or not isinstance(hosts[0], dict):
        return False
    host = hosts[0]
    theirs = parse_url(host["address"]) if "address" in host else host
    mine = client.connection_pool.connection_kwargs
    defaults = {"host": "localhost", "port": 6379, "db": 0, "path": None}
    return all(str(theirs.get(name, default)) == str(mine.get(name, default)) for name, default in defaults.items())


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
