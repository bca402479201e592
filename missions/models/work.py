"""The work done on the plan: tasks, and the mission's append-only event log."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from missions.models.base import TimeStamped
from missions.models.plan import Executor, Mission, MissionFeature


class TaskStatus(models.TextChoices):
    TODO = "todo"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Task(TimeStamped):
    mission = models.ForeignKey(Mission, on_delete=models.CASCADE, related_name="tasks")
    feature = models.ForeignKey(MissionFeature, null=True, blank=True, on_delete=models.CASCADE, related_name="tasks")
    title = models.CharField(max_length=200)
    prompt = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.TODO, db_index=True)
    # The full commit id the task landed (resolved when it completed) and the name the
    # user gave it (a branch, `HEAD`, a short id), kept for display only.
    revision = models.CharField(max_length=80, blank=True, default="")
    revision_name = models.CharField(max_length=200, blank=True, default="")
    summary = models.TextField(blank=True, default="")
    log = models.TextField(blank=True, default="")
    executor = models.CharField(max_length=16, choices=Executor.choices, default=Executor.MANUAL)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The `command` executor's lease (missions/services/executor.py), as validator runs
    # hold theirs: how many executors took the task, which one holds it (a claim token and
    # the worker process) and until when (renewed by a heartbeat while the command runs).
    executor_attempts = models.PositiveIntegerField(default=0, editable=False)
    claim_token = models.CharField(max_length=32, blank=True, default="", editable=False)
    claimed_by = models.CharField(max_length=200, blank=True, default="", editable=False)
    lease_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"task {self.pk}: {self.title}"


class MissionEvent(TimeStamped):
    """Append-only audit log; `seq` orders events within a mission."""

    mission = models.ForeignKey(Mission, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=80, db_index=True)
    payload = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["mission_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["mission", "seq"], name="mission_event_seq_unique")]

    def __str__(self) -> str:
        return f"{self.mission_id}#{self.seq} {self.type}"
