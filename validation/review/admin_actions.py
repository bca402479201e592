"""The admin's "Review" action on features: one advisory review per selected feature.

Wired in `validation.admin_features.LoopFeatureAdmin` (the feature admin's actions). A feature
that cannot be reviewed (nothing to review against, no profile, a bad revision) is
reported in the message and does not stop the others.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from missions.errors import DomainError
from validation.review.feature import feature_review


@admin.action(description="Review the change (advisory, several blind reviewers)")
def review_features(modeladmin, request, queryset):
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
