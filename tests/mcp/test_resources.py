"""Resources and their subscriptions against a live `serve`: reads with the API's
visibility, and `resources/updated` when the mission's events touch them — through
`subscriptions/listen` (2026-07-28) and `resources/subscribe` (earlier clients)."""

from __future__ import annotations

import asyncio
import json

import anyio
import mcp_types as types
import pytest

from tests.mcp.conftest import api, http_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_subscriptions_receive_updates(serve, alice, bob, shop):
    server = serve()
    uri = f"fusion://missions/{shop.mission.pk}"

    def touch(title: str) -> None:
        status, _ = api(server, "PATCH", f"/api/missions/{shop.mission.pk}/", token=alice.token, body={"title": title})
        assert status == 200

    async def modern():
        async with http_client(server.mcp("shop"), token=alice.token) as client:
            tree = json.loads((await client.read_resource(uri)).contents[0].text)
            async with client.listen(resource_subscriptions=[uri]) as subscription:
                await anyio.to_thread.run_sync(touch, "Shop, listened")
                with anyio.fail_after(30):
                    async for event in subscription:
                        return tree, event

    async def legacy():
        updated = anyio.Event()
        seen: list[str] = []

        async def on_message(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                seen.append(str(message.params.uri))
                updated.set()

        async with http_client(server.mcp("shop"), token=alice.token, mode="legacy", message_handler=on_message) as c:
            await c.subscribe_resource(uri)
            await anyio.to_thread.run_sync(touch, "Shop, subscribed")
            with anyio.fail_after(30):
                await updated.wait()
        return seen

    async def stranger():
        async with http_client(server.mcp(), token=bob.token, mode="legacy") as client:
            errors = []
            for call in (client.read_resource(uri), client.subscribe_resource(uri)):
                try:
                    await call
                except Exception as exc:  # noqa: BLE001 - the refusal is what is asserted
                    errors.append(str(exc))
            return errors

    tree, event = asyncio.run(modern())
    assert tree["key"] == "shop" and tree["milestones"][0]["slices"][0]["features"][0]["key"] == "greet"
    assert event.uri == uri
    assert uri in asyncio.run(legacy())
    errors = asyncio.run(stranger())
    assert len(errors) == 2 and all("not found" in e for e in errors)
