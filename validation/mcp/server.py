"""The MCP server: the tool list, tool calls, resources and subscriptions, on the SDK's
low-level `Server` (explicit schemas; the HTTP request, and with it the principal, is on
every request's context)."""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from missions.errors import NotFound
from missions.selectors import visible_missions
from validation.mcp import loop_tools, plan_tools, resources, review_tools, verdict_tools
from validation.mcp.context import db, load_user, principal_of
from validation.mcp.live import Live
from validation.mcp.tooling import Call, Tool, error_body, error_result, ok_result, resource_not_found

logger = logging.getLogger(__name__)

TOOLS: dict[str, Tool] = {
    t.name: t for t in [*review_tools.TOOLS, *loop_tools.TOOLS, *verdict_tools.TOOLS, *plan_tools.TOOLS]
}

INSTRUCTIONS = (
    "Fusion Missions: drive a mission's implement -> validate -> fix loop. next_task gives the work (with the "
    "validation cause of a fix); commit it to the mission's repository; task_complete records it; wait_for_verdict "
    "waits for the judgement; repeat until next_task answers 'nothing' because the mission is complete. "
    "fusion_validate starts an advisory review of the connection's mission; read it once with bg_result after "
    "its notification. mission_plan drafts a change of the contract (a mission file) as a dry run; mission_apply "
    "applies exactly that plan; assertion_add and feature_add make small edits."
)


def tool_listing() -> list[types.Tool]:
    return [
        types.Tool(
            name=t.name,
            title=t.title,
            description=t.description,
            input_schema=t.input_schema,
            output_schema=t.output_schema,
            annotations=types.ToolAnnotations(
                read_only_hint=t.read_only, destructive_hint=False, open_world_hint=False
            ),
        )
        for t in TOOLS.values()
    ]


async def _list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=tool_listing())


async def _call_tool(ctx, params: types.CallToolRequestParams, *, live: Live) -> types.CallToolResult:
    tool = TOOLS.get(params.name)
    if tool is None:
        return error_result({"code": "unknown_tool", "detail": f"no tool {params.name!r}", "fields": {}})
    try:
        principal = principal_of(ctx)
        arguments = tool.checked(dict(params.arguments or {}))
        body = await tool.handler(Call(arguments=arguments, principal=principal, ctx=ctx, live=live))
    except Exception as exc:  # noqa: BLE001 — every refusal the API would answer becomes a tool error
        refusal = error_body(exc)
        if refusal is None:
            logger.exception("MCP tool %s failed", params.name)
            refusal = {"code": "error", "detail": "internal error", "fields": {}}
        return error_result(refusal)
    return ok_result(body)


async def _list_templates(ctx, params) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=resources.TEMPLATES)


async def _list_resources(ctx, params) -> types.ListResourcesResult:
    principal = principal_of(ctx)
    return types.ListResourcesResult(resources=await db(_mission_resources)(principal))


async def _read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    principal, uri = principal_of(ctx), str(params.uri)
    try:
        body = await db(_read)(principal, uri)
    except Exception as exc:  # noqa: BLE001
        if error_body(exc) is None:
            raise
        raise resource_not_found(uri) from exc
    return resources.contents(uri, body)


def build_server(*, live: Live) -> Server[Any]:
    """The server; the handlers that subscribe, listen or call a tool share `live`."""

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await _call_tool(ctx, params, live=live)

    async def subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        principal, uris = principal_of(ctx), [str(params.uri)]
        missions = await _readable(principal, uris)
        await live.subscribe(ctx, uris=missions, user_id=principal.user_id, check=lambda: _readable(principal, uris))
        return types.EmptyResult()

    async def unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        live.unsubscribe(ctx, uri=str(params.uri))
        return types.EmptyResult()

    async def listen(ctx, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        # The SDK's listen handler filters by URI only: who may hear about a resource is
        # checked here, as a read of it would be, before the stream opens (and the stream
        # hears only its own user's registrations, which a revocation takes away).
        principal = principal_of(ctx)
        uris = [str(uri) for uri in params.notifications.resource_subscriptions or []]
        missions = await _readable(principal, uris)
        return await live.listen(
            ctx, params, uris=missions, user_id=principal.user_id, check=lambda: _readable(principal, uris)
        )

    return Server(
        "fusion-missions",
        version="0.1.0",
        title="Fusion Missions",
        instructions=INSTRUCTIONS,
        on_list_tools=_list_tools,
        on_call_tool=call_tool,
        on_list_resources=_list_resources,
        on_list_resource_templates=_list_templates,
        on_read_resource=_read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=listen,
    )


async def _readable(principal, uris: list[str]) -> dict[str, int]:
    """The mission of each resource, in one trip; a resource the user may not read is
    "not found" (the protocol's error, as for a read)."""
    try:
        return await db(resources.readable)(principal, uris)
    except NotFound as exc:
        raise MCPError(types.INVALID_PARAMS, exc.detail, {"code": exc.code}) from exc


def _read(principal, uri: str) -> dict[str, Any]:
    return resources.read(user=load_user(principal), uri=uri)


def _mission_resources(principal) -> list[types.Resource]:
    user = load_user(principal)
    missions = visible_missions(user=user)
    if principal.mission_id is not None:
        missions = missions.filter(pk=principal.mission_id)
    return [
        types.Resource(
            uri=f"fusion://missions/{pk}",
            name=key,
            title=title,
            description="The mission tree.",
            mime_type="application/json",
        )
        for pk, key, title in missions.order_by("id").values_list("pk", "key", "title")[:100]
    ]
