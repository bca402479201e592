"""A user removed from a mission loses its live streams at once, not at their next
reconnect: SSE streams of this process get `stream-error` (forbidden for a mission's
stream, `channels-changed` for the list stream), every WebSocket closes with 4403, and a
stream whose access was revoked elsewhere (another process) ends on its keep-alive."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.db import transaction

from missions.models import Mission
from missions.services.hierarchy import mission_update
from missions.streams import views as stream_views
from tests.dashboard.conftest import session_cookie
from tests.dashboard.test_websocket import communicator, publish

# Their events carry payloads of their own making (`test_websocket.publish`).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("synthetic_events")]


def opened(stream) -> None:
    assert stream.status == 200
    assert stream.next()["event"] == "stream-open"


def remove_member(mission: Mission, alice, user) -> None:
    with transaction.atomic():
        mission_update(mission=mission, user=alice, members=[u for u in mission.members.all() if u != user])


def removed_elsewhere(sse, mission, user, client, monkeypatch, *, every: float = 0.4):
    """`user`'s open stream of `mission`, then their membership removed as another process
    would (no kick reaches this one); streams re-check (and keep alive) every `every` s."""
    mission.members.add(user)
    monkeypatch.setattr(stream_views, "KEEP_ALIVE_SECONDS", every)
    stream = sse(f"/events/missions/{mission.pk}/", headers={"Cookie": session_cookie(client, user)})
    opened(stream)
    mission.members.remove(user)
    return stream


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


def test_a_membership_removed_elsewhere_ends_the_stream_on_its_keep_alive(
    sse, small_mission, alice, bob, client, monkeypatch
):
    m = small_mission.mission
    stream = removed_elsewhere(sse, m, bob, client, monkeypatch)
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


def test_a_member_removed_in_the_admin_loses_the_websocket(small_mission, alice, bob, admin_client):
    from django.urls import reverse

    m = small_mission.mission
    m.members.add(bob)
    url = reverse("admin:missions_mission_change", args=[m.pk])
    page = admin_client.get(url)
    form = page.context["adminform"].form
    data = {
        name: form.initial.get(name)
        for name in (
            "key",
            "title",
            "description",
            "retry_budget",
            "validator",
            "repository",
            "credentials_env",
            "base_revision",
            "executor",
            "executor_command",
            "on_protected_change",
        )
    }
    data["protected_paths"] = "[]"
    data.update(owner=alice.pk, members=[], auto_fix="on" if m.auto_fix else "")
    for inline in page.context["inline_admin_formsets"]:  # leave the inlines as they are
        data.update({f"{inline.formset.prefix}-TOTAL_FORMS": 0, f"{inline.formset.prefix}-INITIAL_FORMS": 0})
    data = {k: ("" if v is None else v) for k, v in data.items()}
    comm = communicator(m.pk, token=bob.token)

    async def run():
        assert (await comm.connect())[0]
        answer = await database_sync_to_async(admin_client.post)(url, data)
        closed = await comm.receive_output(timeout=5)
        return answer, closed

    answer, closed = async_to_sync(run)()
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert not m.members.filter(pk=bob.pk).exists()
    assert closed == {"type": "websocket.close", "code": 4403}


def test_a_busy_stream_is_re_checked_too(sse, small_mission, alice, bob, client, monkeypatch):
    """A stream that is never idle long enough for a keep-alive still re-checks its access
    once the interval has passed. The re-check's clock is driven by the test, not by how
    many events this machine publishes in wall time: events before the interval are sent
    (no check), the first event after it ends the stream (the check) and is not sent."""
    now = [1000.0]
    monkeypatch.setattr(stream_views, "clock", lambda: now[0])
    # A keep-alive (and so an idle re-check) would come after 60 s only: within the
    # 5 s the test waits for each event, only an event can wake the stream.
    m = small_mission.mission
    stream = removed_elsewhere(sse, m, bob, client, monkeypatch, every=60)
    for n in range(3):
        publish(m.pk, f"busy {n}")
        event = stream.next(timeout=5)
        assert event["event"] == "mission:updated" and event["json"]["change"] == f"busy {n}", event
    now[0] += 60  # the interval has passed, with no idle moment
    publish(m.pk, "after the interval")
    error = stream.next(timeout=5)
    assert error["event"] == "stream-error" and error["json"]["condition"] == "forbidden", error
    assert error["json"]["channels"] == [f"mission-{m.pk}"]
    with pytest.raises(EOFError):
        stream.next(timeout=5)
