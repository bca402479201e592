"""The task's input and output shapes: what an executor creates, completes and fails
(`POST /api/tasks/`, `complete`, `fail`), and the hot answer that shows a task with fields
built once. Writes go through services (see views); the plan's serializers are
`serializers`."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from missions.api.serializers import VisiblePK
from missions.models import Mission, MissionFeature, Task


class TaskSerializer(serializers.ModelSerializer):
    feature = VisiblePK(model=MissionFeature, mission_path="mission", required=False, allow_null=True)
    mission = VisiblePK(model=Mission, mission_path="", required=False)

    class Meta:
        model = Task
        fields = [
            "id",
            "mission",
            "feature",
            "title",
            "prompt",
            "status",
            "revision",
            "revision_name",
            "summary",
            "log",
            "executor",
            "started_at",
            "finished_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "status",
            "revision",
            "revision_name",
            "summary",
            "log",
            "executor",
            "started_at",
            "finished_at",
            "created_at",
            "updated_at",
        ]
        # `POST /api/tasks/ {"feature": id}` is enough: the service titles the task after its feature.
        extra_kwargs = {"title": {"required": False}}

    def validate(self, attrs):
        feature, mission = attrs.get("feature"), attrs.get("mission")
        if feature is not None and mission is not None and feature.mission_id != mission.pk:
            raise serializers.ValidationError({"feature": ["belongs to another mission"]})
        return attrs


class TaskCreateSerializer(TaskSerializer):
    """A new task: for a feature (its mission is the feature's) or for a mission alone."""

    # At least one of them; the API schema says so (missions/api/openapi.py: AutoSchema).
    required_one_of = ("feature", "mission")

    def validate(self, attrs):
        if all(attrs.get(name) is None for name in self.required_one_of):
            raise serializers.ValidationError({"mission": ["give a feature or a mission"]})
        return super().validate(attrs)


class TaskCompleteSerializer(serializers.Serializer):
    revision = serializers.CharField(max_length=200)
    summary = serializers.CharField(required=False, allow_blank=True, default="", max_length=20000)


class TaskFailSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=20000)


# One serializer per class whose fields were built, to show objects with (`represent`).
_BUILT: dict[type[serializers.Serializer], serializers.Serializer] = {}


def represent(serializer_class: type[serializers.Serializer], instance) -> dict[str, Any]:
    """`serializer_class(instance).data`, the fields built once per class. DRF builds a
    ModelSerializer's fields from the model for every serializer made (0.3 ms for a task,
    ten times what showing one costs): a hot answer (a task's, on every completion) uses
    one set, built on first use and only read after. Only for serializers whose fields
    show ids and values (no hyperlinks, nothing from the context): the set has no request."""
    built = _BUILT.get(serializer_class)
    if built is None:
        built = serializer_class()
        built.fields  # noqa: B018 (built before it is shared; a race builds a second set, harmless)
        _BUILT[serializer_class] = built
    return built.to_representation(instance)
