"""The mission lifecycle as API actions: activate, pause, resume, autopilot
(docs/ARCHITECTURE.md, "State machines"; transitions are actions, never PATCHes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from missions.api.serializers import MissionSerializer
from missions.services.lifecycle import mission_activate, mission_pause, mission_resume, mission_set_autopilot

if TYPE_CHECKING:
    from rest_framework.generics import GenericAPIView

    # Mixed in front of the mission viewset (self.get_object()); at run time a plain class.
    _GenericViewBase = GenericAPIView[Any]
else:
    _GenericViewBase = object


class AutopilotSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()


# Mixed into the mission viewset: activate, pause, resume, autopilot (their descriptions:
# missions/api/descriptions.py).
class MissionLifecycleActions(_GenericViewBase):
    def _lifecycle(self, request, fn, **kwargs):
        mission = fn(mission=self.get_object(), user=request.user, **kwargs)
        return Response(MissionSerializer(mission, context={"request": request}).data)

    @extend_schema(request=None, responses={200: MissionSerializer})
    @action(detail=True, methods=["post"])
    def activate(self, request, pk=None):
        return self._lifecycle(request, mission_activate)

    @extend_schema(request=None, responses={200: MissionSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        return self._lifecycle(request, mission_pause)

    @extend_schema(request=None, responses={200: MissionSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._lifecycle(request, mission_resume)

    @extend_schema(request=AutopilotSerializer, responses={200: MissionSerializer})
    @action(detail=True, methods=["post"])
    def autopilot(self, request, pk=None):
        body = AutopilotSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._lifecycle(request, mission_set_autopilot, enabled=body.validated_data["enabled"])
