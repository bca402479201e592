"""Input validation and output shapes of the plan (missions, milestones, slices, features,
assertions, their links and events) and the fields they share. Writes go through services
(see views); the task's shapes are `task_serializers`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.validators import validate_slug
from rest_framework import serializers

from fusion_site.repos.sources import SourceRefused, check_credentials_env, check_repository
from missions.checks_spec import check_spec_problems, pattern_problems
from missions.environment_spec import environment_problems
from missions.errors import Invalid
from missions.models import (
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
)
from missions.selectors import visible_missions
from missions.services.verdict_settings import allowed_validators_problems


class VisiblePK(serializers.PrimaryKeyRelatedField):
    """A related object the requesting user may see; others look like missing ids."""

    def __init__(self, *, model, mission_path: str, **kwargs):
        self.model = model
        self.mission_path = mission_path
        super().__init__(queryset=model.objects.all(), **kwargs)

    def get_queryset(self):
        request = self.context.get("request")
        user = getattr(request, "user", None)
        lookup = f"{self.mission_path}__in" if self.mission_path else "pk__in"
        return self.model.objects.filter(**{lookup: visible_missions(user=user).values("pk")})


class CheckField(serializers.JSONField):
    """A deterministic check: one of the shapes of docs/MISSION_FILES.md (checks)."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if value is None:
            return None
        problems = check_spec_problems(value)
        if problems:
            raise serializers.ValidationError(problems)
        return value


class EnvironmentField(serializers.JSONField):
    """A declared environment (docs/ENVIRONMENTS.md); on a milestone, null is the mission's."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if value is None and self.allow_null:
            return None
        if problems := environment_problems(value):
            raise serializers.ValidationError(problems)
        return value


# `repository` is a git URL or a local path (docs/REPOSITORIES.md), checked with the
# requesting user's staff flag; `credentials_env` names a variable on the workers, never its
# value. `base_commit` is the commit `base_revision` named when it was set (read-only;
# `missions/services/verdict_settings.py` pins it, checks credentials and who picks the validators).
# `workspace`, the repository's former name, is read on input for one release and never
# written in responses (a client sending back what it read would otherwise send the old
# value next to a changed `repository`). (Not a docstring: a serializer's docstring is its
# description in the API's docs.)
class MissionSerializer(serializers.ModelSerializer):
    members = serializers.PrimaryKeyRelatedField(many=True, required=False, queryset=get_user_model().objects.all())
    owner = serializers.PrimaryKeyRelatedField[AbstractBaseUser](read_only=True)
    environment = EnvironmentField(required=False, help_text=Mission._meta.get_field("environment").help_text)
    workspace = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=Mission._meta.get_field("repository").max_length,
        help_text="Deprecated: the former name of `repository`, read for one release; give `repository`.",
    )

    class Meta:
        model = Mission
        fields = [
            "id",
            "key",
            "title",
            "description",
            "status",
            "status_reason",
            "autopilot",
            "auto_fix",
            "retry_budget",
            "repository",
            "workspace",
            "credentials_env",
            "branch",
            "base_revision",
            "base_commit",
            "protected_paths",
            "on_protected_change",
            "protect_runner_config",
            "submodules",
            "validator",
            "allowed_validators",
            "environment",
            "executor",
            "executor_command",
            "owner",
            "members",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["status", "status_reason", "autopilot", "base_commit", "owner", "created_at", "updated_at"]

    def validate_protected_paths(self, value):
        problems = pattern_problems(value)
        if problems:
            raise serializers.ValidationError(problems)
        return value

    def validate_allowed_validators(self, value):
        problems = allowed_validators_problems(value)
        if problems:
            raise serializers.ValidationError(problems)
        return value

    def validate(self, attrs):
        self._read_former_name(attrs)
        self._check_repository(attrs)
        if "credentials_env" in attrs:
            try:
                attrs["credentials_env"] = check_credentials_env(attrs["credentials_env"])
            except SourceRefused as exc:
                raise Invalid(str(exc), fields={"credentials_env": [str(exc)]}) from exc
        current = self.instance
        paths = attrs.get("protected_paths", current.protected_paths if current else [])
        base = attrs.get("base_revision", current.base_revision if current else "")
        if paths and not base.strip():
            # Protected files are restored from the base revision: without one nothing can be.
            raise Invalid(
                "base_revision is required when protected_paths is set",
                code="base_revision_required",
                fields={"base_revision": ["required when protected_paths is set"]},
            )
        return attrs

    def _read_former_name(self, attrs) -> None:
        if "workspace" not in attrs:
            return
        workspace = attrs.pop("workspace")
        if "repository" in attrs and attrs["repository"] != workspace:
            raise Invalid(
                "workspace is the former name of repository and the two differ: give only repository",
                fields={"workspace": ["the former name of repository, whose value differs: give only repository"]},
            )
        attrs["repository"] = workspace

    def _check_repository(self, attrs) -> None:
        # An unchanged value is not judged again: a member may still edit a mission that
        # staff pointed at a local path.
        if "repository" not in attrs or (self.instance is not None and attrs["repository"] == self.instance.repository):
            return
        request = self.context.get("request")
        staff = bool(getattr(getattr(request, "user", None), "is_staff", False))
        try:
            attrs["repository"] = check_repository(attrs["repository"], staff=staff)
        except SourceRefused as exc:
            raise Invalid(
                f"repository refused: {exc}", code="repository_refused", fields={"repository": [str(exc)]}
            ) from exc


class MilestoneSerializer(serializers.ModelSerializer):
    mission = VisiblePK(model=Mission, mission_path="")
    dependencies = VisiblePK(model=Milestone, mission_path="mission", many=True, required=False)
    environment = EnvironmentField(
        required=False, allow_null=True, help_text=Milestone._meta.get_field("environment").help_text
    )

    class Meta:
        model = Milestone
        fields = [
            "id",
            "mission",
            "key",
            "title",
            "description",
            "order",
            "status",
            "validation_state",
            "dependencies",
            "environment",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["status", "validation_state", "created_at", "updated_at"]
        # The (mission, key) constraint is reported by the service as `duplicate_key`,
        # like every other kind; DRF's generic unique-together message would differ.
        validators: list[Callable[[dict[str, Any]], None]] = []

    def validate(self, attrs):
        if self.instance is not None and "mission" in attrs and attrs["mission"].pk != self.instance.mission_id:
            raise serializers.ValidationError({"mission": ["a milestone cannot move to another mission"]})
        return attrs


class SliceSerializer(serializers.ModelSerializer):
    milestone = VisiblePK(model=Milestone, mission_path="mission")

    class Meta:
        model = Slice
        fields = [
            "id",
            "mission",
            "milestone",
            "key",
            "title",
            "description",
            "order",
            "status",
            "activated_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["mission", "status", "activated_at", "created_at", "updated_at"]


class FeatureSerializer(serializers.ModelSerializer):
    slice = VisiblePK(model=Slice, mission_path="mission")
    assertion_keys = serializers.SerializerMethodField()

    class Meta:
        model = MissionFeature
        fields = [
            "id",
            "mission",
            "slice",
            "key",
            "title",
            "description",
            "acceptance_criteria",
            "order",
            "status",
            "loop_state",
            "implementation_attempts",
            "validator_attempts",
            "fix_rounds",
            "last_run",
            "generated_from",
            "generated_from_run",
            "stop_reason",
            "stop_detail",
            "stopped_at",
            "assertion_keys",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "mission",
            "status",
            "loop_state",
            "implementation_attempts",
            "validator_attempts",
            "fix_rounds",
            "last_run",
            "generated_from",
            "generated_from_run",
            "stop_reason",
            "stop_detail",
            "stopped_at",
            "created_at",
            "updated_at",
        ]

    def get_assertion_keys(self, obj) -> list[str]:
        return [a.key for a in obj.assertions.all()]


class AssertionSerializer(serializers.ModelSerializer):
    milestone = VisiblePK(model=Milestone, mission_path="mission")
    check = CheckField(source="check_spec", required=False, allow_null=True)
    features = serializers.PrimaryKeyRelatedField[MissionFeature](many=True, read_only=True)

    class Meta:
        model = ContractAssertion
        fields = [
            "id",
            "mission",
            "milestone",
            "key",
            "title",
            "statement",
            "scope",
            "check",
            "status",
            "order",
            "features",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["mission", "status", "created_at", "updated_at"]
        # Human keys are slugs (docs/MISSION_FILES.md): they travel in prompts, verdicts and files.
        extra_kwargs = {"key": {"validators": [validate_slug]}}


class LinkSerializer(serializers.Serializer):
    assertion = serializers.CharField(help_text="Assertion id or key (in the feature's mission).")


class MissionEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = MissionEvent
        fields = ["id", "mission", "seq", "type", "payload", "actor", "created_at"]


class FeatureAssertionSerializer(serializers.ModelSerializer):
    class Meta:
        model = FeatureAssertion
        fields = ["feature", "assertion", "created_at"]
