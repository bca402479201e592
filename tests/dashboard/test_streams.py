"""Server-sent events over real HTTP (Daphne): who may read which stream, ids on every
event, replay from Last-Event-ID, a reset for an id that is too old, token sign-in."""

from __future__ import annotations

import json

import pytest
from django.db import transaction
from django_eventstream.models import Event as StoredEvent

from missions.models import Mission
from missions.outbox import publish_on_commit
from tests.dashboard.conftest import publish_in_a_rolled_back_savepoint, session_cookie

# Their events carry payloads of their own making: the transport is under test.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("synthetic_events")]


def publish(mission, change: str, type: str = "mission:updated") -> int:
    with transaction.atomic():
        event = publish_on_commit(mission, type, {"mission": mission.pk, "change": change})
    return event.seq


def opened(stream) -> None:
    assert stream.status == 200
    assert stream.next()["event"] == "stream-open"


def test_a_member_receives_each_event_with_its_id_and_json(sse, small_mission, alice, client):
    m = small_mission.mission
    stream = sse(f"/events/missions/{m.pk}/", headers={"Cookie": session_cookie(client, alice)})
    opened(stream)
    seq = publish(m, "poked")
    event = stream.next()
    assert event["event"] == "mission:updated"
    stored = StoredEvent.objects.filter(channel=f"mission-{m.pk}").order_by("-eid").first()
    assert event["id"] == f"mission-{m.pk}:{stored.eid}"
    assert event["json"] == {"type": "mission:updated", "mission": m.pk, "seq": seq, "change": "poked"}


def test_a_reconnecting_client_gets_what_it_missed_from_last_event_id(sse, small_mission, alice, client):
    m = small_mission.mission
    cookie = session_cookie(client, alice)
    first = sse(f"/events/missions/{m.pk}/", headers={"Cookie": cookie})
    opened(first)
    publish(m, "one")
    last_id = first.next()["id"]
    first.close()
    missed = [publish(m, "two"), publish(m, "three")]
    for how in ("header", "query"):
        if how == "header":
            again = sse(f"/events/missions/{m.pk}/", headers={"Cookie": cookie, "Last-Event-ID": last_id})
        else:
            again = sse(f"/events/missions/{m.pk}/?lastEventId={last_id}", headers={"Cookie": cookie})
        opened(again)
        replayed = [again.next(), again.next()]
        assert [e["json"]["seq"] for e in replayed] == missed
        assert [e["json"]["change"] for e in replayed] == ["two", "three"]
        again.close()


def test_an_id_that_is_too_old_gets_a_reset(sse, small_mission, alice, client):
    m = small_mission.mission
    cookie = session_cookie(client, alice)
    first = sse(f"/events/missions/{m.pk}/", headers={"Cookie": cookie})
    opened(first)
    publish(m, "one")
    last_id = first.next()["id"]
    first.close()
    publish(m, "two")
    # The event log is trimmed (django-eventstream keeps a day): the client's id is gone.
    StoredEvent.objects.filter(channel=f"mission-{m.pk}", eid__lte=int(last_id.split(":")[1])).delete()
    again = sse(f"/events/missions/{m.pk}/", headers={"Cookie": cookie, "Last-Event-ID": last_id})
    opened(again)
    reset = again.next()
    assert reset["event"] == "stream-reset" and reset["json"] == {"channels": [f"mission-{m.pk}"]}
    publish(m, "three")
    assert again.next()["json"]["change"] == "three"  # and it goes on from the current id


@pytest.mark.parametrize("who", ["non-member", "anonymous", "bad token", "non-member token"])
def test_anyone_who_may_not_see_the_mission_gets_stream_error_forbidden(sse, small_mission, bob, client, who):
    m = small_mission.mission
    headers = {
        "non-member": {"Cookie": session_cookie(client, bob)},
        "anonymous": {},
        "bad token": {"Authorization": "Token nope"},
        "non-member token": {"Authorization": f"Token {bob.token}"},
    }[who]
    stream = sse(f"/events/missions/{m.pk}/", headers=headers)
    assert stream.status == 200
    error = stream.next()
    assert error["event"] == "stream-error" and error["id"] == "error"
    assert error["json"]["condition"] == "forbidden"
    assert error["json"]["channels"] == [f"mission-{m.pk}"]
    # An EventSource reconnects with Last-Event-ID "error": it is told not to come back.
    again = sse(f"/events/missions/{m.pk}/", headers={**headers, "Last-Event-ID": "error"})
    assert again.status == 400


def test_programs_read_a_stream_with_a_token(sse, small_mission, alice):
    m = small_mission.mission
    stream = sse(f"/events/missions/{m.pk}/", headers={"Authorization": f"Token {alice.token}"})
    opened(stream)
    seq = publish(m, "for programs")
    assert stream.next()["json"]["seq"] == seq


def test_the_missions_stream_is_every_mission_for_staff_and_ones_own_for_others(
    sse, small_mission, alice, bob, staff, client, django_user_model
):
    carol = django_user_model.objects.create_user("carol")
    theirs = Mission.objects.create(key="theirs", title="Theirs", owner=carol)
    ours = small_mission.mission

    everything = sse("/events/missions/", headers={"Cookie": session_cookie(client, staff)})
    opened(everything)
    own = sse("/events/missions/", headers={"Cookie": session_cookie(client, alice)})
    opened(own)
    nothing = sse("/events/missions/", headers={"Cookie": session_cookie(client, bob)})
    assert nothing.next()["event"] == "stream-error"  # bob is a member of nothing

    publish(theirs, "carol's")
    publish(ours, "alice's")
    assert [e["json"]["change"] for e in (everything.next(), everything.next())] == ["carol's", "alice's"]
    assert own.next()["json"]["change"] == "alice's"  # carol's event never reached alice


def test_events_published_while_a_client_connects_arrive_once_each_and_in_order(sse, small_mission, alice):
    """Stored replay and live delivery meet while events keep coming: no gap, no repeat."""
    import threading

    from django.db import close_old_connections
    from django_eventstream import get_current_event_id

    m = small_mission.mission
    start = get_current_event_id([f"mission-{m.pk}"])
    published: list[int] = []

    def publisher():
        try:
            for i in range(40):
                published.append(publish(m, f"burst {i}"))
        finally:
            close_old_connections()

    thread = threading.Thread(target=publisher)
    thread.start()
    stream = sse(f"/events/missions/{m.pk}/?lastEventId={start}", headers={"Authorization": f"Token {alice.token}"})
    opened(stream)
    thread.join(30)
    seen = [
        e["json"]["seq"]
        for e in stream.until(lambda e: e.get("json", {}).get("seq") == published[-1], timeout=15)
        if e["event"] == "mission:updated"
    ]
    assert seen == published


def test_a_live_event_that_was_also_read_from_the_store_is_sent_once():
    """The race behind it: an event stored just before the stream's database read is in
    that read, and is queued to the live listener a moment later."""
    from django_eventstream.event import Event
    from django_eventstream.views import Listener, get_listener_manager

    from missions.streams import _Sent, _take

    manager, listener, sent = get_listener_manager(), Listener(), _Sent()
    sent.add("mission-1", 7)  # read from the store and sent
    listener.channel_items = {
        "mission-1": [
            Event("mission-1", "mission:updated", '{"seq": 7}', id=7),
            Event("mission-1", "mission:updated", '{"seq": 9}', id=9),
            Event("mission-1", "mission:updated", '{"seq": 8}', id=8),
        ]
    }
    last_ids = {"mission-1": "7"}
    body, overflow, refused = _take(listener, manager, last_ids, sent)
    assert body.count("event: mission:updated") == 2 and '{"seq": 7}' not in body
    assert last_ids == {"mission-1": 9}  # an event queued out of order does not move the resume point back
    assert (overflow, refused) == (False, False) and listener.channel_items == {}


def test_the_events_of_one_transaction_arrive_in_order_and_a_rolled_back_savepoint_sends_none(
    sse, small_mission, alice, client
):
    """One commit's events are stored together (`missions.outbox`): consecutive
    ids, `seq` order, both channels; the events of a savepoint rolled back go nowhere."""
    m = small_mission.mission
    stream = sse(f"/events/missions/{m.pk}/", headers={"Cookie": session_cookie(client, alice)})
    opened(stream)
    before = StoredEvent.objects.filter(channel="missions").count()
    with transaction.atomic():
        kept = [publish_on_commit(m, "mission:updated", {"change": "one"}).seq]
        publish_in_a_rolled_back_savepoint(m)
        kept.append(publish_on_commit(m, "feature:updated", {"change": "two"}).seq)
        kept.append(publish_on_commit(m, "task:updated", {"change": "three"}).seq)  # not a global type
        assert not StoredEvent.objects.filter(channel=f"mission-{m.pk}", data__contains="rolled").exists()
    received = [stream.next() for _ in kept]
    assert [e["json"]["seq"] for e in received] == kept
    assert [e["json"]["change"] for e in received] == ["one", "two", "three"]
    ids = [int(e["id"].rsplit(":", 1)[1]) for e in received]
    assert ids == list(range(ids[0], ids[0] + 3))
    stored = StoredEvent.objects.filter(channel=f"mission-{m.pk}").exclude(type="").order_by("eid")
    assert "rolled back" not in "".join(stored.values_list("data", flat=True))
    assert StoredEvent.objects.filter(channel="missions").count() == before + 2  # mission:updated, feature:updated


def stream_writes(queries) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "django_eventstream" in q["sql"]]


def test_a_transaction_s_events_are_stored_in_one_write(small_mission):
    """Three events, two channels: on PostgreSQL one statement per channel (the counter's
    bump and the insert), elsewhere one counter bump per channel and one insert in one
    transaction (the write the loop pays once per step instead of once per event)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    m = small_mission.mission
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        for change in ("a", "b", "c"):
            publish_on_commit(m, "feature:updated", {"change": change})
    streamed = stream_writes(queries)
    if connection.vendor == "postgresql":
        assert len(streamed) == 2 and all(sql.startswith("WITH bumped AS (UPDATE") for sql in streamed)
        # the global channel first, the mission's last (what the sweep looks at)
        assert "'missions'" in streamed[0] and f"'mission-{m.pk}'" in streamed[1]
    else:
        assert len([sql for sql in streamed if sql.startswith("UPDATE")]) == 2
        assert len([sql for sql in streamed if sql.startswith("INSERT")]) == 1
    for channel in (f"mission-{m.pk}", "missions"):
        last = StoredEvent.objects.filter(channel=channel).order_by("-eid").values_list("eid", "data")[:3]
        eids, changes = zip(
            *[(eid, json.loads(json.loads(data))["change"]) for eid, data in reversed(last)], strict=True
        )
        assert changes == ("a", "b", "c") and eids == tuple(range(eids[0], eids[0] + 3))


def test_events_published_inside_a_block_without_savepoint_are_stored_with_the_rest(small_mission):
    """`atomic(savepoint=False)` (every state machine's move) is no savepoint level of its
    own: its events join the transaction's one write."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    m = small_mission.mission
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        publish_on_commit(m, "task:updated", {"change": "a"})
        with transaction.atomic(savepoint=False):
            publish_on_commit(m, "task:updated", {"change": "b"})
        publish_on_commit(m, "task:updated", {"change": "c"})
    assert len([sql for sql in stream_writes(queries) if "INSERT INTO" in sql]) == 1
    stored = StoredEvent.objects.filter(channel=f"mission-{m.pk}").exclude(type="").order_by("-eid")[:3]
    assert [json.loads(json.loads(e.data))["change"] for e in reversed(stored)] == ["a", "b", "c"]


def test_a_group_nobody_is_in_costs_no_hop_to_the_server_loop(monkeypatch):
    """The in-process layer knows its groups: an event for a mission no WebSocket client
    watches is not carried to the server's loop; one that is watched is."""
    from asgiref.sync import async_to_sync

    from missions import delivery
    from missions.streams import InMemoryChannelLayer

    layer = InMemoryChannelLayer()
    sent: list[list[str]] = []

    async def record(layer, messages):
        sent.append([group for group, _message in messages])

    monkeypatch.setattr(delivery, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(delivery, "_send_each", record)
    delivery.group_send([("mission-1", {"type": "mission.event"}), ("mission-2", {"type": "mission.event"})])
    assert sent == []
    async_to_sync(layer.group_add)("mission-2", "specific.client")
    delivery.group_send([("mission-1", {"type": "mission.event"}), ("mission-2", {"type": "mission.event"})])
    assert sent == [["mission-2"]]


@pytest.mark.usefixtures("own_channel_layer")
def test_a_group_nobody_is_in_gets_no_send_and_one_with_a_member_gets_it(small_mission, monkeypatch):
    """A step's events go to its mission's Channels group only when a WebSocket client is
    in it: on Redis the stream's publishing round trip asks which groups have members
    (`delivery.stream(…, groups=…)`), the in-process layer knows. The member gets the
    events either way."""
    import asyncio

    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from missions.delivery import group_name

    m = small_mission.mission
    layer = get_channel_layer()
    sent: list[str] = []
    real_send = layer.group_send

    async def counting(group, message):
        sent.append(group)
        await real_send(group, message)

    monkeypatch.setattr(layer, "group_send", counting)

    def publish(change: str) -> int:
        with transaction.atomic():
            return publish_on_commit(m.pk, "mission:updated", {"change": change}).seq

    publish("unwatched")
    assert sent == []

    async def join() -> str:
        channel = await layer.new_channel()
        await layer.group_add(group_name(m.pk), channel)
        return channel

    async def take(channel: str) -> dict:
        return await asyncio.wait_for(layer.receive(channel), timeout=10)

    channel = async_to_sync(join)()
    seq = publish("watched")
    assert sent == [group_name(m.pk)]
    message = async_to_sync(take)(channel)
    assert [(e["event"], e["id"], e["data"]["change"]) for e in message["events"]] == [
        ("mission:updated", seq, "watched")
    ]


def test_the_stream_says_which_groups_have_members_only_for_a_layer_on_its_redis():
    """`delivery.stream` answers about groups only when the Channels layer keeps them on
    the stream's own Redis server and database; for any other layer it says it cannot
    tell (None), and every group gets its send."""
    from django_eventstream import eventstream

    from missions import delivery

    client = eventstream.redis_client
    if client is None:  # the embedded shape: the stream publishes in-process
        assert delivery.stream([("mission-1", "x", "{}")], groups=["mission-1"]) is None
        return
    kwargs = client.connection_pool.connection_kwargs
    same = f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs['db']}"
    other_db = f"redis://{kwargs['host']}:{kwargs['port']}/{int(kwargs['db']) + 1}"
    assert delivery._same_server([{"address": same}], client)
    assert not delivery._same_server([{"address": other_db}], client)
    assert not delivery._same_server([{"address": same}, {"address": same}], client)  # sharded
    assert not delivery._same_server([{"address": f"redis://{kwargs['host']}:1/{kwargs['db']}"}], client)


def test_the_sweep_resends_exactly_the_events_the_stream_lost(small_mission):
    """`redeliver_missing` reads the `seq` of every stored event of the window (without
    decoding it, for the shape this release stores; another shape is decoded) and re-sends
    only the recorded events the stream does not hold."""
    from missions.relay import redeliver_missing

    m = small_mission.mission
    redeliver_missing(grace_seconds=0)  # what the fixture's own events left, out of the way
    seqs = []
    for change in ("a", "b", "c"):
        with transaction.atomic():
            seqs.append(publish_on_commit(m, "task:updated", {"change": change}).seq)
    channel = f"mission-{m.pk}"
    lost = StoredEvent.objects.get(channel=channel, data__contains=f'\\"seq\\": {seqs[1]},')
    lost.delete()
    # an event stored in another shape (its data encoded once, `seq` not third) still counts
    other = StoredEvent.objects.get(channel=channel, data__contains=f'\\"seq\\": {seqs[2]},')
    other.data = json.dumps({"seq": seqs[2], "type": "task:updated", "mission": m.pk})
    other.save()

    assert redeliver_missing(grace_seconds=0) == [(m.pk, seqs[1])]
    resent = StoredEvent.objects.filter(channel=channel, eid__gt=other.eid).exclude(type="").get()
    assert json.loads(json.loads(resent.data))["seq"] == seqs[1]
    assert redeliver_missing(grace_seconds=0) == []
