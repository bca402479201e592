"""Sign-in of the MCP endpoint, in process (the ASGI app itself, with the SDK's client over
an ASGI transport): a tool call of a signed-in credential costs one database trip, the
handler's own, which checks the credential again; so a deleted token, a logged-out
session, a deactivated user or a removed membership is refused on the very next call."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import pytest
from django.conf import settings
from django.test import Client as DjangoClient

from tests.mcp.conftest import structured

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "http://127.0.0.1"


@pytest.fixture
def trips(monkeypatch) -> list[int]:
    """One entry per function run in a pool thread by `validation.mcp.context.db`."""
    from validation.mcp import context

    made: list[int] = []
    real = context.sync_to_async

    def counted(fn, **kwargs):
        wrapped = real(fn, **kwargs)

        async def call(*args, **kw):
            made.append(1)
            return await wrapped(*args, **kw)

        return call

    monkeypatch.setattr(context, "sync_to_async", counted)
    return made


@asynccontextmanager
async def mcp(path: str, headers: dict[str, str]):
    """The SDK's client against a fresh McpApp, in this process; yields (client, http)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from validation.mcp.transports import McpApp

    transport = httpx2.ASGITransport(app=McpApp())
    async with (
        httpx2.AsyncClient(transport=transport, base_url=BASE, headers=headers, timeout=30) as http,
        Client(streamable_http_client(f"{BASE}{path}", http_client=http)) as client,
    ):
        yield client, http


async def orm(fn):
    """A write of the test's, off the event loop (the ORM refuses to run on it)."""
    from validation.mcp.context import db

    return await db(fn)()


def tools_list(http, **headers: str):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return http.post(
        "/mcp/missions/shop/",
        content=json.dumps(body),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
    )


def test_a_tool_call_is_one_database_trip(alice, shop, trips):
    async def scenario() -> list[list[str]]:
        async with mcp("/mcp/missions/shop/", {"Authorization": f"Bearer {alice.token}"}) as (client, _http):
            assert not (await client.call_tool("mission_status", {})).is_error  # signs in
            per_call = []
            for name, arguments in [("feature_loop", {"feature": "greet"}), ("mission_status", {})] * 2:
                before = len(trips)
                result = await client.call_tool(name, arguments)
                assert not result.is_error, result
                per_call.append(len(trips) - before)
            return per_call

    # The tool's own trip, which also checks the token: none before it to sign in.
    assert asyncio.run(scenario()) == [1, 1, 1, 1]


def test_a_deleted_token_is_refused_on_the_next_call_then_answered_401(alice, shop):
    from rest_framework.authtoken.models import Token

    async def scenario():
        async with mcp("/mcp/missions/shop/", {"Authorization": f"Bearer {alice.token}"}) as (client, http):
            assert structured(await client.call_tool("feature_loop", {"feature": "greet"}))["key"] == "greet"
            await orm(lambda: Token.objects.filter(key=alice.token).delete())
            refused = await client.call_tool("feature_loop", {"feature": "greet"})
            return refused, (await tools_list(http)).status_code

    refused, status = asyncio.run(scenario())
    assert refused.is_error and structured(refused)["code"] == "not_authenticated"
    assert "greet" not in json.dumps(structured(refused))
    assert status == 401  # the refusal forgot the credential: the next request signs in afresh


def test_a_deactivated_user_is_refused_on_the_next_call(alice, shop):
    async def scenario():
        async with mcp("/mcp/missions/shop/", {"Authorization": f"Bearer {alice.token}"}) as (client, _http):
            assert not (await client.call_tool("mission_status", {})).is_error
            await orm(lambda: type(alice).objects.filter(pk=alice.pk).update(is_active=False))
            return await client.call_tool("mission_status", {})

    refused = asyncio.run(scenario())
    assert refused.is_error and structured(refused)["code"] == "not_authenticated"


def test_a_removed_member_is_refused_on_the_next_call(bob, shop):
    shop.mission.members.add(bob)

    async def scenario():
        async with mcp("/mcp/missions/shop/", {"Authorization": f"Bearer {bob.token}"}) as (client, _http):
            assert structured(await client.call_tool("mission_status", {}))["mission"]["key"] == "shop"
            await orm(lambda: shop.mission.members.remove(bob))
            return [
                await client.call_tool("mission_status", {}),
                await client.call_tool("feature_loop", {"feature": shop.feature.pk}),
            ]

    for refused in asyncio.run(scenario()):
        assert refused.is_error and structured(refused)["code"] == "not_found", refused


def test_a_logged_out_session_is_refused_on_the_next_call(alice, shop):
    from django.contrib.sessions.models import Session

    browser = DjangoClient()
    browser.force_login(alice)
    key = browser.cookies[settings.SESSION_COOKIE_NAME].value

    async def scenario():
        async with mcp("/mcp/missions/shop/", {"Cookie": f"{settings.SESSION_COOKIE_NAME}={key}"}) as (client, http):
            assert not (await client.call_tool("mission_status", {})).is_error
            await orm(lambda: Session.objects.filter(session_key=key).delete())
            return await client.call_tool("mission_status", {}), (await tools_list(http)).status_code

    refused, status = asyncio.run(scenario())
    assert refused.is_error and structured(refused)["code"] == "not_authenticated"
    assert status == 401


def test_a_get_is_signed_in_afresh(alice, shop):
    """The standalone stream (a GET) carries an earlier client's notifications: a credential
    remembered from its POSTs does not open one once it is revoked."""
    from rest_framework.authtoken.models import Token

    async def scenario() -> int:
        async with mcp("/mcp/missions/shop/", {"Authorization": f"Bearer {alice.token}"}) as (client, http):
            assert not (await client.call_tool("mission_status", {})).is_error
            await orm(lambda: Token.objects.filter(key=alice.token).delete())
            response = await http.get("/mcp/missions/shop/", headers={"Accept": "text/event-stream"})
            return response.status_code

    assert asyncio.run(scenario()) == 401
