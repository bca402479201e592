"""The MCP server over streamable HTTP (a live `serve`) and stdio (`manage.py mcp`), with
the SDK's own client: the tool list and schemas, sign-in, and what each user may see."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.mcp.conftest import child_env, http_client, stdio_client, structured

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SEEDS = Path("/work/shared/seeds")
TOOL_NAMES = {
    "fusion_validate",
    "bg_result",
    "mission_status",
    "next_task",
    "task_complete",
    "feature_validate",
    "milestone_validate",
    "feature_loop",
    "wait_for_verdict",
    "mission_plan",
    "mission_apply",
    "assertion_add",
    "feature_add",
}


def seed_contract() -> dict:
    """The seed's `fusion_validate` contract (its "Normalized TypeBox contract" block)."""
    text = next(p.read_text() for p in sorted(SEEDS.glob("*.txt")) if "tool:fusion_validate" in p.read_text())
    block = re.search(r"Normalized TypeBox contract ```json (.*?) ```", text, re.S)
    assert block is not None
    return json.loads(block.group(1))


def test_tool_list_and_the_fusion_validate_schema_is_the_seed_contract(serve, alice, shop):
    server = serve()

    async def scenario():
        async with http_client(server.mcp("shop"), token=alice.token) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in asyncio.run(scenario())}
    assert set(tools) == TOOL_NAMES
    contract = seed_contract()
    schema = tools["fusion_validate"].input_schema
    # Field by field: the same keys, required set, closedness at both levels, constraints.
    assert schema["additionalProperties"] is False and schema["type"] == "object"
    assert sorted(schema["required"]) == sorted(contract["required"])
    assert set(schema["properties"]) == set(contract["properties"])
    for name, field in contract["properties"].items():
        assert schema["properties"][name] == field, name
    verification = schema["properties"]["verification"]
    assert verification["additionalProperties"] is False
    assert verification["properties"]["evidence"]["items"]["additionalProperties"] is False
    assert schema == contract
    assert "anyOf" not in json.dumps(schema) and "null" not in json.dumps(schema)
    assert tools["fusion_validate"].description.startswith("Start an advisory, read-only Fusion validation review")
    for tool in tools.values():
        assert tool.description and len(tool.description) > 60, tool.name
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert tool.input_schema["type"] == "object", tool.name
    assert tools["bg_result"].input_schema == {
        "type": "object",
        "properties": {"taskId": {"type": "string", "minLength": 1}},
        "required": ["taskId"],
        "additionalProperties": False,
    }
    assert tools["task_complete"].input_schema["required"] == ["task", "revision"]
    assert tools["wait_for_verdict"].input_schema["required"] == ["feature"]


def _post(url: str, headers: dict[str, str]) -> tuple[int, dict]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_sign_in_with_the_api_tokens_and_refusals(serve, alice, bob, shop):
    server = serve()
    status, body = _post(server.mcp(), {})
    assert (status, body["code"]) == (401, "not_authenticated")
    status, body = _post(server.mcp(), {"Authorization": "Bearer not-a-token"})
    assert (status, body["code"]) == (401, "not_authenticated")
    status, body = _post(server.mcp(), {"Authorization": f"Basic {alice.token}"})
    assert status == 401
    # A stranger's mission endpoint is "not found", exactly as the API answers.
    status, body = _post(server.mcp("shop"), {"Authorization": f"Token {bob.token}"})
    assert (status, body["code"]) == (404, "not_found")
    status, body = _post(server.mcp("nope"), {"Authorization": f"Token {alice.token}"})
    assert (status, body["code"]) == (404, "not_found")
    status, body = _post(server.mcp("shop"), {"Authorization": f"Token {alice.token}", "Host": "evil.example"})
    assert status == 421

    async def scenario(scheme: str, mode: str):
        async with http_client(server.mcp("shop"), token=alice.token, scheme=scheme, mode=mode) as client:
            return structured(await client.call_tool("mission_status", {}))

    for scheme, mode in (("Bearer", "auto"), ("Token", "legacy")):
        assert asyncio.run(scenario(scheme, mode))["mission"]["key"] == "shop"


def test_member_stranger_and_staff(serve, alice, bob, staff, shop):
    server = serve()

    async def as_user(token: str, url: str, calls: list[tuple[str, dict]]):
        out = []
        async with http_client(url, token=token) as client:
            for name, arguments in calls:
                out.append(await client.call_tool(name, arguments))
            try:
                out.append(await client.read_resource(f"fusion://missions/{shop.mission.pk}"))
            except Exception as exc:  # noqa: BLE001 - the refusal is what is asserted
                out.append(exc)
        return out

    calls = [("mission_status", {"mission": "shop"}), ("feature_loop", {"feature": shop.feature.pk})]
    alice_results = asyncio.run(as_user(alice.token, server.mcp(), calls))
    assert not alice_results[0].is_error and structured(alice_results[0])["mission"]["id"] == shop.mission.pk
    assert structured(alice_results[1])["key"] == "greet"
    assert json.loads(alice_results[2].contents[0].text)["key"] == "shop"

    bob_results = asyncio.run(as_user(bob.token, server.mcp(), calls))
    for result in bob_results[:2]:
        assert result.is_error and structured(result)["code"] == "not_found"
        assert "shop" not in json.dumps(structured(result)) or structured(result)["detail"] == "no mission 'shop'"
    assert "not found" in str(bob_results[2])

    staff_results = asyncio.run(as_user(staff.token, server.mcp(), calls))
    assert not staff_results[0].is_error and not staff_results[1].is_error

    # An unscoped connection needs the mission named; a scoped one refuses another mission.
    async def unnamed():
        async with http_client(server.mcp(), token=alice.token) as client:
            return await client.call_tool("mission_status", {})

    result = asyncio.run(unnamed())
    assert result.is_error and structured(result)["code"] == "mission_required"

    # Arguments outside a tool's schema are refused with the API's validation code.
    async def bad_arguments():
        async with http_client(server.mcp("shop"), token=alice.token) as client:
            return await client.call_tool("wait_for_verdict", {"feature": "greet", "timeout": -1, "extra": 1})

    result = asyncio.run(bad_arguments())
    assert result.is_error and structured(result)["code"] == "validation_error"


def test_stdio_acts_as_the_named_user(alice, bob, shop, tmp_path, transactional_db):
    env = child_env(tmp_path)

    async def scenario(user: str, mission: str | None):
        async with stdio_client(user, mission=mission, env=env) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            status = await client.call_tool("mission_status", {} if mission else {"mission": "shop"})
            return tools, status

    tools, status = asyncio.run(scenario("alice", "shop"))
    assert tools == TOOL_NAMES
    assert structured(status)["mission"]["key"] == "shop"
    assert structured(status)["progress"] == {"features_total": 1, "features_passed": 0, "percent": 0}
    _tools, status = asyncio.run(scenario("bob", None))
    assert status.is_error and structured(status)["code"] == "not_found"
