"""The feature admin with the loop's operator actions: validate now, repair (clear or
re-run the validation), create a fix feature for the last failure, and the advisory
review; and the milestone admin with "Validate milestone". Each calls the same operator
service as the API and the CLI.

The model admins themselves are `missions.admin.features.FeatureAdmin` and
`missions.admin.hierarchy.MilestoneAdmin`; these actions judge, so they live on this floor
(missions never import validation: docs/ARCHITECTURE.md, "Floors"). Imported by
`validation.admin`, which Django's admin autodiscovery loads after `missions.admin`
(`validation` comes after `missions` in INSTALLED_APPS): the plain admins are
unregistered and these subclasses registered in their place.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from missions.admin.actions import ask
from missions.admin.features import FeatureAdmin
from missions.admin.forms import ReasonForm
from missions.admin.helpers import each_action, run_each
from missions.admin.hierarchy import MilestoneAdmin
from missions.errors import DomainError
from missions.models import Milestone, MissionFeature
from validation.review.create import feature_review
from validation.services.operator import feature_create_fix, feature_repair, feature_validate, milestone_validate


def _admission_note(admission) -> str:
    if admission is None:
        return "back to implementing, counters reset"
    if admission.run is not None and admission.outcome == "started":
        return f"validation run {admission.run.pk} started"
    if admission.outcome == "reused":
        return f"identical input passed before; reused as run {admission.run.pk}"
    if admission.run is not None and admission.outcome == "already_running":
        return f"validation run {admission.run.pk} is running"
    return f"{admission.outcome}: {admission.detail}" if admission.detail else admission.outcome


def _validate(request, feature: MissionFeature) -> str:
    return _admission_note(feature_validate(feature=feature, user=request.user))


validate_features = each_action(
    "validate_features", "Validate selected features now", done="Validation requested", call=_validate
)


def _repair(mode: str, title: str, intro: str):
    def action(modeladmin, request, queryset):
        def apply(data):
            run_each(
                modeladmin,
                request,
                queryset,
                done=f"Repaired ({mode})",
                fn=lambda f: _admission_note(
                    feature_repair(feature=f, user=request.user, mode=mode, reason=data["reason"])
                ),
            )

        return ask(
            modeladmin,
            request,
            queryset,
            form_class=ReasonForm,
            title=title,
            intro=intro,
            button=f"Repair ({mode})",
            apply=apply,
        )

    action.__name__ = f"repair_{mode}"
    return admin.action(description=title, permissions=["change"])(action)


repair_clear = _repair(
    "clear",
    "Repair selected features: clear",
    "Each feature goes back to implementing with its attempt counters and fix rounds reset.",
)
repair_re_run = _repair(
    "re_run",
    "Repair selected features: re-run the validation",
    "A new validation run starts now for each feature, even on an input that failed before.",
)


def _create_fix(request, feature: MissionFeature) -> str:
    return f"fix {feature_create_fix(feature=feature, user=request.user).key}"


create_fix = each_action(
    "create_fix", "Create a fix feature for the last failure", done="Fix created", call=_create_fix
)


@admin.action(description="Review the change (advisory, several blind reviewers)")
def review_features(modeladmin, request, queryset):
    """One advisory review per selected feature. A feature that cannot be reviewed (nothing
    to review against, no profile, a bad revision) is reported in the message and does not
    stop the others."""
    started, problems = [], []
    for feature in queryset.select_related("mission"):
        try:
            preflight = feature_review(feature=feature, user=request.user, source="admin")
        except DomainError as exc:
            problems.append(f"{feature.mission.key}/{feature.key}: {exc.detail}")
            continue
        review = preflight.review
        url = reverse("admin:validation_review_change", args=[review.pk])
        started.append((url, f"review {review.pk}", f"{feature.mission.key}/{feature.key}"))
    if started:
        links = format_html_join(", ", '<a href="{}">{}</a> ({})', started)
        modeladmin.message_user(request, format_html("Reviews requested: {}", links), messages.SUCCESS)
    for problem in problems:
        modeladmin.message_user(request, f"Not reviewed: {problem}", messages.WARNING)


FEATURE_ACTIONS = (validate_features, repair_clear, repair_re_run, create_fix, review_features)


class LoopFeatureAdmin(FeatureAdmin):
    """`FeatureAdmin` with the loop's operator actions."""

    actions = (*FeatureAdmin.actions, *FEATURE_ACTIONS)


admin.site.unregister(MissionFeature)
admin.site.register(MissionFeature, LoopFeatureAdmin)


def _validate_milestone(request, milestone: Milestone) -> str:
    step = milestone_validate(milestone_id=milestone.pk, actor_id=request.user.pk)
    return step.detail if step.outcome == "complete" else _admission_note(step)


validate_milestones = each_action(
    "validate_milestones", "Validate milestone", done="Milestone validation requested", call=_validate_milestone
)


class LoopMilestoneAdmin(MilestoneAdmin):
    """`MilestoneAdmin` with the milestone's validation."""

    actions = (*MilestoneAdmin.actions, validate_milestones)


admin.site.unregister(Milestone)
admin.site.register(Milestone, LoopMilestoneAdmin)
