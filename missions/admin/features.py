"""Admin of features, contract assertions and their links. The loop state is read-only;
the operator actions on features (validate, repair, create fix, review) judge, so they
belong to the floor above: `validation.admin_features` registers a subclass of
`FeatureAdmin` that adds them (docs/ARCHITECTURE.md, "Floors"). Edits that change which
assertions a milestone has, or which features cover them, recompute the milestone rollup
in the admin's transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.contrib import admin
from django.db import models

from missions.admin.forms import ContractAssertionForm, FeatureAssertionForm, FeatureForm
from missions.admin.helpers import (
    TIMESTAMPS,
    LinkDisplays,
    PlanWriteMixin,
    RollupRefreshMixin,
    SaveChangedFieldsMixin,
    admin_link,
    formsets_changed,
    link_display,
    linked_milestone_ids,
    related,
)
from missions.admin.inlines import AssertionFeatureInline, FeatureAssertionInline, TaskInline
from missions.models import ContractAssertion, FeatureAssertion, MissionFeature, TaskStatus


@admin.register(MissionFeature)
class FeatureAdmin(PlanWriteMixin, RollupRefreshMixin, SaveChangedFieldsMixin, LinkDisplays, admin.ModelAdmin):
    form = FeatureForm
    list_display = (
        "key",
        "title",
        "mission",
        "slice",
        "status",
        "loop_state",
        "implementation_attempts",
        "validator_attempts",
        "fix_rounds",
        "stop_reason",
        "updated_at",
    )
    list_filter = ("status", "loop_state", "stop_reason", "mission")
    search_fields = ("key", "title", "description", "mission__key", "slice__key")
    list_select_related = ("mission", "slice")
    date_hierarchy = "created_at"
    ordering = ("mission", "slice__order", "order", "id")
    autocomplete_fields = ("slice",)
    readonly_fields = (
        "mission_link",
        "milestone_link",
        "slice_link",
        "status",
        "loop_state",
        "implementation_attempts",
        "validator_attempts",
        "fix_rounds",
        "last_run_link",
        "stop_reason",
        "stop_detail",
        "stopped_at",
        "generated_from_link",
        "generated_from_run_link",
        *TIMESTAMPS,
    )
    fieldsets = (
        (None, {"fields": ("mission_link", "milestone_link", ("slice", "slice_link"), "key", "title", "order")}),
        ("Specification", {"fields": ("description", "acceptance_criteria")}),
        (
            "Loop (changed by the loop and the actions only)",
            {
                "fields": (
                    "status",
                    "loop_state",
                    "implementation_attempts",
                    "validator_attempts",
                    "fix_rounds",
                    "last_run_link",
                    "stop_reason",
                    "stop_detail",
                    "stopped_at",
                )
            },
        ),
        ("Fix lineage", {"fields": ("generated_from_link", "generated_from_run_link")}),
        ("Record", {"fields": TIMESTAMPS}),
    )
    inlines = (FeatureAssertionInline, TaskInline)
    # None of its own (ModelAdmin's default): validation.admin_features.LoopFeatureAdmin
    # extends these with the loop's actions.
    actions: Sequence[Callable[..., Any]] = ()

    @admin.display(description="milestone")
    def milestone_link(self, obj):
        slice_ = related(obj, "slice")
        return admin_link(slice_.milestone) if slice_ else "-"

    last_run_link = link_display("last_run")
    generated_from_link = link_display("generated_from")
    generated_from_run_link = link_display("generated_from_run")

    def has_delete_permission(self, request, obj=None):
        # A feature whose task is running is deleted only when forced, through the service
        # (missions.services.hierarchy.feature_delete; docs/ARCHITECTURE.md, "State machines").
        if obj is not None and obj.pk and obj.tasks.filter(status=TaskStatus.IN_PROGRESS).exists():
            return False
        return super().has_delete_permission(request, obj)

    def save_form(self, request, form, change):
        obj = super().save_form(request, form, change)
        if obj.slice_id:  # as save() does; the link inline validates the mission against it
            obj.mission_id = obj.slice.mission_id
        return obj

    def rollup_milestone_ids(self, queryset):
        return linked_milestone_ids(feature__in=queryset)

    def rollup_changed(self, request, form, formsets, change):
        return formsets_changed(formsets, FeatureAssertion)


@admin.register(ContractAssertion)
class ContractAssertionAdmin(
    PlanWriteMixin, RollupRefreshMixin, SaveChangedFieldsMixin, LinkDisplays, admin.ModelAdmin
):
    form = ContractAssertionForm
    list_display = ("key", "title", "mission", "milestone", "scope", "status", "order", "feature_count", "updated_at")
    list_filter = ("status", "scope", "mission")
    search_fields = ("key", "title", "statement", "mission__key", "milestone__key")
    list_select_related = ("mission", "milestone")
    date_hierarchy = "created_at"
    ordering = ("mission", "milestone__order", "order", "id")
    autocomplete_fields = ("milestone",)
    readonly_fields = ("mission_link", "milestone_link", "status", *TIMESTAMPS)
    fields = (
        "mission_link",
        ("milestone", "milestone_link"),
        "key",
        "title",
        "statement",
        "scope",
        "check_spec",
        "status",
        "order",
        *TIMESTAMPS,
    )
    inlines = (AssertionFeatureInline,)

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_feature_count=models.Count("feature_links"))

    @admin.display(description="features", ordering="_feature_count")
    def feature_count(self, obj):
        return getattr(obj, "_feature_count", None)

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        # `check_spec` runs code on the host: only mission editors may change it.
        if not request.user.has_perm("missions.change_mission"):
            fields = (*fields, "check_spec")
        return fields

    def save_form(self, request, form, change):
        obj = super().save_form(request, form, change)
        if obj.milestone_id:  # as save() does; the link inline validates the mission against it
            obj.mission_id = obj.milestone.mission_id
        return obj

    def rollup_milestone_ids(self, queryset):
        return set(queryset.values_list("milestone_id", flat=True))

    def rollup_changed(self, request, form, formsets, change):
        # An edited statement or check is a new contract: the milestone must be judged again.
        judged = {"milestone", "scope", "statement", "check_spec"}
        return not change or bool(judged & set(form.changed_data)) or formsets_changed(formsets)


@admin.register(FeatureAssertion)
class FeatureAssertionAdmin(PlanWriteMixin, RollupRefreshMixin, admin.ModelAdmin):
    mission_path = "feature__mission_id"
    form = FeatureAssertionForm
    list_display = ("id", "feature_link", "assertion_link", "assertion_scope", "feature_mission", "created_at")
    list_filter = ("assertion__scope", "feature__mission")
    search_fields = ("feature__key", "assertion__key", "assertion__title")
    list_select_related = ("feature", "feature__mission", "assertion")
    date_hierarchy = "created_at"
    ordering = ("-id",)
    autocomplete_fields = ("feature", "assertion")
    readonly_fields = ("feature_link", "assertion_link", *TIMESTAMPS)
    fields = (("feature", "feature_link"), ("assertion", "assertion_link"), *TIMESTAMPS)

    feature_link = link_display("feature", ordering="feature__key")
    assertion_link = link_display("assertion", ordering="assertion__key")

    @admin.display(description="scope", ordering="assertion__scope")
    def assertion_scope(self, obj):
        return obj.assertion.scope

    @admin.display(description="mission", ordering="feature__mission__key")
    def feature_mission(self, obj):
        return obj.feature.mission

    def rollup_milestone_ids(self, queryset):
        return set(queryset.values_list("assertion__milestone_id", flat=True))

    def rollup_changed(self, request, form, formsets, change):
        return True
