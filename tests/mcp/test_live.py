"""`validation/mcp/live.py` in process, over a Channels layer of its own: what reaches an
audience once its user's access to the mission is revoked, including a revocation that
arrives while a registration is being checked."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from types import SimpleNamespace

import pytest

from missions.delivery import group_name
from missions.streams import InMemoryChannelLayer
from validation.mcp import live as live_module
from validation.mcp.live import Live

MISSION = 7
URI = f"fusion://missions/{MISSION}"
ALICE, BOB = 1, 2


class Connection:
    """A handshake-era connection as the SDK hands it: a standalone stream, a teardown stack."""

    has_standalone_channel = True

    def __init__(self) -> None:
        self.exit_stack = AsyncExitStack()
        self.updated: list[str] = []
        self.logged: list[dict] = []

    async def send_resource_updated(self, uri: str) -> None:
        self.updated.append(uri)

    async def log(self, level, data, logger=None) -> None:
        self.logged.append(data)


def ctx(connection: Connection) -> SimpleNamespace:
    return SimpleNamespace(session=SimpleNamespace(_connection=connection))


@pytest.fixture
def layer(monkeypatch) -> InMemoryChannelLayer:
    own = InMemoryChannelLayer()
    monkeypatch.setattr(live_module, "get_channel_layer", lambda: own)
    return own


async def settle() -> None:
    await asyncio.sleep(live_module.COALESCE_SECONDS * 3)  # the follower reads; windows close


async def event(layer, type_: str, **data) -> None:
    """As `missions.delivery` sends a committed step's events: one `mission.events` message."""
    item = {"event": type_, "data": {"mission": MISSION, "seq": 1, **data}, "id": 1}
    await layer.group_send(group_name(MISSION), {"type": "mission.events", "events": [item]})


async def revoke(layer, *user_ids: int) -> None:
    await layer.group_send(group_name(MISSION), {"type": "mission.access", "revoked": sorted(user_ids)})


def test_a_revocation_during_the_check_of_a_subscription_drops_it(layer):
    async def scenario() -> tuple[Connection, Connection]:
        live = Live()
        alice, bob = Connection(), Connection()

        async def revoked_right_after_the_read() -> None:
            await revoke(layer, BOB)  # committed after the check's read, before it returned
            await settle()

        await live.subscribe(ctx(alice), uris={URI: MISSION}, user_id=ALICE, check=lambda: asyncio.sleep(0))
        await live.subscribe(ctx(bob), uris={URI: MISSION}, user_id=BOB, check=revoked_right_after_the_read)
        await event(layer, "mission:updated")
        await settle()
        live.stop()
        return alice, bob

    alice, bob = asyncio.run(scenario())
    assert alice.updated == [URI]
    assert bob.updated == []


def test_a_refused_check_registers_nothing(layer):
    async def scenario() -> Connection:
        live = Live()
        bob = Connection()

        async def refused() -> None:
            raise LookupError("no longer visible")

        with pytest.raises(LookupError):
            await live.subscribe(ctx(bob), uris={URI: MISSION}, user_id=BOB, check=refused)
        await event(layer, "mission:updated")
        await settle()
        live.stop()
        return bob

    assert asyncio.run(scenario()).updated == []


def test_a_revoked_user_is_not_told_of_the_end_of_a_review_it_started(layer):
    async def scenario() -> tuple[Connection, Connection]:
        live = Live()
        alice, bob = Connection(), Connection()
        for connection, user_id, review_id in ((alice, ALICE, 11), (bob, BOB, 12)):
            await live.watch_review(
                ctx(connection),
                review_id=review_id,
                mission_id=MISSION,
                user_id=user_id,
                check=lambda: asyncio.sleep(0),
            )
        await revoke(layer, BOB)
        await settle()
        for review_id in (11, 12):
            await event(layer, "review:progress", review=review_id, event="completed")
            await settle()
        live.stop()
        return alice, bob

    alice, bob = asyncio.run(scenario())
    assert "fusion://reviews/11" in alice.updated and [m["taskId"] for m in alice.logged] == ["11"]
    # bob hears of neither review (the mission's tree is not his either, any more).
    assert bob.updated == [] and bob.logged == []


def test_an_audience_whose_credential_is_gone_hears_nothing_more(layer, monkeypatch):
    """A deleted token, a logged-out session, a deactivated user: not a removal from the
    mission (no revocation message), so each audience's check runs again before it is told
    anything, at most every RECHECK_SECONDS (here: every time)."""
    monkeypatch.setattr(live_module, "RECHECK_SECONDS", 0.0)
    gone: set[int] = set()

    def check_of(user_id: int):
        async def check() -> None:
            if user_id in gone:
                raise LookupError("not signed in")

        return check

    async def scenario() -> tuple[Connection, Connection, Connection]:
        live = Live()
        alice, bob, bob_review = Connection(), Connection(), Connection()
        await live.subscribe(ctx(alice), uris={URI: MISSION}, user_id=ALICE, check=check_of(ALICE))
        await live.subscribe(ctx(bob), uris={URI: MISSION}, user_id=BOB, check=check_of(BOB))
        await live.watch_review(ctx(bob_review), review_id=12, mission_id=MISSION, user_id=BOB, check=check_of(BOB))
        await event(layer, "mission:updated")
        await settle()
        gone.add(BOB)  # bob's token is deleted
        await event(layer, "mission:updated")
        await settle()
        await event(layer, "review:progress", review=12, event="completed")
        await settle()
        live.stop()
        return alice, bob, bob_review

    alice, bob, bob_review = asyncio.run(scenario())
    assert len(alice.updated) >= 2 and set(alice.updated) == {URI}
    assert bob.updated == [URI]  # the first change only
    assert bob_review.logged == [] and "fusion://reviews/12" not in bob_review.updated
