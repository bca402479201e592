from django.urls import path

from forges.inbound.views import hook

urlpatterns = [path("<str:provider>/<str:mission_key>/", hook, name="forge-hook")]
