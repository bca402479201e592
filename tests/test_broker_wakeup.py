"""Idle Redis workers wake on an enqueue instead of their next poll (fusion_site/runtime/broker.py).

Real Redis and real Dramatiq workers. Skipped unless REDIS_URL is set (the PostgreSQL + Redis
pass of .ci/run). Every test works in a Redis namespace of its own (pub/sub channels too carry
it), removed afterwards, since the suite may share the database with other tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from uuid import uuid4

import dramatiq
import pytest
import redis
from django.conf import settings
from dramatiq.broker import Consumer
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import ConnectionClosed
from redis.client import PubSub

from fusion_site.runtime.broker import WakingRedisBroker, wakeup_channel

pytestmark = [
    pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL: runs in the PostgreSQL+Redis pass of .ci/run"),
    pytest.mark.redis,
]

QUEUE = "wake"
# The poll of the consumer under test in the first test. A consumer idle for long waits 50% to
# 100% of it (Dramatiq's jitter), so 30 s at the least: far beyond WAIT_S, however slow the
# machine, and a message run within WAIT_S was run by a wake-up, not by a poll.
LONG_POLL_MS = 60_000
WAIT_S = 20


class _IdleSignallingBroker(WakingRedisBroker):
    """Its consumer of QUEUE sets `idle` as it starts a wait: a fetch found nothing (the
    consumer's wait is observed, not replaced)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.idle = threading.Event()

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        consumer = super().consume(queue_name, prefetch, timeout)
        if queue_name == QUEUE:
            wait = consumer._wait

            def signalled(seconds: float) -> None:
                self.idle.set()
                wait(seconds)

            consumer._wait = signalled
        return consumer


class _LongPollBroker(_IdleSignallingBroker):
    """Its consumer of QUEUE polls every LONG_POLL_MS and starts as one idle for long does: at
    the top of Dramatiq's backoff. (The delay queue's consumer keeps the worker's short poll,
    so that stopping the worker does not wait for it.)"""

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        if queue_name != QUEUE:
            return super().consume(queue_name, prefetch, timeout)
        consumer = super().consume(queue_name, prefetch, LONG_POLL_MS)
        consumer.misses = 64
        return consumer


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"fusion-test-wakeup-{uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        for key in client.scan_iter(match=f"{name}*", count=500):
            client.delete(key)
    finally:
        client.close()


def _subscribers(broker: RedisBroker, queue_name: str) -> int:
    [(_, count)] = broker.client.pubsub_numsub(wakeup_channel(broker.namespace, queue_name))
    return int(count)


def _wait_for_subscribers(broker: RedisBroker, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while _subscribers(broker, QUEUE) != count:
        assert time.monotonic() < deadline, f"the consumer's wake-up subscriptions never became {count}"
        time.sleep(0.01)


def _actor(broker: RedisBroker, done: threading.Event) -> dramatiq.Actor:
    def touch() -> None:
        done.set()

    return dramatiq.actor(broker=broker, actor_name="touch", queue_name=QUEUE)(touch)


def test_an_idle_worker_runs_a_new_message_at_once_not_at_its_next_poll(namespace):
    broker = _LongPollBroker(url=settings.REDIS_URL, namespace=namespace, middleware=[])
    done = threading.Event()
    touch = _actor(broker, done)
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        _wait_for_subscribers(broker, 1)
        assert broker.idle.wait(WAIT_S)  # its fetch found nothing: it waits (30 s or more)
        sent = time.monotonic()
        touch.send()
        assert done.wait(WAIT_S), f"not run within {WAIT_S} s: the idle worker was not woken by the send"
        print(f"run {1000 * (time.monotonic() - sent):.0f} ms after the send")
    finally:
        worker.stop(timeout=5_000)  # a consumer still in a long wait (the failure) is left to end it
        broker.client.connection_pool.disconnect()


def test_a_message_sent_without_a_wakeup_is_run_by_the_poll(namespace):
    """A sender with Dramatiq's stock broker (an older process, a script) publishes nothing."""
    broker = _IdleSignallingBroker(url=settings.REDIS_URL, namespace=namespace, middleware=[])
    stock = RedisBroker(url=settings.REDIS_URL, namespace=namespace, middleware=[])
    done = threading.Event()
    _actor(broker, done)
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=200)
    worker.start()
    try:
        _wait_for_subscribers(broker, 1)
        assert broker.idle.wait(WAIT_S)  # its fetch found nothing: the poll must find the message
        _actor(stock, threading.Event()).send()
        assert done.wait(WAIT_S), f"a message enqueued without a wake-up was not run within {WAIT_S} s"
    finally:
        worker.stop(timeout=5_000)
        for b in (broker, stock):
            b.client.connection_pool.disconnect()


def test_a_consumer_without_its_subscription_polls_and_closes_what_it_opened(namespace, monkeypatch):
    broker = WakingRedisBroker(url=settings.REDIS_URL, namespace=namespace, middleware=[])
    broker.declare_queue(QUEUE)
    try:
        consumer = broker.consume(QUEUE, timeout=50)
        assert next(consumer) is None  # subscribed, fetched nothing, waited
        assert _subscribers(broker, QUEUE) == 1
        consumer.close()
        _wait_for_subscribers(broker, 0)  # its connection closed with it

        # Redis refuses the subscription (a lost connection, an ACL without SUBSCRIBE): the
        # consumer neither fails nor misses a message; it polls.
        def refused(**kwargs: object) -> PubSub:
            raise redis.ConnectionError("SUBSCRIBE refused")

        monkeypatch.setattr(broker.client, "pubsub", refused)
        consumer = broker.consume(QUEUE, timeout=50)
        assert next(consumer) is None
        _actor(broker, threading.Event()).send()
        deadline = time.monotonic() + WAIT_S
        while (message := next(consumer)) is None:
            assert time.monotonic() < deadline, "the consumer never fetched the message"
        assert message.actor_name == "touch"
        consumer.ack(message)
        consumer.close()
    finally:
        broker.client.connection_pool.disconnect()


def test_an_idle_subscribed_consumer_waits_its_whole_poll_between_fetches(namespace, monkeypatch):
    """After an empty fetch a subscribed consumer waits up to its whole poll for a wake-up:
    Dramatiq's backoff (5 ms, 10 ms, …) ran the fetch script again and again for nothing
    after every message. With as many messages outstanding as it may prefetch (nothing
    announces an acknowledgement) it keeps that backoff."""
    broker = WakingRedisBroker(url=settings.REDIS_URL, namespace=namespace, middleware=[])
    broker.declare_queue(QUEUE)
    try:
        consumer = broker.consume(QUEUE, prefetch=1, timeout=300)
        waits: list[float] = []
        real_wait = consumer._wait
        monkeypatch.setattr(consumer, "_wait", lambda seconds: (waits.append(seconds), real_wait(seconds))[1])
        assert next(consumer) is None and next(consumer) is None
        assert waits == [0.3, 0.3]
        _actor(broker, threading.Event()).send()
        deadline = time.monotonic() + WAIT_S
        while (message := next(consumer)) is None:
            assert time.monotonic() < deadline, "the consumer never fetched the message"
        waits.clear()
        assert next(consumer) is None  # its one prefetch slot is the unacknowledged message
        assert len(waits) == 1 and waits[0] < 0.3
        consumer.ack(message)
        consumer.close()
    finally:
        broker.client.connection_pool.disconnect()


def test_a_lost_redis_still_closes_the_consumer_for_the_worker_to_reconnect():
    broker = WakingRedisBroker(url="redis://127.0.0.1:1/0", namespace="fusion-test-wakeup-none", middleware=[])
    consumer = broker.consume(QUEUE, timeout=50)
    with pytest.raises(ConnectionClosed):
        next(consumer)
    consumer.close()
