import django_eventstream
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("missions.api.urls")),
    path("api/", include("validation.api.urls")),
    path("events/missions/<int:mission_id>/", include(django_eventstream.urls), {"format-channels": ["mission-{mission_id}"]}),
    path("events/missions/", include(django_eventstream.urls), {"channels": ["missions"]}),
    path("", include("missions.urls")),
]
