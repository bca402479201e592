"""Rendering helpers (also used by validation.admin), the rollup refresh that admin
edits trigger, and the runner that admin actions use to call services."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib import admin, messages
from django.db import models, transaction
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join

from missions.errors import DomainError
from missions.locks import lock_mission
from missions.models import FeatureAssertion, Milestone, Mission, MissionFeature, Slice
from missions.services.rollup import milestone_rollup_refresh
from missions.transitions.progress import feature_placed, milestone_inputs_changed, milestone_placed, slice_placed

logger = logging.getLogger(__name__)

_M = TypeVar("_M", bound=models.Model)

if TYPE_CHECKING:
    # The mixins below extend ModelAdmin methods (super().save_model(), self.model, ...);
    # at run time they stay plain classes in front of admin.ModelAdmin in each admin's bases.
    _ModelAdminBase = admin.ModelAdmin[Any]
else:
    _ModelAdminBase = object

TIMESTAMPS = ("created_at", "updated_at")


# --- rendering -----------------------------------------------------------------------------


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


def related(obj: models.Model, name: str) -> Any:
    """`obj.<name>` for a foreign key, None while it is unset (unsaved add forms). Typed
    Any: the model it returns depends on `name`."""
    if getattr(obj, f"{name}_id", None) is None:
        return None
    return getattr(obj, name)


def pretty_json(value: Any) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)


def preformatted(text: str) -> str:
    """Escaped, preformatted text (logs); "-" when empty."""
    if not text:
        return "-"
    return format_html('<pre style="white-space: pre-wrap; max-height: 40em; overflow: auto">{}</pre>', text)


def short_sha(value: str) -> str:
    return value[:12] if value else "-"


def link_display(name: str, description: str | None = None, *, ordering: str | None = None) -> Callable:
    """A read-only admin display linking to the object of the foreign key `name` (one
    method for every "<name>_link" of a model admin or inline); works on unsaved objects."""

    @admin.display(description=description or name.replace("_", " "), ordering=ordering)
    def display(self, obj):
        return admin_link(related(obj, name))

    display.__name__ = f"{name}_link"
    return display


class LinkDisplays:
    """Read-only links to the usual parents; each works on unsaved objects too."""

    mission_link = link_display("mission", ordering="mission__key")
    milestone_link = link_display("milestone", ordering="milestone__key")
    slice_link = link_display("slice", ordering="slice__key")
    feature_link = link_display("feature", ordering="feature__key")


class SaveChangedFieldsMixin(_ModelAdminBase):
    """An admin edit writes the fields its form changed (and `updated_at`), never the
    state columns that the loop or a worker may have written since the page loaded the row."""

    def save_model(self, request, obj, form, change):
        if not change:
            return super().save_model(request, obj, form, change)
        concrete = {f.name for f in obj._meta.concrete_fields if not f.primary_key}
        fields = [name for name in form.changed_data if name in concrete]
        if "updated_at" in concrete:
            fields.append("updated_at")
        obj.save(update_fields=fields)
        return None


# --- the plan's writes --------------------------------------------------------------------


def mission_of(obj: models.Model) -> int | None:
    if isinstance(obj, Mission):
        return obj.pk
    if isinstance(obj, FeatureAssertion):
        return obj.feature.mission_id if obj.feature_id else None
    return getattr(obj, "mission_id", None)


def _place_of(obj: models.Model | None) -> Any:
    """Where a stored slice (its milestone) or feature (its slice and milestone) is."""
    if isinstance(obj, Slice):
        return obj.milestone_id
    if isinstance(obj, MissionFeature):
        return (obj.slice_id, obj.slice.milestone_id)
    return None


def _placed(obj: models.Model, *, was: Any) -> None:
    """New (`was` None) or moved work: what the services report (`missions.transitions.progress`)."""
    if isinstance(obj, Milestone) and was is None:
        milestone_placed(mission_id=obj.mission_id, milestone_id=obj.pk)
    elif isinstance(obj, Slice):
        slice_placed(mission_id=obj.mission_id, slice_id=obj.pk, milestone_id=obj.milestone_id, was=was)
    elif isinstance(obj, MissionFeature):
        feature_placed(
            mission_id=obj.mission_id,
            feature_id=obj.pk,
            slice_id=obj.slice_id,
            milestone_id=obj.slice.milestone_id,
            was=was,
        )


class PlanWriteMixin(_ModelAdminBase):
    """An admin write of the plan does what the services do (`missions.services.hierarchy`):
    the mission's row lock before any row of it (the lock order of every step of the loop),
    and new or moved work (a milestone, slice or feature, also added inline) reopens every
    complete node above it. Put it first in the bases: its lock comes before what the
    other mixins read and write."""

    mission_path = "mission_id"  # how a queryset of the model names its mission

    def save_model(self, request, obj, form, change):
        mission_id = mission_of(obj)
        if mission_id is not None:
            lock_mission(mission_id)
        obj._admin_was = _place_of(type(obj)._default_manager.filter(pk=obj.pk).first()) if change else None
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        obj = form.instance
        if not change or obj._admin_was is not None:
            _placed(obj, was=obj._admin_was)
        for formset in formsets:
            for new in formset.new_objects:
                _placed(new, was=None)

    def delete_model(self, request, obj):
        mission_id = mission_of(obj)
        if mission_id is not None:
            lock_mission(mission_id)
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for mission_id in sorted(set(queryset.values_list(self.mission_path, flat=True))):
                lock_mission(mission_id)
            super().delete_queryset(request, queryset)


# --- rollup --------------------------------------------------------------------------------


def refresh_rollups(milestone_ids: Iterable[int | None]) -> None:
    """An admin write changed what these milestones are judged by: new rollups, and a
    complete milestone is complete no more (docs/TRUTH.md)."""
    ids = {pk for pk in milestone_ids if pk is not None}
    if ids:
        milestone_rollup_refresh(milestone_ids=ids)
        milestone_inputs_changed(milestone_ids=ids, cause="admin_edit")


def linked_milestone_ids(**link_filter: Any) -> set[int]:
    """Milestones of the assertions reached by the FeatureAssertion rows matching the filter."""
    return set(FeatureAssertion.objects.filter(**link_filter).values_list("assertion__milestone_id", flat=True))


def formsets_changed(formsets: Iterable[Any], model: type[models.Model] | None = None) -> bool:
    return any(
        fs.new_objects or fs.changed_objects or fs.deleted_objects
        for fs in formsets
        if model is None or fs.model is model
    )


class RollupRefreshMixin(_ModelAdminBase):
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


# --- actions -------------------------------------------------------------------------------


def error_message(obj: models.Model, exc: DomainError) -> str:
    """The refusal of a service as the admin shows it; a resume conflict lists its blockers."""
    blockers = exc.extra.get("blockers") if isinstance(exc.extra, dict) else None
    if not blockers:
        return format_html("{}: {}", obj, exc.detail)
    items = format_html_join(
        "",
        "<li>feature {} (id {}): {} since {}</li>",
        ((b.get("key", "?"), b.get("feature"), b.get("reason"), b.get("since") or "unknown") for b in blockers),
    )
    return format_html("{}: {}<ul>{}</ul>", obj, exc.detail, items)


def run_each(modeladmin, request, queryset: Iterable[_M], fn: Callable[[_M], str | None], *, done: str) -> list[_M]:
    """Call `fn` (a service call) for every object; refusals become error messages, one
    success message lists what worked, each success is written to the admin history.
    Never lets an exception reach the changelist."""
    succeeded: list[str] = []
    changed: list[_M] = []
    for obj in queryset:
        try:
            note = fn(obj)
        except DomainError as exc:
            messages.error(request, error_message(obj, exc))
            continue
        except Exception as exc:  # noqa: BLE001 — the admin reports it; the log keeps the trace
            logger.exception("admin action on %s failed", obj)
            messages.error(request, f"{obj}: unexpected error: {exc.__class__.__name__}: {exc}")
            continue
        succeeded.append(f"{obj} ({note})" if note else str(obj))
        changed.append(obj)
        modeladmin.log_change(request, obj, f"{done}" + (f": {note}" if note else ""))
    if succeeded:
        messages.success(request, f"{done}: {', '.join(succeeded)}")
    return changed


def each_action(name: str, description: str, *, done: str, call: Callable[[Any, _M], str | None]):
    """A one-click admin action named `name`: `call(request, obj)` (a service call that
    returns a note) for every selected object, through `run_each`."""

    def action(modeladmin, request, queryset):
        run_each(modeladmin, request, queryset, done=done, fn=lambda obj: call(request, obj))

    action.__name__ = name
    return admin.action(description=description, permissions=["change"])(action)
