"""Admin actions. Each calls the same service as the API and the CLI, reports what it
did (or why it was refused) as admin messages, and never lets an exception through.
Actions that need more than a click (a revision, a reason) ask on an intermediate page.

The loop actions on features (validate, repair, create fix, review) judge, so they live
on the floor above, in `validation.admin_features`, which asks with `ask` from here
(docs/ARCHITECTURE.md, "Floors")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from missions.admin.forms import ReasonForm, TaskCompleteForm
from missions.admin.helpers import each_action, run_each
from missions.models import Task
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


def _mission_action(name: str, description: str, done: str, service: Callable[..., Any], **options: Any):
    """A one-click action calling the lifecycle `service` for each selected mission."""
    return each_action(
        name,
        description,
        done=done,
        call=lambda request, m: _mission_note(service(mission=m, user=request.user, **options)),
    )


activate_missions = _mission_action(
    "activate_missions", "Activate selected missions", "Activated", lifecycle.mission_activate
)
pause_missions = _mission_action("pause_missions", "Pause selected missions", "Paused", lifecycle.mission_pause)
resume_missions = _mission_action(
    "resume_missions", "Resume selected missions (all-or-nothing)", "Resumed", lifecycle.mission_resume
)
autopilot_on = _mission_action(
    "autopilot_on",
    "Start the autopilot of selected missions",
    "Autopilot started",
    lifecycle.mission_set_autopilot,
    enabled=True,
)
autopilot_off = _mission_action(
    "autopilot_off",
    "Stop the autopilot of selected missions",
    "Autopilot stopped",
    lifecycle.mission_set_autopilot,
    enabled=False,
)

MISSION_ACTIONS = (activate_missions, pause_missions, resume_missions, autopilot_on, autopilot_off)


# --- tasks ---------------------------------------------------------------------------------


def _start_task(request, task: Task) -> str:
    return f"now {task_services.task_start(user=request.user, task=task).status}"


start_tasks = each_action("start_tasks", "Start selected tasks", done="Started", call=_start_task)


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
