"""Model forms and inline formsets of the hierarchy admin, and the forms admin actions ask
for before they act (a task's revision, an operator's reason)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ObjectDoesNotExist
from django.db import models
from django.forms.models import BaseInlineFormSet

from fusion_site.repos.sources import SourceRefused, check_credentials_env, check_repository
from missions.admin.helpers import related
from missions.checks_spec import pattern_problems
from missions.environment_spec import environment_problems
from missions.errors import DomainError, Invalid
from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionFeature,
    Slice,
    Task,
    TaskStatus,
)
from missions.services.hierarchy import _check_dependencies
from missions.services.verdict_settings import allowed_validators_problems, settle_mission_fields

# The fields whose rules need more than the field itself (`settle_mission_fields`).
SETTLED_FIELDS = (
    "repository",
    "credentials_env",
    "branch",
    "base_revision",
    "protected_paths",
    "validator",
    "allowed_validators",
    "environment",
)


ENVIRONMENT_HELP = (
    'A JSON mapping, e.g. {"preset": "python", "setup": ["pip install -r requirements.txt"]}: '
    "built once per key and mounted read-only into every check (docs/ENVIRONMENTS.md)."
)


def _environment(value: Any, *, empty: dict | None) -> Any:
    if value in (None, ""):  # an emptied field: none (a mission), the mission's (a milestone)
        return empty
    if problems := environment_problems(value):
        raise forms.ValidationError(problems)
    return value


def mission_id_of(parent: models.Model | None) -> int | None:
    """The mission a child of `parent` (a mission, milestone or slice) belongs to."""
    if isinstance(parent, Mission):
        return parent.pk
    if isinstance(parent, Slice):
        return parent.milestone.mission_id if parent.milestone_id else parent.mission_id
    return getattr(parent, "mission_id", None)


# The forms take every field of their model; the ModelAdmin decides what is shown and read-only.
class MissionForm(forms.ModelForm):
    class Meta:
        model = Mission
        fields = "__all__"
        help_texts = {
            "protected_paths": 'A JSON list of glob patterns, e.g. ["tests/**"]: restored to their '
            "base revision content before any check runs; each must match a file at the base.",
            "base_revision": "A branch, a tag or a commit id: pinned to its commit id when saved "
            "(shown as the base commit), and moved only when you change it here.",
            "allowed_validators": 'A JSON list of validator profile names, e.g. ["checks"]: besides '
            "the validator, the only profiles that may judge this mission.",
            "environment": ENVIRONMENT_HELP,
        }

    # Who is saving (`MissionAdmin.get_form`); the admin site lets staff in only.
    user: Any = None
    # What `settle_mission_fields` pinned (`base_commit`), for `MissionAdmin.save_model`.
    settled: dict[str, Any]

    def clean_repository(self):
        value = self.cleaned_data.get("repository") or ""
        if self.instance.pk and value == self.instance.repository:
            return value  # unchanged: not judged again (as in the API)
        try:
            # The admin site lets staff in only (`AdminSite.has_permission`): local paths are theirs to name.
            return check_repository(value, staff=True)
        except SourceRefused as exc:
            raise forms.ValidationError(str(exc), code="repository_refused") from exc

    def clean_credentials_env(self):
        try:
            return check_credentials_env(self.cleaned_data.get("credentials_env") or "")
        except SourceRefused as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean_protected_paths(self):
        value = self.cleaned_data.get("protected_paths")
        if value in (None, ""):  # an emptied field protects nothing
            return []
        problems = pattern_problems(value)
        if problems:
            raise forms.ValidationError(problems)
        return value

    def clean_environment(self):
        return _environment(self.cleaned_data.get("environment"), empty={})

    def clean_allowed_validators(self):
        value = self.cleaned_data.get("allowed_validators")
        if value in (None, ""):
            return []
        problems = allowed_validators_problems(value)
        if problems:
            raise forms.ValidationError(problems)
        return value

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data  # what ModelForm.clean() returns
        self.settled = {}
        base = cleaned.get("base_revision", self.instance.base_revision)
        if cleaned.get("protected_paths") and not (base or "").strip():
            self.add_error("base_revision", "Set a base revision: protected paths are restored from it.")
        if self.errors:
            return cleaned
        judged = {name: cleaned[name] for name in SETTLED_FIELDS if name in cleaned}
        try:  # the rules every writer applies (the base pinned, credentials, who picks validators)
            self.settled = settle_mission_fields(
                mission=self.instance if self.instance.pk else None, fields=judged, user=self.user
            )
        except DomainError as exc:
            named: list[str | None] = [name for name in exc.fields if name in self.fields]
            for name in named or [None]:
                self.add_error(name, exc.detail)
        return cleaned


class MissionScopedForm(forms.ModelForm):
    """For models whose `mission` is derived from a parent in save().

    The derived `mission` is not a form field, so Django skips the (mission, key) unique
    constraint; check it here, and refuse moves to another mission (children and links
    carry the mission too).
    """

    parent_field = ""

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data  # what ModelForm.clean() returns
        instance = self.instance
        parent = cleaned.get(self.parent_field) or related(instance, self.parent_field)
        mission_id = mission_id_of(parent)
        if mission_id is None:
            return cleaned
        if instance.pk and instance.mission_id != mission_id:
            self.add_error(self.parent_field, "Cannot move to another mission.")
        key = cleaned.get("key")
        # When `mission` is a form field Django checks the constraint itself.
        if (
            key
            and "mission" not in self.fields
            and (type(instance).objects.filter(mission_id=mission_id, key=key).exclude(pk=instance.pk).exists())
        ):
            self.add_error("key", "This key is already used in the mission.")
        return cleaned


class MilestoneForm(MissionScopedForm):
    parent_field = "mission"

    class Meta:
        model = Milestone
        fields = "__all__"
        help_texts = {"environment": "Empty: the mission's environment. " + ENVIRONMENT_HELP}

    def clean_environment(self):
        return _environment(self.cleaned_data.get("environment"), empty=None)

    def clean(self) -> dict[str, Any]:
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
        model = MissionFeature
        fields = "__all__"


class ContractAssertionForm(MissionScopedForm):
    parent_field = "milestone"

    class Meta:
        model = ContractAssertion
        fields = "__all__"

    def clean(self) -> dict[str, Any]:
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
            super()._post_clean()  # type: ignore[misc]  # private ModelForm hook the stubs omit
        except ObjectDoesNotExist:
            if not self.errors:  # cleaning is under way: this is the form's `_errors`, no re-clean
                raise


class TaskForm(forms.ModelForm):
    class Meta:
        model = Task
        fields = "__all__"

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data  # what ModelForm.clean() returns
        mission, feature = cleaned.get("mission"), cleaned.get("feature")
        if mission and feature and feature.mission_id != mission.pk:
            self.add_error("feature", "The feature belongs to another mission.")
        if (
            self.instance.pk is None
            and feature is not None
            and (feature.tasks.filter(status__in=[TaskStatus.TODO, TaskStatus.IN_PROGRESS]).exists())
        ):
            self.add_error("feature", "The feature already has an open task.")
        return cleaned


# --- inline formsets -----------------------------------------------------------------------


class MissionKeyInlineFormSet(BaseInlineFormSet):
    """Refuses the same key twice within one submit (see MissionScopedForm)."""

    def clean(self):
        super().clean()
        seen: set[str | None] = set()
        for form in self.forms:
            # _should_delete_form: private BaseFormSet API the stubs omit.
            if not hasattr(form, "cleaned_data") or self._should_delete_form(form):  # type: ignore[attr-defined]
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
        if isinstance(self.instance, MissionFeature) and self.instance.slice_id:
            parent_mission = self.instance.slice.mission_id
        elif isinstance(self.instance, ContractAssertion) and self.instance.milestone_id:
            parent_mission = self.instance.milestone.mission_id
        if field is not None and parent_mission is not None:
            field.queryset = field.queryset.filter(mission_id=parent_mission)


class AssertionChoiceFormSet(MissionLinkInlineFormSet):
    other_field = "assertion"


class FeatureChoiceFormSet(MissionLinkInlineFormSet):
    other_field = "feature"


# --- what admin actions ask for ------------------------------------------------------------


class TaskCompleteForm(forms.Form):
    revision = forms.CharField(
        max_length=200,
        help_text="The commit the task landed (a sha or a ref of the workspace); a ref is pinned to its commit id now.",
    )
    summary = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text="What was done; the validator sees it.",
    )

    def clean_revision(self):
        value = self.cleaned_data["revision"].strip()
        if not value:
            raise forms.ValidationError("A completed task needs the revision it landed.")
        return value


class ReasonForm(forms.Form):
    reason = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Why: recorded in the mission's audit log with your name.",
    )
