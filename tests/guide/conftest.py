"""The guide runs against the same live server as the MCP tests (`manage.py serve` in a
subprocess over the test database, tests/mcp/conftest.py)."""

from tests.mcp.conftest import serve  # noqa: F401
