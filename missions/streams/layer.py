"""The Channels layer of the embedded configuration (no Redis): Channels' in-memory layer,
made safe to publish to from worker threads and cheap with many WebSocket clients.

`fusion_site/settings.py` names it `missions.streams.InMemoryChannelLayer`; with
`REDIS_URL` set, channels-redis is used instead (docs/DASHBOARD.md, "Streams for programs").
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time

from channels.layers import InMemoryChannelLayer as _InMemoryChannelLayer


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
            super()._clean_expired()  # type: ignore[misc]  # a private method the stubs of channels leave out

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

    def has_members(self, group: str) -> bool:
        """Whether anyone is in `group` now (`missions.delivery.group_send` skips the hop to
        the server's loop for a group nobody listens to: most events, on a quiet server).
        Read from any thread: a dict lookup; a member who joins a moment later reloads
        the state it missed, as after any reconnect."""
        return bool(self.groups.get(group))

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
            # As the parent (ChannelFull): a full client misses the event.
            with contextlib.suppress(asyncio.QueueFull):
                self._queue(channel).put_nowait(shared)

    async def _at_home(self, coro):
        home = self._home
        if home is None or home is asyncio.get_running_loop() or home.is_closed() or not home.is_running():
            return await coro
        future = asyncio.run_coroutine_threadsafe(coro, home)
        # A server loop that is shutting down must not hang the publisher.
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout=5)
