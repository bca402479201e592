"""A mission's forge, the webhook deliveries it received, the pull requests it follows and
the outbox of what it answers (docs/FORGES.md)."""

from __future__ import annotations

import secrets

from django.db import models

from missions.models import Mission, MissionFeature, Task
from missions.models.base import TimeStamped

# A feature key named in a pull request's branch or title: `[F-12]`, `fix/login-3`…
# The mission's `feature_pattern` overrides it; its first group (or the whole match) is
# the key, compared case-insensitively with the mission's feature keys.
DEFAULT_FEATURE_PATTERN = r"\[([A-Za-z0-9][\w.-]*)\]"


def new_secret() -> str:
    return secrets.token_urlsafe(32)


class Provider(models.TextChoices):
    GITHUB = "github"
    GITLAB = "gitlab"
    GITEA = "gitea"  # Gitea and Forgejo speak the same API
    GENERIC = "generic"  # a JSON form of our own, signed as GitHub signs (no statuses out)


class Forge(TimeStamped):
    """The repository a mission follows on a forge (the mission file's `forge:` section)."""

    mission = models.OneToOneField(Mission, on_delete=models.CASCADE, related_name="forge")
    provider = models.CharField(max_length=16, choices=Provider.choices)
    # The forge's API root: https://api.github.com, https://gitlab.example.com/api/v4,
    # https://gitea.example.com/api/v1. Empty for `generic`.
    api_url = models.URLField(max_length=500, blank=True, default="")
    # `owner/name` on GitHub and Gitea; the project's path (`group/project`) or id on GitLab.
    repository = models.CharField(max_length=300, blank=True, default="")
    # The NAME of the workers' environment variable holding the API token: bound to URL
    # prefixes by FUSION_GIT_CREDENTIALS like a repository's credentials_env
    # (docs/REPOSITORIES.md, "Credentials"); never the value.
    token_env = models.CharField(max_length=100, blank=True, default="")
    # The webhook's shared secret. Empty: the deployment's FUSION_FORGE_WEBHOOK_SECRET.
    # Shown only to the mission's owner and staff; never in events, logs or the audit.
    secret = models.CharField(max_length=100, blank=True, default=new_secret)
    feature_pattern = models.CharField(max_length=200, blank=True, default=DEFAULT_FEATURE_PATTERN)
    statuses = models.BooleanField(default=True)
    comments = models.BooleanField(default=True)
    # The commit status's context (GitHub, Gitea) or name (GitLab).
    context = models.CharField(max_length=100, default="fusion-missions")
    # A permanent refusal from the forge (401/403/404/422), shown on the mission until a
    # later delivery succeeds.
    refusal = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"{self.provider}:{self.repository or self.mission_id}"


class DeliveryState(models.TextChoices):
    RECEIVED = "received"  # verified and queued; not processed yet
    REJECTED = "rejected"  # signature missing or wrong, body too large or unreadable
    MATCHED = "matched"  # completed a task
    IGNORED = "ignored"  # verified, but names nothing this mission follows (`reason`)
    FAILED = "failed"  # matched, but the completion was refused (`reason`)


class Delivery(TimeStamped):
    """One webhook request, as received: every one is recorded, verified or not."""

    # No database constraint: the webhook's insert would otherwise take a key-share lock on
    # the mission's row, and wait for every transaction holding the mission lock (the loop
    # judging the mission's work) before the forge gets its answer. Django still cascades a
    # deleted mission's deliveries (docs/BENCHMARKS.md, "Forge").
    mission = models.ForeignKey(
        Mission,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="forge_deliveries",
        db_constraint=False,
    )
    provider = models.CharField(max_length=16, choices=Provider.choices)
    # The forge's delivery id (X-GitHub-Delivery, X-Gitea-Delivery, X-Gitlab-Event-UUID,
    # or the generic form's `delivery`); a repeated verified one is a replay.
    delivery_id = models.CharField(max_length=200, blank=True, default="")
    event = models.CharField(max_length=60, blank=True, default="")
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.RECEIVED, db_index=True
    )
    reason = models.TextField(blank=True, default="")
    ref = models.CharField(max_length=300, blank=True, default="")
    head = models.CharField(max_length=80, blank=True, default="")
    pull_number = models.PositiveIntegerField(null=True, blank=True)
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The parsed body of a verified delivery (bounded by FUSION_FORGE_HOOK_MAX_BYTES).
    payload = models.JSONField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            # Only verified deliveries hold their id: a forged request cannot burn a real one.
            models.UniqueConstraint(
                fields=["mission", "provider", "delivery_id"],
                condition=~models.Q(delivery_id="") & ~models.Q(state="rejected"),
                name="forge_delivery_once",
            )
        ]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.provider} {self.event} {self.delivery_id} ({self.state})"


class PullRequest(TimeStamped):
    """A pull (merge) request the mission follows: the feature it names and our comment."""

    forge = models.ForeignKey(Forge, on_delete=models.CASCADE, related_name="pull_requests")
    number = models.PositiveIntegerField()  # GitHub/Gitea number, GitLab iid
    feature = models.ForeignKey(MissionFeature, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    branch = models.CharField(max_length=300, blank=True, default="")
    title = models.CharField(max_length=500, blank=True, default="")
    head = models.CharField(max_length=80, blank=True, default="")
    url = models.URLField(max_length=500, blank=True, default="")
    # Our one comment's id on the forge, once posted; later verdicts edit it.
    comment_id = models.CharField(max_length=80, blank=True, default="")

    class Meta:
        ordering = ["forge_id", "number"]
        constraints = [models.UniqueConstraint(fields=["forge", "number"], name="forge_pull_request_once")]

    def __str__(self) -> str:
        return f"#{self.number}"


class OutboxKind(models.TextChoices):
    STATUS = "status"
    COMMENT = "comment"


class OutboxState(models.TextChoices):
    PENDING = "pending"  # to send at `next_attempt_at`
    DELIVERED = "delivered"
    REFUSED = "refused"  # a permanent refusal (401/403/404/422): `last_error` says why
    # A status of a revision never sent: a later status of the same revision was armed
    # before it went out (the forge keeps the last status of a context; an older one sent
    # after a newer would replace it).
    SUPERSEDED = "superseded"


class Outbox(TimeStamped):
    """What the mission answers on its forge, written in the transaction that decided it
    (the database is the source of truth) and sent after commit, retried until delivered
    or refused. `key` makes each answer once: `status:<sha>:<state>` is never posted twice
    in a row for the same revision and state (armed anew only after another state); a pull request has one `comment:<number>` row, armed
    again (`version`) by each new verdict, so its comment is edited, never posted twice."""

    forge = models.ForeignKey(Forge, on_delete=models.CASCADE, related_name="outbox")
    kind = models.CharField(max_length=16, choices=OutboxKind.choices)
    key = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=OutboxState.choices, default=OutboxState.PENDING, db_index=True)
    version = models.PositiveIntegerField(default=1)
    delivered_version = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)  # the forge's last HTTP status
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    # A sender's claim while it talks to the forge (as runs and tasks hold their leases).
    claim_token = models.CharField(max_length=32, blank=True, default="", editable=False)
    lease_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["forge", "key"], name="forge_outbox_once")]
        verbose_name_plural = "outbox"

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"
