"""Plan and apply a mission file over the API (docs/API.md, "Plan and apply"): the dry run of
an import and the import of exactly what a plan answered (`missions/services/files/planning.py`).
The body of both is the mission file as YAML or JSON, as for the import; the apply names the
plan by `?plan_hash=`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from missions.api.plugins import JSONTextParser, YAMLParser
from missions.api.serializers import MissionSerializer
from missions.errors import Invalid
from missions.services import files
from missions.services.files.planning import mission_apply, mission_plan

if TYPE_CHECKING:
    from rest_framework.generics import GenericAPIView

    # Mixed in front of the mission viewset; at run time a plain class.
    _GenericViewBase = GenericAPIView[Any]
else:
    _GenericViewBase = object

_FILE_BODY = {
    "application/yaml": files.mission_file_json_schema(inline=True),
    "application/json": files.mission_file_json_schema(inline=True),
}


# The dry run's answer (`missions.services.files.planning.Plan`), declared for the schema.
class PlanSerializer(serializers.Serializer):
    mission_key = serializers.CharField()
    state_version = serializers.CharField(help_text="The digest of the mission's contract as stored.")
    plan_hash = serializers.CharField(allow_null=True, help_text="What to apply; null when refused.")
    applicable = serializers.BooleanField()
    created = serializers.ListField(child=serializers.DictField(), help_text="Each `kind`, `key`, `path`.")
    changed = serializers.ListField(child=serializers.DictField(), help_text="Each with the `fields` that change.")
    unchanged = serializers.ListField(child=serializers.DictField())
    refused = serializers.ListField(child=serializers.DictField(), help_text="Each `kind`, `path`, `message`.")
    left_alone = serializers.ListField(child=serializers.DictField(), help_text="Stored objects not in the file.")
    reopened = serializers.ListField(child=serializers.DictField(), help_text="Each with its state `from` and `to`.")
    code = serializers.CharField(allow_null=True)

    def get_fields(self) -> dict[str, Any]:
        # `errors` is a Serializer's own attribute: the field is added by name.
        return {**super().get_fields(), "errors": serializers.ListField(child=serializers.CharField())}


_PLAN = OpenApiResponse(PlanSerializer, description="The dry run; nothing was written.")


def _document(request) -> str:
    return request.data if isinstance(request.data, str) else ""


# Mixed into the mission viewset (its descriptions: missions/api/descriptions.py).
class MissionPlanActions(_GenericViewBase):
    @extend_schema(request=_FILE_BODY, responses={200: _PLAN})
    @action(detail=False, methods=["post"], url_path="plan", parser_classes=[YAMLParser, JSONTextParser])
    def plan(self, request):
        answer = mission_plan(document=_document(request), user=request.user, from_api=True)
        return Response(answer.as_dict())

    @extend_schema(
        request=_FILE_BODY,
        parameters=[OpenApiParameter("plan_hash", str, required=True, description="The hash the plan answered.")],
        responses={201: MissionSerializer, 200: MissionSerializer},
    )
    @action(detail=False, methods=["post"], url_path="apply", parser_classes=[YAMLParser, JSONTextParser])
    def apply(self, request):
        hash_ = request.query_params.get("plan_hash", "").strip()
        if not hash_:
            raise Invalid("plan_hash: required", code="validation_error", fields={"plan_hash": ["required"]})
        applied = mission_apply(document=_document(request), plan_hash=hash_, user=request.user, from_api=True)
        result = applied.result
        body = {
            **MissionSerializer(result.mission, context={"request": request}).data,
            "changed": result.changed,
            "plan": applied.plan.as_dict(),
        }
        return Response(body, status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)
