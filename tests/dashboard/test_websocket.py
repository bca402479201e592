"""The WebSocket consumer through the project's real ASGI stack (Channels'
WebsocketCommunicator): accept, refuse with 4403, receive, and the same JSON as SSE."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import close_old_connections, transaction
from django_eventstream.models import Event as StoredEvent

from fusion_site.asgi import application
from missions.outbox import publish_on_commit
from tests.dashboard.conftest import session_cookie

# Their events carry payloads of their own making: the transport is under test.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("synthetic_events")]


def publish(mission_id: int, change: str) -> int:
    with transaction.atomic():
        return publish_on_commit(mission_id, "mission:updated", {"mission": mission_id, "change": change}).seq


def publish_from_a_worker_thread(mission_id: int, change: str) -> threading.Thread:
    """As a Dramatiq worker thread does: no event loop, its own database connection. The
    caller's event loop is not told when the thread is done (nothing else wakes it)."""

    def run():
        try:
            publish(mission_id, change)
        finally:
            close_old_connections()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def communicator(
    mission_id: int, *, cookie: str | None = None, token: str | None = None, header_token: str | None = None
) -> WebsocketCommunicator:
    headers = []
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    if header_token:
        headers.append((b"authorization", f"Token {header_token}".encode()))
    path = f"/ws/missions/{mission_id}/" + (f"?token={token}" if token else "")
    return WebsocketCommunicator(application, path, headers=headers)


def refused(comm: WebsocketCommunicator) -> int:
    async def run():
        connected, _ = await comm.connect()
        assert connected  # accepted, so that the close code reaches the client
        message = await comm.receive_output(timeout=60)
        await comm.disconnect()
        return message

    message = async_to_sync(run)()
    assert message["type"] == "websocket.close"
    return message["code"]


@pytest.mark.parametrize("how", ["session", "query token", "header token"])
def test_a_member_is_accepted_and_receives_events_with_their_id(small_mission, alice, client, how):
    m = small_mission.mission
    comm = communicator(
        m.pk,
        **{
            "session": {"cookie": session_cookie(client, alice)},
            "query token": {"token": alice.token},
            "header token": {"header_token": alice.token},
        }[how],
    )

    async def run():
        connected, _ = await comm.connect()
        assert connected
        seq = await database_sync_to_async(publish)(m.pk, "hello")
        message = await comm.receive_json_from(timeout=60)
        await comm.disconnect()
        return seq, message

    seq, message = async_to_sync(run)()
    assert message == {
        "id": seq,
        "event": "mission:updated",
        "data": {"type": "mission:updated", "mission": m.pk, "seq": seq, "change": "hello"},
    }


@pytest.mark.parametrize("who", ["non-member", "anonymous", "bad token", "non-member token", "unknown mission"])
def test_anyone_who_may_not_see_the_mission_is_refused_with_4403(small_mission, bob, client, who):
    m = small_mission.mission
    comm = {
        "non-member": lambda: communicator(m.pk, cookie=session_cookie(client, bob)),
        "anonymous": lambda: communicator(m.pk),
        "bad token": lambda: communicator(m.pk, token="not-a-token"),
        "non-member token": lambda: communicator(m.pk, header_token=bob.token),
        "unknown mission": lambda: communicator(m.pk + 1000, cookie=session_cookie(client, bob)),
    }[who]()
    assert refused(comm) == 4403


def test_a_bad_token_is_refused_even_with_a_members_session(small_mission, alice, client):
    comm = communicator(small_mission.mission.pk, cookie=session_cookie(client, alice), token="forged")
    assert refused(comm) == 4403


@pytest.mark.usefixtures("own_channel_layer")
def test_an_event_published_by_a_worker_thread_wakes_the_consumer(small_mission, alice):
    """Events are published from Dramatiq worker threads, outside the server's event loop;
    the in-memory layer must wake the consumer itself. Nothing else is due on the loop
    before the receive's own timeout, so a consumer left asleep would see the event, if at
    all, only once that timeout woke the loop: the event must come first."""
    m = small_mission.mission
    comm = communicator(m.pk, token=alice.token)

    async def run():
        connected, _ = await comm.connect()
        assert connected
        receiving = asyncio.ensure_future(comm.receive_json_from(timeout=240))
        thread = publish_from_a_worker_thread(m.pk, "from a worker")
        done, _ = await asyncio.wait([receiving], timeout=120)
        arrived_first = receiving in done
        message = await receiving
        thread.join(60)
        await comm.disconnect()
        return message, arrived_first

    message, arrived_first = async_to_sync(run)()
    assert message["data"]["change"] == "from a worker"
    assert arrived_first, "the event reached the client only when a timeout woke the loop"


@pytest.mark.usefixtures("own_channel_layer")
def test_the_events_of_one_transaction_are_one_group_send_and_a_frame_each(small_mission, alice, monkeypatch):
    """A committed step's events go to the mission's group in one message (a group send
    costs Redis round trips whatever it carries); every client still gets one frame per
    event, in `seq` order."""
    from channels.layers import get_channel_layer

    m = small_mission.mission
    layer = get_channel_layer()
    sent: list[tuple[str, str]] = []
    real_send = layer.group_send

    async def counting(group, message):
        sent.append((group, message["type"]))
        await real_send(group, message)

    monkeypatch.setattr(layer, "group_send", counting)
    first, second = communicator(m.pk, token=alice.token), communicator(m.pk, token=alice.token)

    def three_events() -> list[int]:
        try:
            with transaction.atomic():
                return [
                    publish_on_commit(m.pk, "mission:updated", {"mission": m.pk, "change": str(n)}).seq
                    for n in range(3)
                ]
        finally:
            close_old_connections()

    async def run():
        for comm in (first, second):
            connected, _ = await comm.connect()
            assert connected
        seqs = await database_sync_to_async(three_events)()
        received = [[await comm.receive_json_from(timeout=60) for _ in range(3)] for comm in (first, second)]
        sends = list(sent)
        # A later event is each client's next frame: the transaction sent no frame more.
        await database_sync_to_async(publish)(m.pk, "later")
        following = [(await comm.receive_json_from(timeout=60))["data"]["change"] for comm in (first, second)]
        for comm in (first, second):
            await comm.disconnect()
        return seqs, received, sends, following

    seqs, received, sends, following = async_to_sync(run)()
    for frames in received:
        assert [f["id"] for f in frames] == seqs == sorted(seqs)
        assert [f["data"]["change"] for f in frames] == ["0", "1", "2"]
    assert sends == [(f"mission-{m.pk}", "mission.events")]
    assert following == ["later", "later"]


def test_the_websocket_carries_the_same_json_as_sse(small_mission, alice, sse, client):
    m = small_mission.mission
    stream = sse(f"/events/missions/{m.pk}/", headers={"Cookie": session_cookie(client, alice)})
    assert stream.next()["event"] == "stream-open"
    comm = communicator(m.pk, token=alice.token)

    async def run():
        connected, _ = await comm.connect()
        assert connected
        thread = publish_from_a_worker_thread(m.pk, "same")
        message = await comm.receive_json_from(timeout=60)
        thread.join(60)
        await comm.disconnect()
        return message

    ws_message = async_to_sync(run)()
    sse_event = stream.next()
    assert sse_event["event"] == ws_message["event"]
    assert sse_event["json"] == ws_message["data"]
    assert ws_message["id"] == ws_message["data"]["seq"]
    stored = StoredEvent.objects.filter(channel=f"mission-{m.pk}").order_by("-eid").first()
    assert sse_event["id"] == f"mission-{m.pk}:{stored.eid}"


def test_the_in_memory_layer_keeps_channels_semantics():
    from missions.streams import InMemoryChannelLayer

    layer = InMemoryChannelLayer(capacity=2)

    async def run():
        a, b = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("g", a)
        await layer.group_add("g", b)
        await layer.group_send("g", {"type": "x", "n": 1})
        assert [(await layer.receive(a))["n"], (await layer.receive(b))["n"]] == [1, 1]
        await layer.group_discard("g", b)
        for n in (2, 3, 4):  # capacity 2: a full member misses the rest, the sender is not told
            await layer.group_send("g", {"type": "x", "n": n})
        assert [(await layer.receive(a))["n"], (await layer.receive(a))["n"]] == [2, 3]
        await layer.send(b, {"type": "direct"})
        assert (await layer.receive(b))["type"] == "direct"
        waiting = asyncio.ensure_future(layer.receive(a))
        await asyncio.sleep(0)
        waiting.cancel()  # a receiver that goes away takes its queue with it
        await asyncio.gather(waiting, return_exceptions=True)
        assert a not in layer.channels

        expiring = InMemoryChannelLayer(expiry=0)
        expiring.SWEEP_EVERY = 0
        c = await expiring.new_channel()
        await expiring.group_add("g", c)
        await expiring.group_send("g", {"type": "x"})
        expiring._clean_expired()  # an expired message takes its channel out of every group
        assert c not in expiring.groups.get("g", {})

    async_to_sync(run)()
