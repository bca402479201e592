"""A member removed from a mission hears nothing more of it on an open MCP stream, against
a live `serve`: their `subscriptions/listen` stream ends and their `resources/subscribe`
subscription is dropped, while the owner, listening the same way, goes on hearing."""

from __future__ import annotations

import asyncio
import time
import warnings

import anyio
import mcp_types as types
import pytest

from tests.mcp.conftest import api, http_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SETTLE = 0.5  # seconds: longer than a coalescing window (validation/mcp/live.py), and then some


def test_a_removed_member_hears_nothing_more_of_the_mission(serve, alice, bob, shop):
    shop.mission.members.add(bob)
    server = serve()
    mission_id = shop.mission.pk
    uri = f"fusion://missions/{mission_id}"
    heard: dict[str, list[str]] = {"alice": [], "bob": [], "alice-legacy": [], "bob-legacy": []}
    bob_stream_ended = anyio.Event()
    ready = {name: anyio.Event() for name in heard}
    done = anyio.Event()

    def patch(body: dict) -> None:
        status, answer = api(server, "PATCH", f"/api/missions/{mission_id}/", token=alice.token, body=body)
        assert status == 200, answer

    async def listener(name: str, token: str) -> None:
        async with (
            http_client(server.mcp("shop"), token=token) as client,
            client.listen(resource_subscriptions=[uri]) as subscription,
        ):
            ready[name].set()
            async with anyio.create_task_group() as group:

                async def consume() -> None:
                    async for event in subscription:
                        heard[name].append(str(event.uri))
                    if name == "bob":
                        bob_stream_ended.set()  # the server ended it: nothing left to hear

                group.start_soon(consume)
                await done.wait()
                group.cancel_scope.cancel()

    async def subscriber(name: str, token: str) -> None:
        async def on_message(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                heard[name].append(str(message.params.uri))

        async with http_client(server.mcp("shop"), token=token, mode="legacy", message_handler=on_message) as client:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # resources/subscribe is deprecated for 2026-07-28 clients
                await client.subscribe_resource(uri)
            ready[name].set()
            await done.wait()

    async def until(condition, what: str) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, f"not within 30 s: {what} ({heard})"
            await anyio.sleep(0.02)

    async def driver() -> dict[str, int]:
        try:
            with anyio.fail_after(60):
                for event in ready.values():
                    await event.wait()
            # Everyone hears while bob is a member.
            await anyio.to_thread.run_sync(patch, {"title": "Shop, heard by all"})
            await until(lambda: all(heard.values()), "every client heard the first change")
            await anyio.sleep(SETTLE)
            before = {name: len(uris) for name, uris in heard.items()}
            # bob is removed (the revocation commits with its own mission:updated), then
            # the mission changes twice more, a window apart.
            await anyio.to_thread.run_sync(patch, {"members": []})
            await until(bob_stream_ended.is_set, "bob's listen stream ended")
            for title in ("Shop, after the removal", "Shop, later still"):
                await anyio.sleep(SETTLE)
                await anyio.to_thread.run_sync(patch, {"title": title})
            await until(
                lambda: all(len(heard[n]) >= before[n] + 2 for n in ("alice", "alice-legacy")),
                "the owner heard the later changes",
            )
            await anyio.sleep(SETTLE)
            return before
        finally:
            done.set()

    async def scenario() -> dict[str, int]:
        results = await asyncio.gather(
            driver(),
            listener("alice", alice.token),
            listener("bob", bob.token),
            subscriber("alice-legacy", alice.token),
            subscriber("bob-legacy", bob.token),
        )
        return results[0]

    before = asyncio.run(scenario())

    assert before["bob"] >= 1 and before["bob-legacy"] >= 1, heard
    # Not one notification of the mission reached bob after his removal, on either kind of stream.
    assert len(heard["bob"]) == before["bob"], heard
    assert len(heard["bob-legacy"]) == before["bob-legacy"], heard
    assert set(heard["alice"]) == set(heard["alice-legacy"]) == {uri}
