"""An agent over MCP cannot pick the profile that judges its work (docs/TRUTH.md,
"Which validator"): `feature_validate(validator=…)` with a profile the mission does not
allow is a tool error `validator_not_allowed`, and nothing changes."""

from __future__ import annotations

import asyncio

import pytest

from tests.mcp.conftest import child_env, stdio_client, structured
from validation.models import ValidatorRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_agent_over_mcp_cannot_pick_another_profile(alice, shop, tmp_path, stdio_judges):
    async def scenario():
        async with stdio_client("alice", mission="shop", env=child_env(tmp_path)) as client:
            return await client.call_tool("feature_validate", {"feature": "greet", "validator": "checks"})

    result = asyncio.run(scenario())
    assert result.is_error
    body = structured(result)
    assert body["code"] == "validator_not_allowed" and body["allowed"] == ["composite"]
    shop.feature.refresh_from_db()
    assert shop.feature.loop_state == "idle" and not ValidatorRun.objects.exists()
