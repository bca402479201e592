"""`/api/missions/{id}/forge/`: a mission's forge as its members see it (the owner and
staff also see the webhook's secret and URL), and the secret's rotation."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from forges.config import forge_rotate_secret, forge_view, visible_forge
from forges.models import Forge
from missions.api.openapi import NOT_VISIBLE_MISSION, described


class ForgeSerializer(serializers.Serializer):
    """A mission's forge: the repository it follows, and for its owner and staff the webhook's secret and URL."""

    mission = serializers.IntegerField()
    provider = serializers.CharField()
    api_url = serializers.CharField()
    repository = serializers.CharField()
    token_env = serializers.CharField()
    feature_pattern = serializers.CharField()
    statuses = serializers.BooleanField()
    comments = serializers.BooleanField()
    # The field's name shadows the serializer's own `context`: harmless, this one only describes.
    context = serializers.CharField()  # type: ignore[assignment]
    refusal = serializers.CharField()
    secret_source = serializers.CharField()
    secret = serializers.CharField(required=False)
    hook_url = serializers.CharField(required=False)


_FORGE = OpenApiResponse(
    ForgeSerializer,
    description=(
        "`provider`, `api_url`, `repository`, `token_env`, `feature_pattern`, `statuses`, `comments`, `context`,"
        " `refusal` (the forge's last permanent refusal), `secret_source` (`forge`, `deployment` or empty);"
        " for the owner and staff also `secret` and `hook_url`."
    ),
)
_MISSING = f"{NOT_VISIBLE_MISSION} Also 404 `not_found` when the mission follows no forge."


def _answer(request: Request, forge: Forge) -> dict[str, Any]:
    view = forge_view(user=request.user, forge=forge)
    if "hook_path" in view:
        view["hook_url"] = request.build_absolute_uri(view.pop("hook_path"))
    return view


class ForgeView(APIView):
    @described(
        "A mission's forge",
        "The repository the mission follows on a forge (its mission file's `forge:` section). The webhook's"
        f" secret and URL are shown to the mission's owner and staff only. {_MISSING}",
        responses={200: _FORGE},
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(_answer(request, visible_forge(user=request.user, mission_id=pk)))


class RotateSecretView(APIView):
    @described(
        "Rotate the webhook's secret",
        "Makes a new webhook secret for the mission's forge and answers the forge as `GET` does; the forge's"
        " webhook must be given the new secret, deliveries signed with the old one are refused. 403"
        f" `owner_only` for a member who is not the owner. {_MISSING}",
        request=None,
        responses={200: _FORGE},
    )
    def post(self, request: Request, pk: int) -> Response:
        forge = forge_rotate_secret(user=request.user, forge=visible_forge(user=request.user, mission_id=pk))
        return Response(_answer(request, forge))
