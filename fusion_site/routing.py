from django.urls import path

from missions.consumers import MissionConsumer

websocket_urlpatterns = [
    path("ws/missions/<int:mission_id>/", MissionConsumer.as_asgi()),
]
