"""Advisory reviews over the API (docs/API.md).

    POST /api/reviews/                 closed request body -> 202 receipt (Idempotency-Key honoured)
    GET  /api/reviews/ , /{id}/        the review record and its artifact list (hashes, no content)
    GET  /api/reviews/{id}/result/     never blocks; verified report + accounting when completed
    GET  /api/reviews/{id}/artifact/?name=…   one verified artifact, whole (large reports link here)
    POST /api/reviews/{id}/cancel/     stops the pipeline between stages and in flight
    POST /api/features/{id}/review/    `feature_review_action` below, set on the feature viewset

Visibility: reviews of missions the user may see (staff: all); a review without a
mission is visible to its creator. Another user's review answers 404.
"""

from __future__ import annotations

from django.db.models import Q
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from missions import selectors
from validation.api import descriptions
from validation.models import Review, ReviewArtifact
from validation.review import artifacts
from validation.review.create import feature_review, review_create
from validation.review.request import ReviewRequest
from validation.review.state import review_cancel

PROFILE_PARAM = OpenApiParameter("profile", str, description="Review profile (default: `default`).")
KEY_PARAM = OpenApiParameter(
    "Idempotency-Key", str, location=OpenApiParameter.HEADER, description="Same key and same body: the same review."
)


class ArtifactRefSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReviewArtifact
        fields = ["name", "kind", "byte_length", "sha256", "created_at"]


class ReviewSerializer(serializers.ModelSerializer):
    artifacts = ArtifactRefSerializer(many=True, read_only=True)
    result_url = serializers.SerializerMethodField()
    events_url = serializers.SerializerMethodField()

    class Meta:
        model = Review
        fields = [
            "id",
            "mission",
            "feature",
            "state",
            "source",
            "profile",
            "revision",
            "request",
            "request_sha256",
            "canonical_request",
            "label_map",
            "evaluator_attempts",
            "tokens_in",
            "tokens_out",
            "failure_code",
            "failure_stage",
            "failure_reason",
            "created_by",
            "created_at",
            "updated_at",
            "completed_at",
            "result_url",
            "events_url",
            "artifacts",
        ]
        read_only_fields = fields

    def get_result_url(self, obj) -> str:
        return artifacts.urls(obj)["result_url"]

    def get_events_url(self, obj) -> str | None:
        return artifacts.urls(obj)["events_url"]


def _receipt_response(preflight) -> Response:
    body = artifacts.receipt(preflight.review)
    response = Response({**body, "replayed": not preflight.created}, status=status.HTTP_202_ACCEPTED)
    response["Location"] = body["review_url"]
    if not preflight.created:
        response["Idempotent-Replayed"] = "true"
    return response


@descriptions.REVIEWS
class ReviewViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Review.objects.prefetch_related("artifacts").order_by("-id")
    serializer_class = ReviewSerializer
    filterset_fields = ["mission", "feature", "state", "profile"]
    ordering_fields = ["id", "created_at", "completed_at"]

    def get_queryset(self):
        user = self.request.user
        if user.is_staff:
            return self.queryset
        visible = selectors.visible_missions(user=user).values("pk")
        return self.queryset.filter(Q(mission__in=visible) | Q(mission__isnull=True, created_by=user))

    @extend_schema(
        request=ReviewRequest,  # the body's one declaration (drf-spectacular's pydantic extension)
        parameters=[PROFILE_PARAM, KEY_PARAM],
        responses={202: OpenApiResponse(description="Receipt: id, state, result_url, events_url.")},
    )
    def create(self, request):
        preflight = review_create(
            body=request.data,
            user=request.user,
            source="api",
            idempotency_key=request.headers.get("Idempotency-Key"),
            profile=request.query_params.get("profile"),
        )
        return _receipt_response(preflight)

    @extend_schema(responses={200: OpenApiResponse(description="State, or the verified report and accounting.")})
    @action(detail=True, methods=["get"])
    def result(self, request, pk=None):
        return Response(artifacts.review_result(self.get_object()))

    @extend_schema(parameters=[OpenApiParameter("name", str, required=True)], responses={(200, "text/plain"): str})
    @action(detail=True, methods=["get"])
    def artifact(self, request, pk=None):
        review = self.get_object()
        row = artifacts.verified_artifact(review, request.query_params.get("name", ""))
        kind = (
            "text/markdown"
            if row.name.endswith(".md")
            else "application/json"
            if row.name.endswith(".json")
            else "text/plain"
        )
        response = HttpResponse(row.content.encode("utf-8"), content_type=f"{kind}; charset=utf-8")
        response["X-Content-SHA256"] = row.sha256
        response["Content-Disposition"] = f'inline; filename="review-{review.pk}-{row.name}"'
        return response

    @extend_schema(request=None, responses={200: ReviewSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        review = review_cancel(review=self.get_object(), user=request.user)
        return Response(self.get_serializer(review).data)


@extend_schema(
    request=None,
    parameters=[PROFILE_PARAM, KEY_PARAM],
    responses={202: OpenApiResponse(description="Receipt of the review of this feature's change.")},
)
@action(detail=True, methods=["post"])
def review(self, request, pk=None):
    # Advisory review of the feature's change, its request filled from the feature.
    preflight = feature_review(
        feature=self.get_object(),
        user=request.user,
        idempotency_key=request.headers.get("Idempotency-Key"),
        profile=request.query_params.get("profile"),
    )
    return _receipt_response(preflight)


# DRF requires an action's attribute name to equal its function name: in FeatureViewSet,
# `review = feature_review_action` adds POST /api/features/{id}/review/.
feature_review_action = review
