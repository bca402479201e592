"""Validation runs (read-only), their journal, and the loop's operator actions."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import SyncToAsync
from django.db import connections
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from missions import selectors
from missions.api.serializers import FeatureSerializer, MilestoneSerializer
from missions.api.views import MissionScoped
from missions.errors import Conflict
from missions.models import Milestone, MissionFeature
from validation.api import descriptions
from validation.api import serializers as s
from validation.api.reviews import feature_review_action
from validation.journal import JournalIntegrityError
from validation.models import FixLineage, RunStatus, ValidatorRun
from validation.replay import replay_run
from validation.services import operator


@descriptions.RUNS
class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = ValidatorRun.objects.prefetch_related("failures").order_by("-id")
    serializer_class = s.RunSerializer
    filterset_fields = ["mission", "feature", "milestone", "status", "scope", "trigger"]
    ordering_fields = ["id", "started_at", "completed_at"]

    def get_queryset(self):
        return self.queryset.filter(mission__in=selectors.visible_missions(user=self.request.user).values("pk"))

    @extend_schema(responses={200: s.JournalEntrySerializer(many=True)}, filters=False)
    @action(detail=True, methods=["get"])
    def journal(self, request, pk=None):
        run = self.get_object()
        page = self.paginate_queryset(run.journal.order_by("seq"))
        return self.get_paginated_response(s.JournalEntrySerializer(page, many=True).data)

    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"])
    def replay(self, request, pk=None):
        # Re-run the validator from the journal alone (no live model, tool or check call) and
        # compare the verdict hash; the body is what `manage.py replay_run --json` prints. A
        # journal that fails its hash chain is a result (`ok: false`), not a request error.
        run = self.get_object()
        if run.status == RunStatus.RUNNING:
            raise Conflict("the run is still running; replay it once it has ended", code="run_running")
        try:
            return Response(_off_the_event_loop(replay_run, run.pk).as_dict())
        except JournalIntegrityError as exc:
            return Response({"run": run.pk, "ok": False, "integrity_error": str(exc), "first_bad_seq": exc.seq})


_REPLAYS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fusion-replay")


def _off_the_event_loop(fn, *args):
    """Under ASGI a sync view runs in a thread whose `async_to_sync` (the agent validator's)
    schedules coroutines on the server's event loop: a replay there would stall every live
    stream. It runs in a thread of its own instead (two at most at a time), with its own
    loop and database connection."""
    if getattr(SyncToAsync.threadlocal, "main_event_loop", None) is None:
        return fn(*args)

    def run():
        try:
            return fn(*args)
        finally:
            connections.close_all()

    return _REPLAYS.submit(run).result()


@descriptions.LINEAGE
class LineageViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = FixLineage.objects.prefetch_related("failed_assertions").order_by("id")
    serializer_class = s.LineageSerializer
    filterset_fields = ["root", "source", "fix", "run"]

    def get_queryset(self):
        return self.queryset.filter(root__mission__in=selectors.visible_missions(user=self.request.user).values("pk"))


def loop_snapshot(feature) -> dict:
    runs = ValidatorRun.objects.filter(feature=feature).prefetch_related("failures").order_by("-id")
    lineage = (
        FixLineage.objects.filter(root=feature)
        | FixLineage.objects.filter(fix=feature)
        | FixLineage.objects.filter(source=feature)
    )
    return {
        "feature": feature.pk,
        "key": feature.key,
        "loop_state": feature.loop_state,
        "status": feature.status,
        "implementation_attempts": feature.implementation_attempts,
        "validator_attempts": feature.validator_attempts,
        "fix_rounds": feature.fix_rounds,
        "retry_budget": feature.mission.retry_budget,
        "budget_left": max(feature.mission.retry_budget - feature.fix_rounds, 0),
        "stop_reason": feature.stop_reason,
        "stop_detail": feature.stop_detail,
        "last_run": feature.last_run_id,
        "runs": s.RunSerializer(runs, many=True).data,
        "lineage": s.LineageSerializer(lineage.distinct().order_by("id"), many=True).data,
    }


# /api/features/{id}/validate|repair|create_fix|loop|review/: the loop's actions on a
# feature, registered on the plan's `features` prefix (validation/api/urls.py). It has no
# list or detail route of its own: those are the plan's (missions/api/views.py).
@descriptions.FEATURE_LOOP
class FeatureLoopViewSet(MissionScoped, viewsets.GenericViewSet):
    queryset = MissionFeature.objects.select_related("mission", "slice").order_by("id")
    serializer_class = FeatureSerializer
    review = feature_review_action  # POST /api/features/{id}/review/: an advisory review of the feature's change

    @extend_schema(request=s.ValidateSerializer, responses={202: s.RunSerializer})
    @action(detail=True, methods=["post"])
    def validate(self, request, pk=None):
        body = s.ValidateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        admission = operator.feature_validate(
            feature=self.get_object(), user=request.user, profile=body.validated_data.get("validator")
        )
        return _admission_response(admission)

    @extend_schema(request=s.RepairSerializer, responses={200: FeatureSerializer, 202: s.RunSerializer})
    @action(detail=True, methods=["post"])
    def repair(self, request, pk=None):
        body = s.RepairSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        feature = self.get_object()
        admission = operator.feature_repair(feature=feature, user=request.user, **body.validated_data)
        if admission is None:
            feature.refresh_from_db()
            return Response(FeatureSerializer(feature, context={"request": request}).data)
        return _admission_response(admission)

    @extend_schema(request=None, responses={201: FeatureSerializer})
    @action(detail=True, methods=["post"])
    def create_fix(self, request, pk=None):
        fix = operator.feature_create_fix(feature=self.get_object(), user=request.user)
        return Response(FeatureSerializer(fix, context={"request": request}).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="The feature's loop.")})
    @action(detail=True, methods=["get"])
    def loop(self, request, pk=None):
        return Response(loop_snapshot(self.get_object()))


class MilestoneLoopViewSet(MissionScoped, viewsets.GenericViewSet):
    """/api/milestones/{id}/validate/: the loop's action on a milestone, registered on the
    plan's `milestones` prefix (validation/api/urls.py), as the feature's are."""

    queryset = Milestone.objects.select_related("mission").order_by("id")
    serializer_class = MilestoneSerializer

    @extend_schema(
        summary="Validate a milestone",
        description=descriptions.MILESTONE_VALIDATE,
        request=None,
        responses={200: s.MilestoneValidationSerializer, 202: s.MilestoneValidationSerializer},
    )
    @action(detail=True, methods=["post"])
    def validate(self, request, pk=None):
        milestone = self.get_object()
        step = operator.milestone_validate(milestone_id=milestone.pk, actor_id=request.user.pk)
        return _admission_response(step, **milestone_after(milestone.pk, {"request": request}))


def milestone_after(milestone_id: int, context: dict) -> dict:
    """The milestone and its mission's status after a validation request (API and MCP);
    `context`: the serializers' (the requesting user)."""
    milestone = Milestone.objects.select_related("mission").get(pk=milestone_id)
    return {
        "milestone": MilestoneSerializer(milestone, context=context).data,
        "mission_status": milestone.mission.status,
    }


def admission_body(admission, **extra) -> dict:
    """What a validation request answers (API and MCP): its outcome, detail and run."""
    return {
        "outcome": admission.outcome,
        "detail": admission.detail,
        "run": s.RunSerializer(admission.run).data if admission.run else None,
        **extra,
    }


def _admission_response(admission, **extra) -> Response:
    body = admission_body(admission, **extra)
    if admission.run is not None:
        body.update(
            id=admission.run.pk,
            status=admission.run.status,
            validator_attempt=admission.run.validator_attempt,
            implementation_attempt=admission.run.implementation_attempt,
        )
    return Response(body, status=status.HTTP_202_ACCEPTED if admission.outcome == "started" else status.HTTP_200_OK)
