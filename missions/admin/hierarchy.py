"""Admin of missions, milestones and slices. Lifecycle changes (activate, pause, resume,
autopilot) are actions that call the lifecycle services; the status is read-only. A
milestone's validation judges, so its action is the floor above's
(`validation.admin_features`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django import forms
from django.contrib import admin
from django.db import transaction
from django.utils.html import format_html, format_html_join

from missions.access import audience, revoke_on_commit
from missions.admin.actions import MISSION_ACTIONS
from missions.admin.forms import MilestoneForm, MissionForm, SliceForm
from missions.admin.helpers import (
    TIMESTAMPS,
    LinkDisplays,
    PlanWriteMixin,
    RollupRefreshMixin,
    SaveChangedFieldsMixin,
    admin_link,
    formsets_changed,
    linked_milestone_ids,
)
from missions.admin.inlines import ContractAssertionInline, FeatureInline, MilestoneInline, SliceInline
from missions.models import ContractAssertion, Milestone, Mission, MissionEvent, MissionFeature, MissionStatus, Slice
from missions.services import lifecycle
from missions.services.verdict_settings import base_changed


@admin.register(Mission)
class MissionAdmin(PlanWriteMixin, SaveChangedFieldsMixin, LinkDisplays, admin.ModelAdmin):
    form = MissionForm
    list_display = (
        "key",
        "title",
        "status",
        "autopilot",
        "auto_fix",
        "retry_budget",
        "executor",
        "owner",
        "updated_at",
    )
    list_filter = ("status", "autopilot", "auto_fix", "executor", "validator")
    search_fields = ("key", "title", "description")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    autocomplete_fields = ("owner",)
    filter_horizontal = ("members",)
    readonly_fields = ("status", "status_reason", "resume_blockers", "base_commit", "event_seq", *TIMESTAMPS)
    fieldsets = (
        (None, {"fields": ("key", "title", "description", "status", "status_reason", "resume_blockers")}),
        (
            "Loop",
            {
                "fields": ("autopilot", "auto_fix", "retry_budget", "validator", "allowed_validators"),
                "description": "Only the validator and the allowed profiles may judge this mission; the owner "
                "or staff change them (docs/TRUTH.md).",
            },
        ),
        (
            "Repository and executor",
            {
                "fields": (
                    "repository",
                    "credentials_env",
                    "submodules",
                    "branch",
                    "base_revision",
                    "base_commit",
                    "executor",
                    "executor_command",
                ),
                "description": "The repository is a git URL or an absolute path on the workers; credentials_env "
                "names the workers' variable holding its token or ssh key, never the secret itself, and must be "
                "one FUSION_GIT_CREDENTIALS allows for this repository (docs/REPOSITORIES.md). The branch is "
                "what a validation judges when no task has landed a revision. The base revision is pinned to its "
                "commit when saved.",
            },
        ),
        ("Protected paths", {"fields": ("protected_paths", "on_protected_change", "protect_runner_config")}),
        (
            "Environment",
            {"fields": ("environment",), "description": "What the checks run with (docs/ENVIRONMENTS.md)."},
        ),
        ("People", {"fields": ("owner", "members")}),
        ("Record", {"fields": ("event_seq", *TIMESTAMPS)}),
    )
    inlines = (MilestoneInline,)
    actions = MISSION_ACTIONS
    mission_path = "pk"

    @admin.display(description="blocks a resume")
    def resume_blockers(self, obj):
        """Blocked features a resume cannot clear: each needs a repair first."""
        if obj is None or obj.pk is None or obj.status not in (MissionStatus.PAUSED, MissionStatus.BLOCKED):
            return "-"
        blockers = lifecycle.resume_blockers(obj)
        if not blockers:
            return "nothing: a resume re-arms the mission"
        features = {f.pk: f for f in MissionFeature.objects.filter(pk__in=[b["feature"] for b in blockers])}
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                "<li>{} — {} since {}</li>",
                (
                    (admin_link(features.get(b["feature"]), b["key"]), b["reason"], b["since"] or "unknown")
                    for b in blockers
                ),
            ),
        )

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.user = request.user  # type: ignore[attr-defined]  # MissionForm's own attribute
        return form

    def save_model(self, request, obj, form, change):
        request.fusion_audience = audience(obj.pk) if change else set()
        old = Mission.objects.filter(pk=obj.pk).values_list("base_commit", flat=True).first() if change else ""
        settled = getattr(form, "settled", {})
        if "base_commit" in settled:
            obj.base_commit = settled["base_commit"]
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if change and "base_commit" in settled:  # not a form field: written here, with its consequences
                Mission.objects.filter(pk=obj.pk).update(base_commit=obj.base_commit)
                base_changed(mission=obj, old=old or "", actor_id=request.user.pk)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        # Whoever this edit took off the mission loses its live streams (as through the API).
        revoke_on_commit(form.instance.pk, getattr(request, "fusion_audience", set()) - audience(form.instance.pk))

    def get_deleted_objects(self, objs, request):
        # The audit log cannot be deleted on its own, but it goes with its mission.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(MissionEvent._meta.verbose_name)
        return deleted, counts, perms_needed, protected


@admin.register(Milestone)
class MilestoneAdmin(PlanWriteMixin, RollupRefreshMixin, SaveChangedFieldsMixin, LinkDisplays, admin.ModelAdmin):
    form = MilestoneForm
    list_display = ("key", "title", "mission", "order", "status", "validation_state", "updated_at")
    list_filter = ("status", "validation_state", "mission")
    search_fields = ("key", "title", "mission__key")
    list_select_related = ("mission",)
    date_hierarchy = "created_at"
    ordering = ("mission", "order", "id")
    autocomplete_fields = ("mission",)
    filter_horizontal = ("dependencies",)
    readonly_fields = ("mission_link", "status", "validation_state", *TIMESTAMPS)
    fields = (
        "mission",
        "mission_link",
        "key",
        "title",
        "description",
        "order",
        "status",
        "validation_state",
        "dependencies",
        "environment",
        *TIMESTAMPS,
    )
    inlines = (SliceInline, ContractAssertionInline)
    # None of its own (ModelAdmin's default): validation.admin_features.LoopMilestoneAdmin
    # extends these with the milestone's validation.
    actions: Sequence[Callable[..., Any]] = ()

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        # Slices, features and assertions carry the mission: a milestone cannot move.
        return (*fields, "mission") if obj else fields

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        return tuple(f for f in fields if f != ("mission_link" if obj is None else "mission"))

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        field = form.base_fields.get("dependencies")
        if isinstance(field, forms.ModelChoiceField) and obj is not None:  # the M2M field, when shown
            field.queryset = Milestone.objects.filter(mission_id=obj.mission_id).exclude(pk=obj.pk)
        return form

    def rollup_milestone_ids(self, queryset):
        return set(queryset.values_list("pk", flat=True)) | linked_milestone_ids(feature__slice__milestone__in=queryset)

    def rollup_changed(self, request, form, formsets, change):
        return formsets_changed(formsets, ContractAssertion)


@admin.register(Slice)
class SliceAdmin(PlanWriteMixin, RollupRefreshMixin, SaveChangedFieldsMixin, LinkDisplays, admin.ModelAdmin):
    form = SliceForm
    list_display = ("key", "title", "mission", "milestone", "order", "status", "activated_at")
    list_filter = ("status", "mission")
    search_fields = ("key", "title", "mission__key", "milestone__key")
    list_select_related = ("mission", "milestone")
    date_hierarchy = "created_at"
    ordering = ("mission", "milestone__order", "order", "id")
    autocomplete_fields = ("milestone",)
    readonly_fields = ("mission_link", "milestone_link", "status", "activated_at", *TIMESTAMPS)
    fields = (
        "mission_link",
        ("milestone", "milestone_link"),
        "key",
        "title",
        "description",
        "order",
        "status",
        "activated_at",
        *TIMESTAMPS,
    )
    inlines = (FeatureInline,)

    def save_form(self, request, form, change):
        obj = super().save_form(request, form, change)
        if obj.milestone_id:  # as save() does; inline forms validate against it first
            obj.mission_id = obj.milestone.mission_id
        return obj

    def rollup_milestone_ids(self, queryset):
        return linked_milestone_ids(feature__slice__in=queryset)

    def rollup_changed(self, request, form, formsets, change):
        return False  # features are not deleted inline; moving a slice keeps its links
