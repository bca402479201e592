"""The Model Context Protocol server (docs/MCP.md): the review and the loop as MCP tools
and resources, over streamable HTTP at `/mcp/` (and `/mcp/missions/<key>/`) and over stdio
(`manage.py mcp --user NAME`).

Every tool calls the services, selectors and serializers the REST API calls, as the
connection's user: what an MCP client sees or does is what that user may see or do
through the API.
"""
