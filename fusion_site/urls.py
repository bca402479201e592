from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from missions import streams

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("missions.api.urls")),
    path("api/", include("validation.api.urls")),
    # django-eventstream's protocol and storage, served by an ASGI view that holds no database connection.
    path("events/missions/<int:mission_id>/", streams.events, {"format-channels": ["mission-{mission_id}"]}),
    path("events/missions/", streams.events, {"channels": ["missions"]}),
    path("", include("validation.urls")),
]
