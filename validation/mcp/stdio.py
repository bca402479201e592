"""The stdio transport: one local agent, acting as one user, for the life of the process."""

from __future__ import annotations

import anyio
from mcp.server.stdio import stdio_server

from validation.mcp.context import Principal, set_process_principal
from validation.mcp.live import Live
from validation.mcp.server import build_server


async def serve_stdio(*, principal: Principal) -> None:
    set_process_principal(principal)
    live = Live()
    server = build_server(live=live)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        live.stop()


def run_stdio(*, principal: Principal) -> None:
    anyio.run(lambda: serve_stdio(principal=principal))
