"""Admin of tasks (created, started, completed and failed through the task services; the
log is shown read-only, preformatted) and of the append-only mission audit log."""

from __future__ import annotations

from django.contrib import admin

from missions.admin.actions import TASK_ACTIONS
from missions.admin.forms import TaskForm
from missions.admin.helpers import TIMESTAMPS, LinkDisplays, SaveChangedFieldsMixin, preformatted, pretty_json
from missions.models import MissionEvent, Task
from missions.services.tasks import task_create


@admin.register(Task)
class TaskAdmin(SaveChangedFieldsMixin, LinkDisplays, admin.ModelAdmin):
    form = TaskForm
    list_display = (
        "id",
        "title",
        "mission",
        "feature",
        "status",
        "executor",
        "revision",
        "revision_name",
        "started_at",
        "finished_at",
    )
    list_filter = ("status", "executor", "mission")
    search_fields = ("title", "prompt", "summary", "revision", "revision_name", "feature__key", "mission__key")
    list_select_related = ("mission", "feature")
    date_hierarchy = "created_at"
    ordering = ("-id",)
    autocomplete_fields = ("mission", "feature")
    readonly_fields = (
        "mission_link",
        "feature_link",
        "executor",
        "status",
        "revision",
        "revision_name",
        "started_at",
        "finished_at",
        "summary",
        "log_display",
        *TIMESTAMPS,
    )
    fieldsets = (
        (None, {"fields": (("mission", "mission_link"), ("feature", "feature_link"), "title", "prompt", "executor")}),
        (
            "Execution (changed by the actions and the executor only)",
            {"fields": ("status", "revision", "revision_name", "started_at", "finished_at", "summary", "log_display")},
        ),
        ("Record", {"fields": TIMESTAMPS}),
    )
    actions = TASK_ACTIONS

    @admin.display(description="log")
    def log_display(self, obj):
        return preformatted(obj.log if obj is not None else "")

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        # A new task goes through the service: it links the feature (idle -> implementing),
        # takes the mission's executor, and starts by itself with the `command` executor.
        task = task_create(
            user=request.user, title=obj.title, prompt=obj.prompt, feature=obj.feature, mission=obj.mission
        )
        obj.pk = task.pk
        obj._state.adding = False
        obj.refresh_from_db()


@admin.register(MissionEvent)
class MissionEventAdmin(LinkDisplays, admin.ModelAdmin):
    """The audit log: append-only, written by missions.outbox only."""

    list_display = ("id", "mission", "seq", "type", "actor", "created_at")
    list_filter = ("type", "mission")
    search_fields = ("type", "mission__key")
    list_select_related = ("mission", "actor")
    date_hierarchy = "created_at"
    ordering = ("-id",)
    fields = ("mission_link", "seq", "type", "actor", "payload_pretty", "created_at")
    readonly_fields = fields

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return pretty_json(obj.payload)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
