"""Dramatiq's Redis broker, with idle consumers woken by an enqueue instead of a poll.

Dramatiq's Redis consumer looks at an empty queue, then sleeps a backoff growing up to the
worker timeout (`FUSION_WORKER_POLL_MS`) before it looks again: on an idle system each hop
of the loop (completion -> admission -> run) waited up to that long. Here every enqueue also
PUBLISHes a wake-up on a channel of its queue, and a consumer with nothing to do waits for
one on its own subscription for at most that same backoff, then fetches as usual.

The poll stays as the fallback for what no wake-up announces: a message sent by a client
that does not publish (a stock `RedisBroker`), a wake-up lost to a reconnect, the messages
Dramatiq itself puts back (`requeue`, a dead worker's unacked ones), and a delayed message
that its consumer holds until it is due (moved to its queue after one of these waits).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message
from redis.client import PubSub

logger = logging.getLogger(__name__)

# After its subscription failed, a consumer only polls for this long before subscribing
# again: a Redis that refuses SUBSCRIBE would otherwise cost a round trip on every look.
RESUBSCRIBE_AFTER_SECONDS = 5.0


def wakeup_channel(namespace: str, queue_name: str) -> str:
    """The pub/sub channel of a queue's wake-ups. Channels are server-wide, not per database,
    so the namespace (one per deployment, FUSION_EVENTS_PREFIX) is part of the name."""
    return f"{namespace}:{queue_name}:wakeup"


class WakingRedisBroker(RedisBroker):
    """`RedisBroker` whose enqueue wakes the queue's idle consumers (see the module)."""

    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return _WakingRedisConsumer

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        # Every send goes through here, and so does a delayed message moved to its queue when
        # due (the worker's consumer thread re-enqueues it). The returned message names the
        # queue it went to: the delay queue for a delayed one, whose consumer must fetch it.
        message = super().enqueue(message, delay=delay)
        try:
            self.client.publish(wakeup_channel(self.namespace, message.queue_name), b"")
        except redis.RedisError as e:
            # The message is queued and the poll finds it; raising would have the caller
            # send it a second time.
            logger.warning(
                "No wake-up for queue %r (its consumers find the message by polling): %s: %s",
                message.queue_name,
                type(e).__name__,
                e,
            )
        return message


class _WakingRedisConsumer(_RedisConsumer):
    """Dramatiq's Redis consumer, waiting on a subscription where it slept.

    One subscription (one Redis connection) per consumer; a consumer runs in one thread.
    It is made before the consumer's fetches, so a wake-up published between an empty fetch
    and the wait that follows it waits in the connection: none is missed once subscribed.
    Any failure of the subscription degrades to the stock sleep, never to an error."""

    def __init__(self, broker: WakingRedisBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self.channel = wakeup_channel(broker.namespace, queue_name)
        self.pubsub: PubSub | None = None
        self.subscribe_after = 0.0  # time.monotonic() before which no subscription is tried

    def __next__(self) -> MessageProxy | None:
        # The stock method pops a prefetched message, or fetches and, on an empty fetch (or
        # with as many messages outstanding as it may prefetch), sleeps the backoff and
        # returns None. Prefetched messages keep its path (no network, no sleep); the rest
        # is the same steps with the wait in place of the sleep.
        if self.message_cache:
            return super().__next__()
        try:
            self._listen()
            if self.outstanding_message_count < self.prefetch:
                self.message_cache = self.broker.do_fetch(
                    self.queue_name, self.prefetch - self.outstanding_message_count
                )
                if self.message_cache:
                    return super().__next__()
                if self.pubsub is not None:
                    # The queue is empty and its next message announces itself: the stock
                    # backoff (5 ms, 10 ms, …) would look again and again for nothing after
                    # every message, a Redis script each time. The poll is the fallback.
                    self._wait(self.timeout / 1000)
                    return None
            # No subscription, or as many messages outstanding as it may prefetch: nothing
            # announces that one was acknowledged, so look again soon, the stock way.
            self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
            self._wait(backoff_ms / 1000)
            return None
        except redis.ConnectionError as e:
            # As the stock consumer: the worker closes this consumer and starts another.
            raise ConnectionClosed(e) from None

    def close(self) -> None:
        self._unsubscribe()
        super().close()

    def _listen(self) -> None:
        """Before a fetch: subscribe if not yet, or drop the wake-ups received since the last
        wait (they announce messages this fetch sees or another worker took)."""
        if self.pubsub is None:
            if time.monotonic() >= self.subscribe_after:
                self._subscribe()
            return
        try:
            while self.pubsub.get_message(timeout=0) is not None:
                pass
        except Exception as e:
            self._failed(e)

    def _subscribe(self) -> None:
        try:
            self.pubsub = self.broker.client.pubsub()
            self.pubsub.subscribe(self.channel)
            # Redis's confirmation, so the subscription is in place before the first fetch.
            # Without it in one poll interval the consumer goes on: the poll covers the gap.
            self.pubsub.get_message(timeout=self.timeout / 1000)
        except Exception as e:
            self._failed(e)

    def _wait(self, seconds: float) -> None:
        """Wait for a wake-up for at most `seconds` (the stock consumer's sleep)."""
        deadline = time.monotonic() + seconds
        try:
            while self.pubsub is not None and (remaining := deadline - time.monotonic()) > 0:
                event = self.pubsub.get_message(timeout=remaining)
                if event is not None and event["type"] == "message":
                    return
        except Exception as e:
            self._failed(e)
        remaining = deadline - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    def _failed(self, error: Exception) -> None:
        # Not ConnectionClosed: a lost subscription costs latency, not messages. A Redis that
        # is really gone fails the next fetch, which restarts the consumer.
        logger.warning(
            "Wake-ups of queue %r unavailable, polling: %s: %s", self.queue_name, type(error).__name__, error
        )
        self._unsubscribe()
        self.subscribe_after = time.monotonic() + RESUBSCRIBE_AFTER_SECONDS

    def _unsubscribe(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()  # disconnects: the server drops the subscription with the connection
            except Exception:
                logger.debug("Closing the wake-up subscription of %r failed", self.queue_name, exc_info=True)
