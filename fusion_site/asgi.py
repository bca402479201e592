import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fusion_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from fusion_site.routing import websocket_urlpatterns  # noqa: E402
from validation.mcp.transports import McpApp, handles  # noqa: E402

mcp_app = McpApp()


async def http(scope, receive, send):
    """The MCP endpoints (validation/mcp/transports.py) beside Django's views."""
    if handles(scope["path"]):
        await mcp_app(scope, receive, send)
    else:
        await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
        # Daphne sends no lifespan events (the MCP session manager then starts on its first
        # request); servers that do get the session manager started and stopped with them.
        "lifespan": mcp_app.lifespan,
    }
)
