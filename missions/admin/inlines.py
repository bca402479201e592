"""Inlines of the hierarchy admin. Hierarchy inlines cannot delete rows: a delete goes
through the object's own delete page, which lists what cascades."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db import models

from missions.admin.forms import (
    AssertionChoiceFormSet,
    ContractAssertionForm,
    FeatureAssertionForm,
    FeatureChoiceFormSet,
    FeatureForm,
    MissionKeyInlineFormSet,
    SliceForm,
)
from missions.admin.helpers import admin_link, related
from missions.models import ContractAssertion, FeatureAssertion, Milestone, MissionFeature, Slice, Task


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
    model = MissionFeature
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
