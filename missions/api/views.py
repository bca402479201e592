"""REST API for the planning hierarchy. Views validate and delegate to services.

Visibility: every queryset is limited to missions the user owns or is a member of (staff
see all), so someone else's object answers 404, never 403.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.http import Http404, HttpResponse
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.utils.serializer_helpers import ReturnDict

from missions import selectors
from missions.api import descriptions
from missions.api import serializers as s
from missions.api.lifecycle import MissionLifecycleActions
from missions.api.planning import MissionPlanActions
from missions.api.plugins import JSONTextParser, YAMLParser
from missions.api.task_serializers import (
    TaskCompleteSerializer,
    TaskCreateSerializer,
    TaskFailSerializer,
    TaskSerializer,
    represent,
)
from missions.api.tree import mission_tree
from missions.errors import Forbidden, Invalid
from missions.models import ContractAssertion, Milestone, Mission, MissionEvent, MissionFeature, Slice, Task
from missions.selectors import milestone_rollup
from missions.services import files, hierarchy
from missions.services import tasks as task_services

if TYPE_CHECKING:
    from rest_framework.generics import GenericAPIView

    # MissionScoped is mixed in front of a DRF generic view (self.request, get_queryset());
    # at run time it stays a plain class.
    _GenericViewBase = GenericAPIView[Any]
else:
    _GenericViewBase = object


# Limits every query to the user's missions through `mission_path` (so another user's
# object answers 404). Also used by the validation floor's viewsets.
class MissionScoped(_GenericViewBase):
    mission_path = "mission"

    def get_queryset(self):
        visible = selectors.visible_missions(user=self.request.user).values("pk")
        lookup = f"{self.mission_path}__in" if self.mission_path else "pk__in"
        # GenericAPIView.get_queryset(): the view's `queryset`, re-evaluated per request.
        return super().get_queryset().filter(**{lookup: visible})

    def filter_queryset(self, queryset):
        # One object by its id and no query string: the list's filters (django-filter,
        # ordering) would leave the lookup as it is, after building and validating a form.
        if (self.lookup_url_kwarg or self.lookup_field) in self.kwargs and not self.request.query_params:
            return queryset
        return super().filter_queryset(queryset)


class MissionScopedViewSet(MissionScoped, viewsets.ModelViewSet):
    ordering_fields = ["id", "created_at", "updated_at"]

    def perform_destroy(self, instance):
        with transaction.atomic():
            instance.delete()


class MissionFilter(filters.FilterSet):
    class Meta:
        model = Mission
        fields = ["status", "key", "autopilot"]


@descriptions.MISSIONS
class MissionViewSet(MissionLifecycleActions, MissionPlanActions, MissionScopedViewSet):
    queryset = Mission.objects.prefetch_related("members").order_by("id")
    serializer_class = s.MissionSerializer
    filterset_class = MissionFilter
    mission_path = ""

    def perform_create(self, serializer):
        serializer.instance = hierarchy.mission_create(user=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer):
        mission = serializer.instance
        if "members" in serializer.validated_data and not self._is_owner(mission):
            raise Forbidden("only the owner or staff may change members", code="owner_only")
        serializer.instance = hierarchy.mission_update(
            mission=mission, user=self.request.user, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        if not self._is_owner(instance):
            raise Forbidden("only the owner or staff may delete a mission", code="owner_only")
        super().perform_destroy(instance)

    def _is_owner(self, mission: Mission) -> bool:
        return self.request.user.is_staff or mission.owner_id == self.request.user.pk

    @extend_schema(
        responses={200: OpenApiResponse(description="Milestones -> slices -> features with loop states and rollups.")}
    )
    @action(detail=True, methods=["get"])
    def tree(self, request, pk=None):
        return Response(mission_tree(mission=self.get_object()))

    # A YAML document is a mapping once read (schema validators parse YAML bodies): describe it as one.
    @extend_schema(responses={(200, "application/yaml"): OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"])
    def export(self, request, pk=None):
        text = files.mission_export(mission=self.get_object())
        response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{self.get_object().key}.yaml"'
        return response

    # The body is a mission file, YAML or JSON: the JSON schema its pydantic declaration
    # generates, inlined (as components, its choice sets would rename the API's enums).
    @extend_schema(
        request={
            "application/yaml": files.mission_file_json_schema(inline=True),
            "application/json": files.mission_file_json_schema(inline=True),
        },
        responses={201: s.MissionSerializer, 200: s.MissionSerializer},
    )
    @action(detail=False, methods=["post"], url_path="import", parser_classes=[YAMLParser, JSONTextParser])
    def import_(self, request):
        # The text as sent (an empty body is no text): the importer reads and judges it as
        # `import_mission` does, and reports every mistake at once. Visibility of an
        # existing key and "created or updated" are decided inside the import's
        # transaction: a check made here first would race with a concurrent import.
        document = request.data if isinstance(request.data, str) else ""
        result = files.mission_file_import(document=document, user=request.user, from_api=True)
        code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
        body = {**s.MissionSerializer(result.mission, context={"request": request}).data, "changed": result.changed}
        return Response(body, status=code)

    @extend_schema(responses={200: s.MissionEventSerializer(many=True)}, filters=False)
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        mission = self.get_object()
        qs = MissionEvent.objects.filter(mission=mission).order_by("-seq")
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(s.MissionEventSerializer(page, many=True).data)


@descriptions.MILESTONES
class MilestoneViewSet(MissionScopedViewSet):
    queryset = (
        Milestone.objects.select_related("mission")
        .prefetch_related("dependencies")
        .order_by("mission_id", "order", "id")
    )
    serializer_class = s.MilestoneSerializer
    filterset_fields = ["mission", "status", "validation_state", "key"]

    def perform_create(self, serializer):
        serializer.instance = hierarchy.milestone_create(user=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = hierarchy.milestone_update(
            user=self.request.user, milestone=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        hierarchy.milestone_delete(user=self.request.user, milestone=instance)

    @action(detail=True, methods=["get"])
    def validation(self, request, pk=None):
        return Response(milestone_rollup(milestone_id=self.get_object().pk))


@descriptions.SLICES
class SliceViewSet(MissionScopedViewSet):
    queryset = Slice.objects.select_related("milestone").order_by("milestone_id", "order", "id")
    serializer_class = s.SliceSerializer
    filterset_fields = ["mission", "milestone", "status", "key"]

    def perform_create(self, serializer):
        serializer.instance = hierarchy.slice_create(user=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = hierarchy.slice_update(
            user=self.request.user, slice_=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        hierarchy.slice_delete(user=self.request.user, slice_=instance)


# The plan's side of a feature; its loop actions (validate, repair, create_fix, loop,
# review) are the validation floor's (`validation/api/views.py: FeatureLoopViewSet`), on
# the same paths.
@descriptions.FEATURES
class FeatureViewSet(MissionScopedViewSet):
    queryset = (
        MissionFeature.objects.select_related("slice")
        .prefetch_related("assertions")
        .order_by("slice_id", "order", "id")
    )
    serializer_class = s.FeatureSerializer
    filterset_fields = ["mission", "slice", "slice__milestone", "status", "loop_state", "key", "generated_from"]

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        serializer.instance = hierarchy.feature_create(user=self.request.user, slice_=data.pop("slice"), **data)

    def perform_update(self, serializer):
        serializer.instance = hierarchy.feature_update(
            user=self.request.user, feature=serializer.instance, **serializer.validated_data
        )

    def destroy(self, request, *args, **kwargs):
        force = request.query_params.get("force") in ("1", "true", "yes")
        hierarchy.feature_delete(user=request.user, feature=self.get_object(), force=force)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _assertion_from(self, feature: MissionFeature) -> ContractAssertion:
        body = s.LinkSerializer(data=self.request.data)
        body.is_valid(raise_exception=True)
        ref = body.validated_data["assertion"].strip()
        qs = ContractAssertion.objects.filter(mission_id=feature.mission_id)
        found = qs.filter(pk=int(ref)).first() if ref.isascii() and ref.isdigit() else qs.filter(key=ref).first()
        if found is None:
            raise Invalid(
                f"no assertion {ref!r} in this mission",
                code="unknown_assertion",
                fields={"assertion": ["unknown in this mission"]},
            )
        return found

    @extend_schema(request=s.LinkSerializer, responses={201: s.FeatureSerializer})
    @action(detail=True, methods=["post"])
    def link(self, request, pk=None):
        feature = self.get_object()
        hierarchy.assertion_link(user=request.user, feature=feature, assertion=self._assertion_from(feature))
        return Response(
            self.get_serializer(MissionFeature.objects.get(pk=feature.pk)).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=s.LinkSerializer, responses={200: s.FeatureSerializer})
    @action(detail=True, methods=["post"])
    def unlink(self, request, pk=None):
        feature = self.get_object()
        hierarchy.assertion_unlink(user=request.user, feature=feature, assertion=self._assertion_from(feature))
        return Response(self.get_serializer(MissionFeature.objects.get(pk=feature.pk)).data)


@descriptions.ASSERTIONS
class AssertionViewSet(MissionScopedViewSet):
    queryset = ContractAssertion.objects.prefetch_related("features").order_by("milestone_id", "order", "id")
    serializer_class = s.AssertionSerializer
    filterset_fields = ["mission", "milestone", "status", "scope", "key"]

    def perform_create(self, serializer):
        serializer.instance = hierarchy.assertion_create(user=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = hierarchy.assertion_update(
            user=self.request.user, assertion=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        hierarchy.assertion_delete(user=self.request.user, assertion=instance)


@descriptions.TASKS
class TaskViewSet(MissionScopedViewSet):
    queryset = Task.objects.select_related("feature").order_by("id")
    serializer_class = TaskSerializer
    filterset_fields = ["mission", "feature", "status"]

    def get_serializer_class(self):
        return TaskCreateSerializer if self.action == "create" else TaskSerializer

    def get_queryset(self):
        qs = super().get_queryset()
        if self.action == "complete":  # (with a query string: `get_object` below reads it here)
            return qs.select_related(None).select_related("mission")
        return qs

    def get_object(self):
        if self.action != "complete" or self.request.query_params:
            return super().get_object()
        # What the service reads before the git work (the task's state, its mission's
        # repository), read here with the visibility check and not a second time there;
        # every judged feature's completion makes this read, so it is prepared.
        task = selectors.visible_task_with_mission(user=self.request.user, pk=self.kwargs.get(self.lookup_field))
        if task is None:
            raise Http404("No Task matches the given query.")  # get_object's own answer
        self.check_object_permissions(self.request, task)
        return task

    def perform_create(self, serializer):
        serializer.instance = task_services.task_create(user=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer):
        data = serializer.validated_data
        if "feature" in data and data["feature"] != serializer.instance.feature:
            raise Invalid("a task cannot move to another feature", fields={"feature": ["cannot be changed"]})
        data.pop("mission", None)
        with transaction.atomic():
            hierarchy.apply_fields(serializer.instance, data)

    def _answer(self, task: Task) -> Response:
        """`Response(get_serializer(task).data)`, the fields built once (`represent`); the
        serializer stays attached to the data for the browsable API's form."""
        return Response(ReturnDict(represent(TaskSerializer, task), serializer=self.get_serializer(task)))

    @extend_schema(request=None, responses={200: TaskSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        task = task_services.task_start(user=request.user, task=self.get_object())
        return self._answer(task)

    @extend_schema(request=TaskCompleteSerializer, responses={200: TaskSerializer})
    @action(detail=True, methods=["post"])
    def complete(self, request, pk=None):
        body = TaskCompleteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        task = task_services.task_complete(user=request.user, task=self.get_object(), fresh=True, **body.validated_data)
        return self._answer(task)

    @extend_schema(request=TaskFailSerializer, responses={200: TaskSerializer})
    @action(detail=True, methods=["post"])
    def fail(self, request, pk=None):
        body = TaskFailSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        task = task_services.task_fail(user=request.user, task=self.get_object(), **body.validated_data)
        return self._answer(task)


@descriptions.EVENTS
class MissionEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = MissionEvent.objects.order_by("mission_id", "seq")
    serializer_class = s.MissionEventSerializer
    filterset_fields = ["mission", "type"]

    def get_queryset(self):
        return self.queryset.filter(mission__in=selectors.visible_missions(user=self.request.user).values("pk"))
