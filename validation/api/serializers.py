from __future__ import annotations

from rest_framework import serializers

from missions.api.serializers import MilestoneSerializer
from missions.models import ContractAssertion
from validation.models import FixLineage, JournalEntry, ValidatorFailure, ValidatorRun


class FailureSerializer(serializers.ModelSerializer):
    class Meta:
        model = ValidatorFailure
        fields = ["id", "assertion", "assertion_key", "message", "expected", "actual", "evidence", "created_at"]


class RunSerializer(serializers.ModelSerializer):
    failures = FailureSerializer(many=True, read_only=True)
    duration_seconds = serializers.FloatField(read_only=True, allow_null=True)
    revision_note = serializers.CharField(
        read_only=True,
        help_text="Which branch's head `revision` is, and why, when no task had landed a revision "
        "(e.g. 'branch main at 0123abcd4567 — no task had landed a revision'); '' otherwise.",
    )

    class Meta:
        model = ValidatorRun
        fields = [
            "id",
            "mission",
            "feature",
            "milestone",
            "scope",
            "status",
            "trigger",
            "implementation_attempt",
            "validator_attempt",
            "validator",
            "validator_config",
            "revision",
            "revision_name",
            "revision_note",
            "input_fingerprint",
            "sandbox",
            "summary",
            "blocked_reason",
            "error",
            "verdict",
            "reused_from",
            "tokens_in",
            "tokens_out",
            "started_at",
            "completed_at",
            "duration_seconds",
            "failures",
        ]
        read_only_fields = fields


class LineageSerializer(serializers.ModelSerializer):
    failed_assertions = serializers.SlugRelatedField[ContractAssertion](many=True, read_only=True, slug_field="key")

    class Meta:
        model = FixLineage
        fields = ["id", "root", "source", "fix", "run", "failed_assertions", "created_at"]


class JournalEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = JournalEntry
        fields = ["seq", "kind", "key", "payload", "sha256", "prev_sha256", "created_at"]


class ValidateSerializer(serializers.Serializer):
    validator = serializers.CharField(required=False, allow_blank=False, help_text="Profile override.")


class RepairSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=["clear", "re_run"])
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class MilestoneValidationSerializer(serializers.Serializer):
    """The answer of a milestone's validation (a feature's validation answers the same
    outcome, detail and run)."""

    outcome = serializers.ChoiceField(
        choices=["started", "already_running", "complete"],
        help_text="started: a validation run began (HTTP 202); already_running: a run over the same input is "
        "judging it; complete: the milestone is complete.",
    )
    detail = serializers.CharField()
    run = RunSerializer(allow_null=True, help_text="The validation run that started, is running, or passed.")
    id = serializers.IntegerField(required=False, help_text="The run's id, when there is a run.")
    status = serializers.CharField(required=False, help_text="The run's status, when there is a run.")
    validator_attempt = serializers.IntegerField(required=False)
    implementation_attempt = serializers.IntegerField(required=False)
    milestone = MilestoneSerializer()
    mission_status = serializers.CharField(help_text="The mission's status after the request.")
