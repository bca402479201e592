"""Admin actions. Each calls the same service as the API and the CLI, reports what it
did (or why it was refused) as admin messages, and never lets an exception through.
Actions that need more than a click (a revision, a reason) ask on an intermediate page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from missions.admin.forms import ReasonForm, TaskCompleteForm
from missions.admin.helpers import run_each
from missions.services import lifecycle
from missions.services import tasks as task_services


def ask(
    modeladmin,
    request,
    queryset,
    *,
    form_class,
    title: str,
    intro: str,
    button: str,
    apply: Callable[[dict[str, Any]], Any],
) -> TemplateResponse | None:
    """Show `form_class` for the selected objects; on a valid submit call `apply` with
    the cleaned data and go back to the changelist."""
    submitted = "apply" in request.POST
    form = form_class(request.POST if submitted else None)
    if submitted and form.is_valid():
        apply(form.cleaned_data)
        return None
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "intro": intro,
        "button": button,
        "form": form,
        "objects": list(queryset),
        "opts": opts,
        "action": request.POST.get("action", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "media": modeladmin.media + form.media,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, "admin/missions/action_form.html", context)


# --- missions ------------------------------------------------------------------------------


def _mission_note(mission) -> str:
    return f"now {mission.status}, autopilot {'on' if mission.autopilot else 'off'}"


@admin.action(description="Activate selected missions", permissions=["change"])
def activate_missions(modeladmin, request, queryset):
    run_each(
        modeladmin,
        request,
        queryset,
        done="Activated",
        fn=lambda m: _mission_note(lifecycle.mission_activate(mission=m, user=request.user)),
    )


@admin.action(description="Pause selected missions", permissions=["change"])
def pause_missions(modeladmin, request, queryset):
    run_each(
        modeladmin,
        request,
        queryset,
        done="Paused",
        fn=lambda m: _mission_note(lifecycle.mission_pause(mission=m, user=request.user)),
    )


@admin.action(description="Resume selected missions (all-or-nothing)", permissions=["change"])
def resume_missions(modeladmin, request, queryset):
    run_each(
        modeladmin,
        request,
        queryset,
        done="Resumed",
        fn=lambda m: _mission_note(lifecycle.mission_resume(mission=m, user=request.user)),
    )


@admin.action(description="Start the autopilot of selected missions", permissions=["change"])
def autopilot_on(modeladmin, request, queryset):
    run_each(
        modeladmin,
        request,
        queryset,
        done="Autopilot started",
        fn=lambda m: _mission_note(lifecycle.mission_set_autopilot(mission=m, user=request.user, enabled=True)),
    )


@admin.action(description="Stop the autopilot of selected missions", permissions=["change"])
def autopilot_off(modeladmin, request, queryset):
    run_each(
        modeladmin,
        request,
        queryset,
        done="Autopilot stopped",
        fn=lambda m: _mission_note(lifecycle.mission_set_autopilot(mission=m, user=request.user, enabled=False)),
    )


MISSION_ACTIONS = (activate_missions, pause_missions, resume_missions, autopilot_on, autopilot_off)


# --- features ------------------------------------------------------------------------------


def _admission_note(admission) -> str:
    if admission is None:
        return "back to implementing, counters reset"
    if admission.run is not None and admission.outcome == "started":
        return f"validation run {admission.run.pk} started"
    if admission.outcome == "reused":
        return f"identical input passed before; reused as run {admission.run.pk}"
    return f"{admission.outcome}: {admission.detail}" if admission.detail else admission.outcome


@admin.action(description="Validate selected features now", permissions=["change"])
def validate_features(modeladmin, request, queryset):
    from validation.services.operator import feature_validate

    run_each(
        modeladmin,
        request,
        queryset,
        done="Validation requested",
        fn=lambda f: _admission_note(feature_validate(feature=f, user=request.user)),
    )


def _repair(mode: str, title: str, intro: str):
    def action(modeladmin, request, queryset):
        from validation.services.operator import feature_repair

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


@admin.action(description="Create a fix feature for the last failure", permissions=["change"])
def create_fix(modeladmin, request, queryset):
    from validation.services.operator import feature_create_fix

    run_each(
        modeladmin,
        request,
        queryset,
        done="Fix created",
        fn=lambda f: f"fix {feature_create_fix(feature=f, user=request.user).key}",
    )


from validation.review.admin_actions import review_features  # noqa: E402 (the advisory review lives in validation)

FEATURE_ACTIONS = (validate_features, repair_clear, repair_re_run, create_fix, review_features)


# --- tasks ---------------------------------------------------------------------------------


@admin.action(description="Start selected tasks", permissions=["change"])
def start_tasks(modeladmin, request, queryset):
    run_each(
        modeladmin,
        request,
        queryset,
        done="Started",
        fn=lambda t: f"now {task_services.task_start(user=request.user, task=t).status}",
    )


@admin.action(description="Complete selected tasks (asks for the revision)", permissions=["change"])
def complete_tasks(modeladmin, request, queryset):
    def apply(data):
        def complete(task):
            done = task_services.task_complete(
                user=request.user, task=task, revision=data["revision"], summary=data["summary"]
            )
            named = f" ({done.revision_name})" if done.revision_name not in ("", done.revision) else ""
            return f"at {done.revision[:12]}{named}"

        run_each(modeladmin, request, queryset, done="Completed; validation queued", fn=complete)

    return ask(
        modeladmin,
        request,
        queryset,
        form_class=TaskCompleteForm,
        title="Complete tasks",
        intro="Record the revision each task landed; its feature is then validated at that revision.",
        button="Complete",
        apply=apply,
    )


@admin.action(description="Fail selected tasks", permissions=["change"])
def fail_tasks(modeladmin, request, queryset):
    def apply(data):
        reason = data["reason"] or f"failed by {request.user.get_username()} in the admin"
        run_each(
            modeladmin,
            request,
            queryset,
            done="Failed",
            fn=lambda t: f"now {task_services.task_fail(user=request.user, task=t, reason=reason).status}",
        )

    return ask(
        modeladmin,
        request,
        queryset,
        form_class=ReasonForm,
        title="Fail tasks",
        intro="The tasks end as failed; their features are not validated.",
        button="Fail",
        apply=apply,
    )


TASK_ACTIONS = (start_tasks, complete_tasks, fail_tasks)
