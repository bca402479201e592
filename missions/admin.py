"""Admin for the mission hierarchy.

States change only through services, so every state field is read-only here. Edits that
change which assertions a milestone has, or which features cover them, recompute the
milestone rollup in the admin's transaction. Hierarchy inlines cannot delete rows: a
delete goes through the object's own delete page, which lists what cascades and checks
the permissions of every cascaded object.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from django import forms
from django.contrib import admin
from django.core.exceptions import ObjectDoesNotExist
from django.db import models, transaction
from django.forms.models import BaseInlineFormSet
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from missions.errors import Invalid
from missions.models import (
    AssertionScope,
    ContractAssertion,
    Feature,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    Slice,
    Task,
    TaskStatus,
)
from missions.services.hierarchy import _check_dependencies
from missions.services.rollup import milestone_rollup_refresh

TIMESTAMPS = ("created_at", "updated_at")


# --- rendering helpers (also used by validation.admin) ---------------------------------


def admin_link(obj: models.Model | None, label: Any = None) -> str:
    """A link to the change page of `obj`, or "-" when there is none."""
    if obj is None or obj.pk is None:
        return "-"
    opts = obj._meta
    try:
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    except NoReverseMatch:
        return str(obj if label is None else label)
    return format_html('<a href="{}">{}</a>', url, obj if label is None else label)


def related(obj: models.Model, name: str) -> models.Model | None:
    """`obj.<name>` for a foreign key, None while it is unset (unsaved add forms)."""
    if getattr(obj, f"{name}_id", None) is None:
        return None
    return getattr(obj, name)


def pretty_json(value: Any) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)


def short_sha(value: str) -> str:
    return value[:12] if value else "-"


# --- rollup ------------------------------------------------------------------------------


def refresh_rollups(milestone_ids: Iterable[int | None]) -> None:
    ids = {pk for pk in milestone_ids if pk is not None}
    if ids:
        milestone_rollup_refresh(milestone_ids=ids)


def linked_milestone_ids(**link_filter: Any) -> set[int]:
    """Milestones of the assertions reached by the FeatureAssertion rows matching the filter."""
    return set(FeatureAssertion.objects.filter(**link_filter).values_list("assertion__milestone_id", flat=True))


def formsets_changed(formsets: Iterable[Any], model: type[models.Model] | None = None) -> bool:
    return any(
        fs.new_objects or fs.changed_objects or fs.deleted_objects
        for fs in formsets
        if model is None or fs.model is model
    )


class RollupRefreshMixin:
    """Recompute the rollup of every milestone whose inputs an admin save or delete touched.

    `rollup_milestone_ids(queryset)` names the milestones that depend on the rows; they are
    collected before the write (old links and parents) and after it (new ones).
    """

    def rollup_milestone_ids(self, queryset: models.QuerySet) -> set[int]:
        raise NotImplementedError

    def rollup_changed(self, request, form, formsets, change: bool) -> bool:
        return formsets_changed(formsets)

    def _ids_of(self, obj: models.Model) -> set[int]:
        return self.rollup_milestone_ids(self.model.objects.filter(pk=obj.pk)) if obj.pk else set()

    def save_model(self, request, obj, form, change):
        obj._admin_rollup_before = self._ids_of(obj) if change else set()
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        if self.rollup_changed(request, form, formsets, change):
            obj = form.instance
            refresh_rollups(getattr(obj, "_admin_rollup_before", set()) | self._ids_of(obj))

    def delete_model(self, request, obj):
        ids = self._ids_of(obj)
        super().delete_model(request, obj)
        refresh_rollups(ids)

    def delete_queryset(self, request, queryset):
        # The changelist's delete action is not wrapped in a transaction by the admin.
        with transaction.atomic():
            ids = self.rollup_milestone_ids(queryset)
            super().delete_queryset(request, queryset)
            refresh_rollups(ids)


# --- forms ---------------------------------------------------------------------------------


def mission_id_of(parent: models.Model | None) -> int | None:
    """The mission a child of `parent` (a mission, milestone or slice) belongs to."""
    if isinstance(parent, Mission):
        return parent.pk
    if isinstance(parent, Slice):
        return parent.milestone.mission_id if parent.milestone_id else parent.mission_id
    return getattr(parent, "mission_id", None)


class MissionScopedForm(forms.ModelForm):
    """For models whose `mission` is derived from a parent in save().

    The derived `mission` is not a form field, so Django skips the (mission, key) unique
    constraint; check it here, and refuse moves to another mission (children and links
    carry the mission too).
    """

    parent_field = ""

    def clean(self):
        cleaned = super().clean()
        instance = self.instance
        parent = cleaned.get(self.parent_field) or related(instance, self.parent_field)
        mission_id = mission_id_of(parent)
        if mission_id is None:
            return cleaned
        if instance.pk and instance.mission_id != mission_id:
            self.add_error(self.parent_field, "Cannot move to another mission.")
        key = cleaned.get("key")
        # When `mission` is a form field Django checks the constraint itself.
        if key and "mission" not in self.fields and (
            type(instance).objects.filter(mission_id=mission_id, key=key).exclude(pk=instance.pk).exists()
        ):
            self.add_error("key", "This key is already used in the mission.")
        return cleaned


class MilestoneForm(MissionScopedForm):
    parent_field = "mission"

    class Meta:
        model = Milestone
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        mission = cleaned.get("mission") or related(self.instance, "mission")
        if "dependencies" in cleaned and mission is not None:
            milestone = self.instance if self.instance.pk else None
            try:  # same mission, not itself, no cycle: the rule the API applies
                _check_dependencies(milestone, mission, cleaned["dependencies"])
            except Invalid as exc:
                self.add_error("dependencies", exc.detail)
        return cleaned


class SliceForm(MissionScopedForm):
    parent_field = "milestone"

    class Meta:
        model = Slice
        fields = "__all__"


class FeatureForm(MissionScopedForm):
    parent_field = "slice"

    class Meta:
        model = Feature
        fields = "__all__"


class ContractAssertionForm(MissionScopedForm):
    parent_field = "milestone"

    class Meta:
        model = ContractAssertion
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        if (
            cleaned.get("scope") == AssertionScope.MILESTONE
            and self.instance.pk
            and FeatureAssertion.objects.filter(assertion_id=self.instance.pk).exists()
        ):
            self.add_error("scope", "Remove the feature links first: milestone-scoped assertions cannot be linked.")
        return cleaned


class FeatureAssertionForm(forms.ModelForm):
    class Meta:
        model = FeatureAssertion
        fields = "__all__"

    def _post_clean(self):
        # FeatureAssertion.clean() dereferences both foreign keys; when one is missing the
        # form already carries a field error for it, which is what the user must see.
        try:
            super()._post_clean()
        except ObjectDoesNotExist:
            if not self._errors:
                raise


class MissionKeyInlineFormSet(BaseInlineFormSet):
    """Refuses the same key twice within one submit (see MissionScopedForm)."""

    def clean(self):
        super().clean()
        seen: set[str] = set()
        for form in self.forms:
            if not hasattr(form, "cleaned_data") or self._should_delete_form(form):
                continue
            key = form.cleaned_data.get("key")
            if key and key in seen:
                form.add_error("key", "This key appears twice.")
            seen.add(key)


class MissionLinkInlineFormSet(BaseInlineFormSet):
    """Offers only rows of the parent's mission in the link's other foreign key."""

    other_field = ""

    def add_fields(self, form, index):
        super().add_fields(form, index)
        field = form.fields.get(self.other_field)
        parent_mission = getattr(self.instance, "mission_id", None)
        if isinstance(self.instance, Feature) and self.instance.slice_id:
            parent_mission = self.instance.slice.mission_id
        elif isinstance(self.instance, ContractAssertion) and self.instance.milestone_id:
            parent_mission = self.instance.milestone.mission_id
        if field is not None and parent_mission is not None:
            field.queryset = field.queryset.filter(mission_id=parent_mission)


class AssertionChoiceFormSet(MissionLinkInlineFormSet):
    other_field = "assertion"


class FeatureChoiceFormSet(MissionLinkInlineFormSet):
    other_field = "feature"


# --- inlines -------------------------------------------------------------------------------


class MilestoneInline(admin.TabularInline):
    model = Milestone
    fields = ("key", "title", "order", "status", "validation_state")
    readonly_fields = ("status", "validation_state")
    extra = 0
    can_delete = False
    show_change_link = True


class SliceInline(admin.TabularInline):
    model = Slice
    form = SliceForm
    formset = MissionKeyInlineFormSet
    fields = ("key", "title", "order", "status", "activated_at")
    readonly_fields = ("status", "activated_at")
    extra = 0
    can_delete = False
    show_change_link = True


class FeatureInline(admin.TabularInline):
    model = Feature
    form = FeatureForm
    formset = MissionKeyInlineFormSet
    fields = ("key", "title", "order", "status", "loop_state")
    readonly_fields = ("status", "loop_state")
    extra = 0
    can_delete = False
    show_change_link = True


class ContractAssertionInline(admin.TabularInline):
    model = ContractAssertion
    form = ContractAssertionForm
    formset = MissionKeyInlineFormSet
    fields = ("key", "title", "statement", "scope", "order", "status")
    readonly_fields = ("status",)
    extra = 0
    can_delete = False
    show_change_link = True
    formfield_overrides = {models.TextField: {"widget": forms.Textarea(attrs={"rows": 2, "cols": 40})}}


class FeatureAssertionInline(admin.TabularInline):
    """Links seen from a feature: choose assertions of the same mission."""

    model = FeatureAssertion
    form = FeatureAssertionForm
    formset = AssertionChoiceFormSet
    fk_name = "feature"
    fields = ("assertion", "assertion_link", "assertion_scope", "assertion_status", "created_at")
    readonly_fields = ("assertion_link", "assertion_scope", "assertion_status", "created_at")
    extra = 0
    show_change_link = True
    verbose_name = "assertion link"

    @admin.display(description="assertion page")
    def assertion_link(self, obj):
        assertion = related(obj, "assertion")
        return admin_link(assertion, assertion and assertion.title)

    @admin.display(description="scope")
    def assertion_scope(self, obj):
        assertion = related(obj, "assertion")
        return assertion.scope if assertion else "-"

    @admin.display(description="status")
    def assertion_status(self, obj):
        assertion = related(obj, "assertion")
        return assertion.status if assertion else "-"


class AssertionFeatureInline(admin.TabularInline):
    """Links seen from an assertion: choose features of the same mission."""

    model = FeatureAssertion
    form = FeatureAssertionForm
    formset = FeatureChoiceFormSet
    fk_name = "assertion"
    fields = ("feature", "feature_link", "feature_loop_state", "created_at")
    readonly_fields = ("feature_link", "feature_loop_state", "created_at")
    extra = 0
    show_change_link = True
    verbose_name = "feature link"

    @admin.display(description="feature page")
    def feature_link(self, obj):
        feature = related(obj, "feature")
        return admin_link(feature, feature and feature.title)

    @admin.display(description="loop state")
    def feature_loop_state(self, obj):
        feature = related(obj, "feature")
        return feature.loop_state if feature else "-"


class TaskInline(admin.TabularInline):
    model = Task
    fk_name = "feature"
    fields = ("title", "status", "executor", "revision", "started_at", "finished_at")
    readonly_fields = ("status", "revision", "started_at", "finished_at")
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        # A task also needs its mission, which the inline form does not ask for.
        return False


# --- model admins --------------------------------------------------------------------------


class LinkDisplays:
    """Read-only links to the usual parents; each works on unsaved objects too."""

    @admin.display(description="mission", ordering="mission__key")
    def mission_link(self, obj):
        return admin_link(related(obj, "mission"))

    @admin.display(description="milestone", ordering="milestone__key")
    def milestone_link(self, obj):
        return admin_link(related(obj, "milestone"))

    @admin.display(description="slice", ordering="slice__key")
    def slice_link(self, obj):
        return admin_link(related(obj, "slice"))

    @admin.display(description="feature", ordering="feature__key")
    def feature_link(self, obj):
        return admin_link(related(obj, "feature"))


@admin.register(Mission)
class MissionAdmin(LinkDisplays, admin.ModelAdmin):
    list_display = ("key", "title", "status", "autopilot", "auto_fix", "retry_budget", "executor", "owner",
                    "updated_at")
    list_filter = ("status", "autopilot", "auto_fix", "executor", "validator")
    search_fields = ("key", "title", "description")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    autocomplete_fields = ("owner",)
    filter_horizontal = ("members",)
    readonly_fields = ("status", "status_reason", "event_seq", *TIMESTAMPS)
    fieldsets = (
        (None, {"fields": ("key", "title", "description", "status", "status_reason")}),
        ("Loop", {"fields": ("autopilot", "auto_fix", "retry_budget", "validator")}),
        ("Workspace and executor", {"fields": ("workspace", "base_revision", "executor", "executor_command")}),
        ("People", {"fields": ("owner", "members")}),
        ("Record", {"fields": ("event_seq", *TIMESTAMPS)}),
    )
    inlines = (MilestoneInline,)

    def get_deleted_objects(self, objs, request):
        # The audit log cannot be deleted on its own, but it goes with its mission.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(MissionEvent._meta.verbose_name)
        return deleted, counts, perms_needed, protected


@admin.register(Milestone)
class MilestoneAdmin(RollupRefreshMixin, LinkDisplays, admin.ModelAdmin):
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
    fields = ("mission", "mission_link", "key", "title", "description", "order", "status", "validation_state",
              "dependencies", *TIMESTAMPS)
    inlines = (SliceInline, ContractAssertionInline)

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
        if field is not None and obj is not None:
            field.queryset = Milestone.objects.filter(mission_id=obj.mission_id).exclude(pk=obj.pk)
        return form

    def rollup_milestone_ids(self, queryset):
        return set(queryset.values_list("pk", flat=True)) | linked_milestone_ids(feature__slice__milestone__in=queryset)

    def rollup_changed(self, request, form, formsets, change):
        return formsets_changed(formsets, ContractAssertion)


@admin.register(Slice)
class SliceAdmin(RollupRefreshMixin, LinkDisplays, admin.ModelAdmin):
    form = SliceForm
    list_display = ("key", "title", "mission", "milestone", "order", "status", "activated_at")
    list_filter = ("status", "mission")
    search_fields = ("key", "title", "mission__key", "milestone__key")
    list_select_related = ("mission", "milestone")
    date_hierarchy = "created_at"
    ordering = ("mission", "milestone__order", "order", "id")
    autocomplete_fields = ("milestone",)
    readonly_fields = ("mission_link", "milestone_link", "status", "activated_at", *TIMESTAMPS)
    fields = ("mission_link", ("milestone", "milestone_link"), "key", "title", "description", "order", "status",
              "activated_at", *TIMESTAMPS)
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


@admin.register(Feature)
class FeatureAdmin(RollupRefreshMixin, LinkDisplays, admin.ModelAdmin):
    form = FeatureForm
    list_display = ("key", "title", "mission", "slice", "status", "loop_state", "implementation_attempts",
                    "validator_attempts", "fix_rounds", "stop_reason", "updated_at")
    list_filter = ("status", "loop_state", "stop_reason", "mission")
    search_fields = ("key", "title", "description", "mission__key", "slice__key")
    list_select_related = ("mission", "slice")
    date_hierarchy = "created_at"
    ordering = ("mission", "slice__order", "order", "id")
    autocomplete_fields = ("slice",)
    readonly_fields = (
        "mission_link", "milestone_link", "slice_link", "status", "loop_state", "implementation_attempts",
        "validator_attempts", "fix_rounds", "last_run_link", "stop_reason", "stop_detail", "stopped_at",
        "generated_from_link", "generated_from_run_link", *TIMESTAMPS,
    )
    fieldsets = (
        (None, {"fields": ("mission_link", "milestone_link", ("slice", "slice_link"), "key", "title", "order")}),
        ("Specification", {"fields": ("description", "acceptance_criteria")}),
        ("Loop (changed by the loop only)", {"fields": (
            "status", "loop_state", "implementation_attempts", "validator_attempts", "fix_rounds", "last_run_link",
            "stop_reason", "stop_detail", "stopped_at",
        )}),
        ("Fix lineage", {"fields": ("generated_from_link", "generated_from_run_link")}),
        ("Record", {"fields": TIMESTAMPS}),
    )
    inlines = (FeatureAssertionInline, TaskInline)

    @admin.display(description="milestone")
    def milestone_link(self, obj):
        slice_ = related(obj, "slice")
        return admin_link(slice_.milestone) if slice_ else "-"

    @admin.display(description="last run")
    def last_run_link(self, obj):
        return admin_link(related(obj, "last_run"))

    @admin.display(description="generated from")
    def generated_from_link(self, obj):
        return admin_link(related(obj, "generated_from"))

    @admin.display(description="generated from run")
    def generated_from_run_link(self, obj):
        return admin_link(related(obj, "generated_from_run"))

    def has_delete_permission(self, request, obj=None):
        # DESIGN §3: a feature whose task is running is only deleted when forced (services).
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
class ContractAssertionAdmin(RollupRefreshMixin, LinkDisplays, admin.ModelAdmin):
    form = ContractAssertionForm
    list_display = ("key", "title", "mission", "milestone", "scope", "status", "order", "feature_count", "updated_at")
    list_filter = ("status", "scope", "mission")
    search_fields = ("key", "title", "statement", "mission__key", "milestone__key")
    list_select_related = ("mission", "milestone")
    date_hierarchy = "created_at"
    ordering = ("mission", "milestone__order", "order", "id")
    autocomplete_fields = ("milestone",)
    readonly_fields = ("mission_link", "milestone_link", "status", *TIMESTAMPS)
    fields = ("mission_link", ("milestone", "milestone_link"), "key", "title", "statement", "scope", "check_spec",
              "status", "order", *TIMESTAMPS)
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
        return not change or bool({"milestone", "scope"} & set(form.changed_data)) or formsets_changed(formsets)


@admin.register(FeatureAssertion)
class FeatureAssertionAdmin(RollupRefreshMixin, admin.ModelAdmin):
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

    @admin.display(description="feature", ordering="feature__key")
    def feature_link(self, obj):
        return admin_link(related(obj, "feature"))

    @admin.display(description="assertion", ordering="assertion__key")
    def assertion_link(self, obj):
        return admin_link(related(obj, "assertion"))

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


class TaskForm(forms.ModelForm):
    class Meta:
        model = Task
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        mission, feature = cleaned.get("mission"), cleaned.get("feature")
        if mission and feature and feature.mission_id != mission.pk:
            self.add_error("feature", "The feature belongs to another mission.")
        return cleaned


@admin.register(Task)
class TaskAdmin(LinkDisplays, admin.ModelAdmin):
    form = TaskForm
    list_display = ("id", "title", "mission", "feature", "status", "executor", "revision", "started_at", "finished_at")
    list_filter = ("status", "executor", "mission")
    search_fields = ("title", "prompt", "summary", "revision", "feature__key", "mission__key")
    list_select_related = ("mission", "feature")
    date_hierarchy = "created_at"
    ordering = ("-id",)
    autocomplete_fields = ("mission", "feature")
    readonly_fields = ("mission_link", "feature_link", "status", "revision", "started_at", "finished_at", *TIMESTAMPS)
    fieldsets = (
        (None, {"fields": (("mission", "mission_link"), ("feature", "feature_link"), "title", "prompt", "executor")}),
        ("Execution", {"fields": ("status", "revision", "started_at", "finished_at", "summary", "log")}),
        ("Record", {"fields": TIMESTAMPS}),
    )


@admin.register(MissionEvent)
class MissionEventAdmin(LinkDisplays, admin.ModelAdmin):
    """The audit log: append-only, written by missions.events only."""

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
