"""Validator runs, their failures, fix lineage, the hash-chained journal, reviews."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, TimeStamped


class RunScope(models.TextChoices):
    FEATURE = "feature"
    MILESTONE = "milestone"


class RunStatus(models.TextChoices):
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    BLOCKED = "blocked"
    ERROR = "error"
    CANCELLED = "cancelled"


# The statuses of a run that ended with a verdict.
JUDGED = (RunStatus.PASSED, RunStatus.FAILED, RunStatus.BLOCKED)


class RunTrigger(models.TextChoices):
    TASK = "task"
    MANUAL = "manual"
    FIX = "fix"
    RECOVERY = "recovery"
    MILESTONE = "milestone"


class ValidatorRun(TimeStamped):
    mission = models.ForeignKey(Mission, on_delete=models.CASCADE, related_name="validator_runs")
    feature = models.ForeignKey(MissionFeature, null=True, blank=True, on_delete=models.CASCADE, related_name="runs")
    milestone = models.ForeignKey(Milestone, on_delete=models.CASCADE, related_name="runs")
    scope = models.CharField(max_length=16, choices=RunScope.choices, default=RunScope.FEATURE)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING, db_index=True)
    trigger = models.CharField(max_length=16, choices=RunTrigger.choices, default=RunTrigger.TASK)
    implementation_attempt = models.PositiveIntegerField(default=0)
    validator_attempt = models.PositiveIntegerField(default=0)
    validator = models.CharField(max_length=80, default="composite")
    validator_config = models.JSONField(default=dict, blank=True)
    revision = models.CharField(max_length=80, blank=True, default="")
    # The branch `revision` was the head of when no task had landed one (the mission's
    # `branch`, or the repository's default; "HEAD" when it was detached); '' otherwise.
    revision_name = models.CharField(max_length=200, blank=True, default="")
    input_fingerprint = models.CharField(max_length=64, blank=True, default="", db_index=True)
    # What the run's commands ran in (`fusion_site.runtime.sandbox.Status.record`): "bubblewrap
    # 0.8.0", or "none (why)" when they ran unconfined (docs/SANDBOX.md).
    sandbox = models.CharField(max_length=200, blank=True, default="")
    # Frozen at admission: exactly the assertions this run judges (key, title, statement,
    # check, scope) and the protection it judges under; see docs/TRUTH.md.
    assertions = models.JSONField(default=list, blank=True)
    protection = models.JSONField(default=dict, blank=True)
    summary = models.TextField(blank=True, default="")
    blocked_reason = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    verdict = models.JSONField(null=True, blank=True)
    reused_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # Set when a worker starts executing the run; a run whose lease has passed is reaped.
    lease_until = models.DateTimeField(null=True, blank=True)
    # Who executes the run: set by compare-and-swap when a delivery claims it (validation.services.runner).
    claim_token = models.CharField(max_length=32, blank=True, default="")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["feature"],
                condition=Q(status="running") & Q(feature__isnull=False),
                name="one_running_run_per_feature",
            ),
            models.UniqueConstraint(
                fields=["milestone"],
                condition=Q(status="running") & Q(scope="milestone"),
                name="one_running_milestone_run",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"

    @property
    def revision_note(self) -> str:
        """What a person reads of a revision no task had landed: which branch, and why."""
        if not self.revision_name:
            return ""
        at = f"at {self.revision[:12]}"
        what = f"detached HEAD {at}" if self.revision_name == "HEAD" else f"branch {self.revision_name} {at}"
        if self.scope == RunScope.MILESTONE:
            return f"{what} — no feature of the milestone had passed at a revision"
        return f"{what} — no task had landed a revision"

    @property
    def duration_seconds(self) -> float | None:
        if not self.completed_at:
            return None
        return (self.completed_at - self.started_at).total_seconds()


class ValidatorFailure(TimeStamped):
    run = models.ForeignKey(ValidatorRun, on_delete=models.CASCADE, related_name="failures")
    feature = models.ForeignKey(
        MissionFeature, null=True, blank=True, on_delete=models.CASCADE, related_name="failures"
    )
    assertion = models.ForeignKey(
        ContractAssertion, null=True, blank=True, on_delete=models.CASCADE, related_name="failures"
    )
    assertion_key = models.CharField(max_length=80, blank=True, default="")
    message = models.TextField(blank=True, default="")
    expected = models.TextField(blank=True, default="")
    actual = models.TextField(blank=True, default="")
    evidence = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["run_id", "id"]

    def __str__(self) -> str:
        return f"failure {self.assertion_key} in run {self.run_id}"


class FixLineage(TimeStamped):
    root = models.ForeignKey(MissionFeature, on_delete=models.CASCADE, related_name="lineage_as_root")
    source = models.ForeignKey(MissionFeature, on_delete=models.CASCADE, related_name="lineage_as_source")
    fix = models.ForeignKey(MissionFeature, on_delete=models.CASCADE, related_name="lineage_as_fix")
    run = models.ForeignKey(ValidatorRun, on_delete=models.CASCADE, related_name="lineage")
    failed_assertions = models.ManyToManyField(ContractAssertion, blank=True, related_name="+")

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["source", "run"], name="fix_lineage_source_run_unique")]

    def __str__(self) -> str:
        return f"{self.source_id} -> {self.fix_id} (run {self.run_id})"


class JournalKind(models.TextChoices):
    CHECK = "check"
    MODEL_REQUEST = "model_request"
    MODEL_RESPONSE = "model_response"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    DECISION = "decision"
    NOTE = "note"


class JournalEntry(TimeStamped):
    run = models.ForeignKey(ValidatorRun, on_delete=models.CASCADE, related_name="journal")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=JournalKind.choices)
    key = models.CharField(max_length=200, blank=True, default="")
    payload = models.JSONField(default=dict)
    sha256 = models.CharField(max_length=64)
    prev_sha256 = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["run_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="journal_run_seq_unique")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}"


class ReviewState(models.TextChoices):
    INITIALIZING = "initializing"
    CANDIDATES_RUNNING = "candidates_running"
    CANDIDATES_COMPLETE = "candidates_complete"
    EVALUATING = "evaluating"
    EVALUATION_COMPLETE = "evaluation_complete"
    RENDERING = "rendering"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Review(TimeStamped):
    mission = models.ForeignKey(Mission, null=True, blank=True, on_delete=models.CASCADE, related_name="reviews")
    feature = models.ForeignKey(MissionFeature, null=True, blank=True, on_delete=models.CASCADE, related_name="reviews")
    state = models.CharField(
        max_length=24, choices=ReviewState.choices, default=ReviewState.INITIALIZING, db_index=True
    )
    request = models.JSONField(default=dict)
    canonical_request = models.TextField(blank=True, default="")
    request_sha256 = models.CharField(max_length=64, blank=True, default="")
    revision = models.CharField(max_length=80, blank=True, default="")
    profile = models.CharField(max_length=80, blank=True, default="")
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    label_map = models.JSONField(default=dict, blank=True)
    failure_reason = models.TextField(blank=True, default="")
    # Added for the review pipeline (validation.review): a stable code and the stage of a
    # failure, where the request came from, how often the evaluator ran, token usage.
    failure_code = models.CharField(max_length=40, blank=True, default="")
    failure_stage = models.CharField(max_length=24, blank=True, default="")
    source = models.CharField(max_length=16, blank=True, default="api")
    evaluator_attempts = models.PositiveSmallIntegerField(default=0)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["created_by", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="review_idempotency_key_unique",
            )
        ]

    def __str__(self) -> str:
        return f"review {self.pk} ({self.state})"


class ReviewArtifact(TimeStamped):
    review = models.ForeignKey(Review, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=40)
    name = models.CharField(max_length=120)
    content = models.TextField()
    byte_length = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)

    class Meta:
        ordering = ["review_id", "id"]
        constraints = [models.UniqueConstraint(fields=["review", "name"], name="review_artifact_name_unique")]

    def __str__(self) -> str:
        return f"{self.review_id}:{self.name}"
