"""The event stream's stored log (`missions.streams.storage.EventLogStorage`), on the
database the suite runs on: ids per channel in the order of the events, the library's
placeholder event 0, no id taken twice by writers at once, and on PostgreSQL (one
statement per channel) the global channel stored before the mission's; on both, an event
whose batch failed part-way re-sent by the sweep."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from django.db import close_old_connections, connection, transaction
from django_eventstream.models import Event as StoredEvent
from django_eventstream.models import EventCounter

from missions.streams import storage as storage_module
from missions.streams.storage import EventLogStorage

# Their events carry payloads of their own making: the transport is under test.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("synthetic_events")]


def stored(channel: str) -> list[tuple[int, str, str]]:
    return list(StoredEvent.objects.filter(channel=channel).order_by("eid").values_list("eid", "type", "data"))


def test_a_new_channel_gets_its_counter_event_0_and_ids_in_the_events_order():
    one, two = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    events = EventLogStorage().append_events(
        [(one, "a", {"n": 1}), (two, "x", {"n": 1}), (one, "b", {"n": 2}), (one, "c", {"n": 3})]
    )
    assert [(e.channel, e.type, e.id) for e in events] == [(one, "a", 1), (two, "x", 1), (one, "b", 2), (one, "c", 3)]
    assert [(eid, kind) for eid, kind, _data in stored(one)] == [(0, ""), (1, "a"), (2, "b"), (3, "c")]
    assert [json.loads(data) for _eid, kind, data in stored(one) if kind] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert EventCounter.objects.get(name=one).value == 3 and EventCounter.objects.get(name=two).value == 1

    more = EventLogStorage().append_events([(one, "d", {}), (one, "e", {})])
    assert [e.id for e in more] == [4, 5]
    assert EventLogStorage().append_event(one, "f", {}).id == 6
    assert [eid for eid, _kind, _data in stored(one)] == [0, 1, 2, 3, 4, 5, 6]  # one event 0


def test_writers_at_once_never_share_an_id_and_each_batch_is_consecutive():
    """Eight threads, each with its own connection, store batches on two channels at once:
    every id is taken once, without gaps, and a batch's ids within a channel follow each
    other in its order."""
    channels = [f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"]
    EventLogStorage().append_events([(c, "first", {}) for c in channels])  # the counters exist
    batches: list[list] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def writer(w: int) -> None:
        try:
            start.wait(timeout=60)
            for b in range(10):
                items = [(channels[(w + i) % 2], f"w{w}-b{b}-{i}", {}) for i in range(3)]
                events = EventLogStorage().append_events(items)
                with lock:
                    batches.append(events)
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(batches) == 80
    for channel in channels:
        eids = [eid for eid, _kind, _data in stored(channel)]
        assert eids == list(range(len(eids)))  # 0 .. n, each once
        assert len(eids) == 1 + 1 + sum(1 for events in batches for e in events if e.channel == channel)
    for events in batches:  # each batch has events on both channels
        for channel in channels:
            ids = [e.id for e in events if e.channel == channel]
            assert ids and ids == list(range(ids[0], ids[0] + len(ids)))
    by_id = {(channel, eid): kind for channel in channels for eid, kind, _data in stored(channel)}
    assert all(by_id[(e.channel, e.id)] == e.type for events in batches for e in events)


def test_a_batch_that_fails_part_way_is_re_sent_by_the_sweep(small_mission, monkeypatch, settings):
    """The mission's channel fails to store a committed event. On PostgreSQL each channel
    is one statement, the global one first: the global channel has the event, the
    mission's lacks it. Elsewhere the batch is one transaction: neither has it. Either
    way the sweep, which reads the mission's channel, re-sends it."""
    from missions.outbox import publish_on_commit
    from missions.relay import redeliver_missing

    m = small_mission.mission
    mine = f"mission-{m.pk}"
    redeliver_missing(grace_seconds=0)
    settings.FUSION_FAST_PATHS = True  # the failure is injected into the fast path's statements
    postgresql = connection.vendor == "postgresql"
    name = "_append_channel" if postgresql else "_insert"  # where each path writes the mission's rows
    real = getattr(storage_module, name)

    def failing(conn, *args):
        channels = [args[0]] if postgresql else [row[0] for row in args[0]]
        if mine in channels:
            raise RuntimeError("the database went away")
        return real(conn, *args)

    globally = len(stored("missions"))
    monkeypatch.setattr(storage_module, name, failing)
    with transaction.atomic():
        seq = publish_on_commit(m, "feature:updated", {"change": "half"}).seq
    monkeypatch.setattr(storage_module, name, real)

    def seqs(channel: str) -> list[int]:
        return [json.loads(json.loads(d))["seq"] for _e, kind, d in stored(channel) if kind]

    assert seq not in seqs(mine)
    assert (seq in seqs("missions")) is postgresql  # the global channel went first, alone
    assert len(stored("missions")) == globally + (1 if postgresql else 0)
    assert redeliver_missing(grace_seconds=0) == [(m.pk, seq)]
    assert seq in seqs(mine) and seq in seqs("missions")
