from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import routers

from missions import streams
from missions.api.urls import router as plan_router
from validation.api.urls import router as validation_router


class ApiRoot(routers.APIRootView):
    """Every resource of the API, each a link to its list. /api/docs/ describes every
    operation; /api/schema/ is the OpenAPI schema."""


class ApiRouter(routers.DefaultRouter):
    APIRootView = ApiRoot


# One router for both apps' resources, so that one root, /api/, lists them all.
api = ApiRouter()
api.registry.extend(plan_router.registry + validation_router.registry)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("forges.api_urls")),
    path("api/", include(api.urls)),
    # Webhooks in (docs/FORGES.md): the signature is the authentication.
    path("hooks/", include("forges.inbound.urls")),
    # django-eventstream's protocol and storage, served by an ASGI view that holds no database connection.
    path("events/missions/<int:mission_id>/", streams.events, {"format-channels": ["mission-{mission_id}"]}),
    path("events/missions/", streams.events, {"channels": ["missions"]}),
    path("", include("validation.urls")),
]
