"""A user removed from a mission loses its live streams at once, not at their next
reconnect: SSE streams of this process get `stream-error` (forbidden for a mission's
stream, `channels-changed` for the list stream), every WebSocket closes with 4403, and a
stream whose access was revoked elsewhere (another process) ends on its keep-alive."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.db import transaction

from missions import streams
from missions.models import Mission
from missions.services.hierarchy import mission_update
from tests.dashboard.conftest import session_cookie
from tests.dashboard.test_websocket import communicator, publish

pytestmark = pytest.mark.django_db(transaction=True)


def opened(stream) -> None:
    assert stream.status == 200
    assert stream.next()["event"] == "stream-open"


def remove_member(mission: Mission, alice, user) -> None:
    with transaction.atomic():
        mission_update(mission=mission, user=alice, members=[u for u in mission.members.all() if u != user])


def test_a_removed_member_s_mission_stream_ends_forbidden(sse, small_mission, alice, bob, client):
    m = small_mission.mission
    m.members.add(bob)
    stream = sse(f"/events/missions/{m.pk}/", headers={"Cookie": session_cookie(client, bob)})
    opened(stream)
    kept = sse(f"/events/missions/{m.pk}/", headers={"Cookie": session_cookie(client, alice)})
    opened(kept)
    remove_member(m, alice, bob)
    error = stream.next()
    assert error["event"] == "stream-error" and error["json"]["condition"] == "forbidden"
    assert error["json"]["channels"] == [f"mission-{m.pk}"]
    with pytest.raises(EOFError):
        stream.next()
    # the owner's stream goes on: it sees the change itself
    assert kept.next()["json"]["changed"] == ["members"]


def test_a_removed_member_s_list_stream_is_told_its_channels_changed(sse, small_mission, alice, bob, client):
    m = small_mission.mission
    other = Mission.objects.create(key="other", title="Other", owner=bob)
    m.members.add(bob)
    stream = sse("/events/missions/", headers={"Cookie": session_cookie(client, bob)})
    opened(stream)
    remove_member(m, alice, bob)
    error = stream.next()
    assert error["event"] == "stream-error" and error["json"]["condition"] == "channels-changed"
    # reconnecting gives the channels of what bob may still see
    again = sse("/events/missions/", headers={"Cookie": session_cookie(client, bob)})
    opened(again)
    with transaction.atomic():
        mission_update(mission=other, user=bob, title="Other, renamed")
    assert again.next()["json"]["mission"] == other.pk


def test_a_membership_removed_elsewhere_ends_the_stream_on_its_keep_alive(sse, small_mission, alice, bob, client,
                                                                          monkeypatch):
    m = small_mission.mission
    m.members.add(bob)
    monkeypatch.setattr(streams, "KEEP_ALIVE_SECONDS", 0.3)
    stream = sse(f"/events/missions/{m.pk}/", headers={"Cookie": session_cookie(client, bob)})
    opened(stream)
    m.members.remove(bob)  # as another process would: no kick reaches this one
    error = stream.next(timeout=5)
    assert error["event"] == "stream-error" and error["json"]["condition"] == "forbidden"


def test_a_removed_member_s_websocket_closes_with_4403_and_others_stay(small_mission, alice, bob):
    m = small_mission.mission
    m.members.add(bob)
    removed, kept = communicator(m.pk, token=bob.token), communicator(m.pk, token=alice.token)

    async def run():
        assert (await removed.connect())[0] and (await kept.connect())[0]
        await database_sync_to_async(remove_member)(m, alice, bob)
        closed = await removed.receive_output(timeout=5)
        update = await kept.receive_json_from(timeout=5)
        seq = await database_sync_to_async(publish)(m.pk, "after")
        after = await kept.receive_json_from(timeout=5)
        await kept.disconnect()
        return closed, update, seq, after

    closed, update, seq, after = async_to_sync(run)()
    assert closed == {"type": "websocket.close", "code": 4403}
    assert update["data"]["changed"] == ["members"]
    assert after["id"] == seq
