"""The plan: Mission -> Milestone -> Slice -> Feature, with their states, and the contract
assertions that say when each is done."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models

from fusion_site.repos.mirrors import source_of
from fusion_site.repos.sources import SnapshotError, Source
from missions.checks_spec import check_spec_problems, pattern_problems
from missions.environment_spec import environment_problems
from missions.models.base import TimeStamped


class MissionStatus(models.TextChoices):
    PLANNING = "planning"
    ACTIVE = "active"
    PAUSED = "paused"
    BLOCKED = "blocked"
    COMPLETE = "complete"
    ARCHIVED = "archived"


class ProtectedChange(models.TextChoices):
    FAIL = "fail"
    RESTORE = "restore"


class Executor(models.TextChoices):
    MANUAL = "manual"
    COMMAND = "command"


class Mission(TimeStamped):
    key = models.SlugField(max_length=80, unique=True)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    status = models.CharField(
        max_length=16, choices=MissionStatus.choices, default=MissionStatus.PLANNING, db_index=True
    )
    status_reason = models.TextField(blank=True, default="")
    autopilot = models.BooleanField(default=False)
    auto_fix = models.BooleanField(
        default=True, help_text="Off = report-only: failures are recorded, no fix is generated."
    )
    retry_budget = models.PositiveIntegerField(default=3, validators=[MaxValueValidator(100)])
    # A git URL or a local path (docs/REPOSITORIES.md); `workspace` is its former name.
    repository = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="Git URL (https://, ssh://, git://, file://, user@host:path) or local path of the repository.",
    )
    credentials_env = models.CharField(
        max_length=100,
        blank=True,
        default="",
        help_text="Name of the environment variable, on the workers, holding an HTTPS token or an ssh key path.",
    )
    # Only chooses a commit, pinned at admission: the commit is what a run's input holds.
    branch = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="The branch a validation judges when no task has landed a revision (its commit pinned when "
        "the run starts); empty: the repository's default branch (a local path: the branch it has checked out).",
    )
    # The name a person gave (a branch, a tag, a commit id), kept for display; protection
    # and diffs read `base_commit`, the commit id it named when it was set, which moves only
    # when a person sets the base again (docs/TRUTH.md, "Which files were protected").
    base_revision = models.CharField(max_length=80, blank=True, default="")
    base_commit = models.CharField(max_length=64, blank=True, default="", editable=False)
    # Glob patterns (relative to the workspace) restored to their base_revision content in
    # every snapshot before a check runs; see docs/TRUTH.md.
    protected_paths = models.JSONField(default=list, blank=True)
    on_protected_change = models.CharField(max_length=16, choices=ProtectedChange.choices, default=ProtectedChange.FAIL)
    # With any protected path, the files that decide how tests run (conftest.py, pytest.ini,
    # sitecustomize.py, ...: validation/protect.py RUNNER_CONFIG) are protected too.
    protect_runner_config = models.BooleanField(
        default=True, help_text="Also protect the test runner's configuration files (docs/TRUTH.md)."
    )
    # Submodules are checked out (through the mirror cache) in every snapshot.
    submodules = models.BooleanField(default=False, help_text="Check out the repository's submodules.")
    validator = models.CharField(max_length=80, default="composite", help_text="Validator profile name.")
    # Other profiles that may judge this mission (besides `validator`); any other is refused.
    allowed_validators = models.JSONField(
        default=list, blank=True, help_text="Other validator profiles that may judge this mission."
    )
    executor = models.CharField(max_length=16, choices=Executor.choices, default=Executor.MANUAL)
    executor_command = models.TextField(blank=True, default="")
    # What is set up once before the checks run (docs/ENVIRONMENTS.md); {} declares none.
    environment = models.JSONField(
        default=dict,
        blank=True,
        help_text="The environment the checks run in: preset, setup, key_files, path (docs/ENVIRONMENTS.md).",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="owned_missions"
    )
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="missions")
    # Counter behind MissionEvent.seq; bumped without touching updated_at (not a user change).
    event_seq = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.key

    def source(self) -> Source:
        """Where the workers read this mission's commits (`SnapshotError` when it has none
        or it is not a source they read)."""
        if not self.repository.strip():
            raise SnapshotError("the mission has no repository (a git URL or a local path) to validate")
        return source_of(self.repository, self.credentials_env)

    def clean(self) -> None:
        errors = {}
        if problems := pattern_problems(self.protected_paths):
            errors["protected_paths"] = problems
        elif self.protected_paths and not self.base_revision.strip():
            errors["base_revision"] = ["required when protected_paths is set (protected files are restored from it)"]
        if problems := environment_problems(self.environment):
            errors["environment"] = problems
        if errors:
            raise ValidationError(errors)


class MilestoneStatus(models.TextChoices):
    PENDING = "pending"
    ACTIVE = "active"
    COMPLETE = "complete"
    BLOCKED = "blocked"


class RollupState(models.TextChoices):
    NOT_STARTED = "not_started"
    FAILED = "failed"
    BLOCKED = "blocked"
    NEEDS_COVERAGE = "needs_coverage"
    PASSED = "passed"
    READY = "ready"


class Milestone(TimeStamped):
    mission = models.ForeignKey(Mission, on_delete=models.CASCADE, related_name="milestones")
    key = models.SlugField(max_length=80)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    order = models.IntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=MilestoneStatus.choices, default=MilestoneStatus.PENDING, db_index=True
    )
    validation_state = models.CharField(max_length=16, choices=RollupState.choices, default=RollupState.NOT_STARTED)
    dependencies = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="dependents")
    # The milestone's own environment (docs/ENVIRONMENTS.md); null: the mission's.
    environment = models.JSONField(
        null=True,
        blank=True,
        default=None,
        help_text="This milestone's environment, instead of the mission's; empty: the mission's.",
    )

    class Meta:
        ordering = ["mission_id", "order", "id"]
        constraints = [models.UniqueConstraint(fields=["mission", "key"], name="milestone_key_unique_per_mission")]

    def __str__(self) -> str:
        return f"{self.mission_id}:{self.key}"

    def clean(self) -> None:
        if self.environment is not None and (problems := environment_problems(self.environment)):
            raise ValidationError({"environment": problems})


class SliceStatus(models.TextChoices):
    PENDING = "pending"
    ACTIVE = "active"
    COMPLETE = "complete"


class Slice(TimeStamped):
    # `mission` is denormalized from the milestone so that keys are unique per mission
    # in the database and membership checks need one join.
    mission = models.ForeignKey(Mission, on_delete=models.CASCADE, related_name="slices", editable=False)
    milestone = models.ForeignKey(Milestone, on_delete=models.CASCADE, related_name="slices")
    key = models.SlugField(max_length=80)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    order = models.IntegerField(default=0)
    status = models.CharField(max_length=16, choices=SliceStatus.choices, default=SliceStatus.PENDING, db_index=True)
    activated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["milestone_id", "order", "id"]
        constraints = [models.UniqueConstraint(fields=["mission", "key"], name="slice_key_unique_per_mission")]

    def __str__(self) -> str:
        return f"{self.mission_id}:{self.key}"

    def save(self, *args, **kwargs):
        self.mission_id = self.milestone.mission_id
        super().save(*args, **kwargs)


class FeatureStatus(models.TextChoices):
    DEFINED = "defined"
    TRIAGED = "triaged"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    BLOCKED = "blocked"


class LoopState(models.TextChoices):
    IDLE = "idle"
    IMPLEMENTING = "implementing"
    VALIDATING = "validating"
    NEEDS_FIX = "needs_fix"
    PASSED = "passed"
    BLOCKED = "blocked"
    # A fix closed because its root passed: counts as done, spends nothing, never judged again.
    SUPERSEDED = "superseded"


class StopReason(models.TextChoices):
    NONE = "", "none"
    BUDGET_EXHAUSTED = "budget_exhausted"
    OPERATOR = "operator"
    VALIDATOR_UNAVAILABLE = "validator_unavailable"
    FINGERPRINT = "fingerprint_failures"
    VALIDATOR_BLOCKED = "validator_blocked"
    NO_ASSERTIONS = "no_assertions"
    WORKSPACE_UNAVAILABLE = "workspace_unavailable"
    # docs/TRUTH.md: the changed files hold a known way to subvert the test process.
    SUSPECTED_TAMPERING = "suspected_tampering"
    # A check touched a Git LFS pointer, or an unpopulated submodule (docs/REPOSITORIES.md).
    LFS_NOT_FETCHED = "lfs_not_fetched"
    SUBMODULE_NOT_FETCHED = "submodule_not_fetched"
    # FUSION_SANDBOX=required and no sandbox works on the worker (docs/SANDBOX.md).
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    # The mission's environment could not be built, for a reason outside the revision.
    ENVIRONMENT_FAILED = "environment_failed"


class MissionFeature(TimeStamped):
    mission = models.ForeignKey(Mission, on_delete=models.CASCADE, related_name="features", editable=False)
    slice = models.ForeignKey(Slice, on_delete=models.CASCADE, related_name="features")
    key = models.SlugField(max_length=120)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    acceptance_criteria = models.TextField(blank=True, default="")
    order = models.IntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=FeatureStatus.choices, default=FeatureStatus.DEFINED, db_index=True
    )
    loop_state = models.CharField(max_length=16, choices=LoopState.choices, default=LoopState.IDLE, db_index=True)
    implementation_attempts = models.PositiveIntegerField(default=0)
    validator_attempts = models.PositiveIntegerField(default=0)
    fix_rounds = models.PositiveIntegerField(
        default=0, help_text="Fix rounds charged to this feature as a lineage root."
    )
    last_run = models.ForeignKey(
        "validation.ValidatorRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    generated_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="generated_fixes"
    )
    generated_from_run = models.ForeignKey(
        "validation.ValidatorRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="generated_features"
    )
    stop_reason = models.CharField(max_length=32, choices=StopReason.choices, blank=True, default="")
    stop_detail = models.TextField(blank=True, default="")
    stopped_at = models.DateTimeField(null=True, blank=True)
    assertions: models.ManyToManyField[ContractAssertion, FeatureAssertion] = models.ManyToManyField(
        "ContractAssertion", through="FeatureAssertion", related_name="features", blank=True
    )

    class Meta:
        ordering = ["slice_id", "order", "id"]
        constraints = [models.UniqueConstraint(fields=["mission", "key"], name="feature_key_unique_per_mission")]

    def __str__(self) -> str:
        return f"{self.mission_id}:{self.key}"

    def save(self, *args, **kwargs):
        self.mission_id = self.slice.mission_id
        super().save(*args, **kwargs)


class AssertionScope(models.TextChoices):
    FEATURE = "feature"
    MILESTONE = "milestone"


class AssertionStatus(models.TextChoices):
    PENDING = "pending"
    PASSED = "passed"
    FAILED = "failed"
    BLOCKED = "blocked"


class ContractAssertion(TimeStamped):
    mission = models.ForeignKey(Mission, on_delete=models.CASCADE, related_name="assertions", editable=False)
    milestone = models.ForeignKey(Milestone, on_delete=models.CASCADE, related_name="assertions")
    key = models.CharField(max_length=80)
    title = models.CharField(max_length=200)
    statement = models.TextField()
    scope = models.CharField(max_length=16, choices=AssertionScope.choices, default=AssertionScope.FEATURE)
    # Named check_spec because Model.check() exists; the API and mission files call it `check`.
    check_spec = models.JSONField(
        "check", null=True, blank=True, help_text="Deterministic check the host runs (staff only)."
    )
    status = models.CharField(
        max_length=16, choices=AssertionStatus.choices, default=AssertionStatus.PENDING, db_index=True
    )
    order = models.IntegerField(default=0)

    class Meta:
        ordering = ["milestone_id", "order", "id"]
        constraints = [models.UniqueConstraint(fields=["mission", "key"], name="assertion_key_unique_per_mission")]

    def __str__(self) -> str:
        return self.key

    def save(self, *args, **kwargs):
        self.mission_id = self.milestone.mission_id
        super().save(*args, **kwargs)

    def clean(self) -> None:
        if self.check_spec is not None:
            problems = check_spec_problems(self.check_spec)
            if problems:
                raise ValidationError({"check_spec": problems})


class FeatureAssertion(models.Model):
    feature = models.ForeignKey(MissionFeature, on_delete=models.CASCADE, related_name="assertion_links")
    assertion = models.ForeignKey(ContractAssertion, on_delete=models.CASCADE, related_name="feature_links")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["assertion__order", "assertion_id"]
        constraints = [models.UniqueConstraint(fields=["feature", "assertion"], name="feature_assertion_unique")]

    def __str__(self) -> str:
        return f"{self.feature_id}->{self.assertion_id}"

    def clean(self) -> None:
        if self.assertion_id is None or self.feature_id is None:
            return  # the form reports the missing field itself
        if self.assertion.scope == AssertionScope.MILESTONE:
            raise ValidationError({"assertion": "Milestone-scoped assertions cannot be linked to features."})
        if self.assertion.mission_id != self.feature.mission_id:
            raise ValidationError({"assertion": "The assertion belongs to another mission."})
