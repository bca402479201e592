"""`manage.py watch_mission`: the WebSocket's first real client, against a real server."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from missions.management.commands.watch_mission import WebSocketClient, WebSocketClosed
from missions.outbox import publish_on_commit

# Their events carry payloads of their own making: the transport is under test.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("synthetic_events")]


def publish(mission, change: str) -> int:
    with transaction.atomic():
        return publish_on_commit(mission, "mission:updated", {"mission": mission.pk, "change": change}).seq


def watch_in_background(*args, **kwargs) -> tuple[threading.Thread, io.StringIO, list]:
    out, errors = io.StringIO(), []

    def run():
        try:
            call_command("watch_mission", *args, stdout=out, stderr=io.StringIO(), **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out, errors


def publish_until_done(mission, thread: threading.Thread, timeout: float = 15) -> list[int]:
    """The watcher connects at some point after it starts: keep publishing until it has
    seen what it waits for (it exits after --count events)."""
    seqs, deadline = [], time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        seqs.append(publish(mission, f"tick {len(seqs)}"))
        thread.join(0.3)
    assert not thread.is_alive(), "watch_mission did not see its events"
    return seqs


def test_it_prints_live_events_by_mission_key(asgi_server, small_mission, alice):
    m = small_mission.mission
    thread, out, errors = watch_in_background(m.key, url=asgi_server.ws, token=alice.token, count=2, timeout=20)
    seqs = publish_until_done(m, thread)
    assert not errors, errors
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 2
    assert all(" mission:updated " in line and "change=tick" in line for line in lines)
    printed = [int(line.split("#")[1].split()[0]) for line in lines]
    assert printed == sorted(printed) and set(printed) <= set(seqs)


def test_json_output_is_the_websocket_message(asgi_server, small_mission, alice):
    m = small_mission.mission
    thread, out, errors = watch_in_background(str(m.pk), "--json", url=asgi_server.ws, token=alice.token, count=1)
    publish_until_done(m, thread)
    assert not errors, errors
    message = json.loads(out.getvalue())
    assert message["event"] == "mission:updated" and message["id"] == message["data"]["seq"]
    assert message["data"]["mission"] == m.pk


def test_a_refused_watcher_says_so(asgi_server, small_mission, bob):
    with pytest.raises(CommandError, match="refused \\(4403\\)"):
        call_command(
            "watch_mission",
            str(small_mission.mission.pk),
            url=asgi_server.ws,
            token=bob.token,
            count=1,
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    with pytest.raises(CommandError, match="token is needed"):
        call_command("watch_mission", "1", url=asgi_server.ws, token="", stdout=io.StringIO(), stderr=io.StringIO())


def test_the_server_closes_a_refused_websocket_with_code_4403(asgi_server, small_mission, bob):
    async def run():
        client = await WebSocketClient.connect(
            f"{asgi_server.ws}/ws/missions/{small_mission.mission.pk}/?token={bob.token}"
        )
        with pytest.raises(WebSocketClosed) as closed:
            await asyncio.wait_for(client.recv(), 5)
        return closed.value.code

    assert asyncio.run(run()) == 4403
