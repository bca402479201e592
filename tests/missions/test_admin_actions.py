"""Admin actions: each calls the service, reports success or the refusal as an
admin message and never crashes; intermediate pages ask for what an action needs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from missions.models import Mission, MissionEvent, MissionFeature, Task
from missions.services.tasks import task_create
from tests.missions.loop_helpers import add_slice, feature, implement, make_mission
from validation.models import FixLineage, RunStatus, ValidatorFailure, ValidatorRun

pytestmark = pytest.mark.django_db


def changelist(model: str) -> str:
    return reverse(f"admin:missions_{model}_changelist")


def act(client, model: str, action: str, objs, **extra):
    data = {"action": action, ACTION_CHECKBOX_NAME: [o.pk for o in objs], **extra}
    return client.post(changelist(model), data, follow=True)


def messages_of(response) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in response.context["messages"]]


def assert_message(response, level: str, *parts: str) -> None:
    found = [text for tag, text in messages_of(response) if tag == level]
    assert any(all(p in text for p in parts) for text in found), messages_of(response)


@pytest.fixture
def mission(admin_user, git_repo):
    mission = make_mission(admin_user, git_repo.path)
    add_slice(mission, "m1", "s1", ["a", "b"])
    return mission


def block(f: MissionFeature, reason: str) -> MissionFeature:
    MissionFeature.objects.filter(pk=f.pk).update(
        loop_state="blocked", status="blocked", stop_reason=reason, stopped_at=timezone.now() - timedelta(minutes=3)
    )
    f.refresh_from_db()
    return f


# --- missions ----------------------------------------------------------------------------------


def test_mission_lifecycle_actions(admin_client, admin_user, mission):
    steps = [
        ("activate_missions", "Activated", "active", False, "mission:activated"),
        ("autopilot_on", "Autopilot started", "active", True, "mission:autopilot"),
        ("pause_missions", "Paused", "paused", True, "mission:paused"),
        ("resume_missions", "Resumed", "active", True, "mission:resumed"),
        ("autopilot_off", "Autopilot stopped", "active", False, "mission:autopilot"),
    ]
    for action, done, status, autopilot, named in steps:
        response = act(admin_client, "mission", action, [mission])
        assert response.status_code == 200
        assert_message(response, "success", done, mission.key)
        mission.refresh_from_db()
        assert (mission.status, mission.autopilot) == (status, autopilot), action
        event = MissionEvent.objects.filter(mission=mission).order_by("-seq").first()
        assert event.type == named and event.actor_id == admin_user.pk
    assert LogEntry.objects.filter(object_id=str(mission.pk)).count() == len(steps)


def test_a_refused_action_is_an_error_message(admin_client, admin_user, mission, git_repo):
    other = make_mission(admin_user, git_repo.path, key="other", status="active")
    response = act(admin_client, "mission", "activate_missions", [mission, other])
    assert response.status_code == 200
    assert_message(response, "success", "Activated", "life")
    assert_message(response, "error", "other", "cannot be activated")
    other.refresh_from_db()
    assert other.status == "active"
    response = act(admin_client, "mission", "resume_missions", [mission])
    assert_message(response, "error", "cannot be resumed")


def test_resume_conflict_shows_the_blockers_and_changes_nothing(admin_client, mission, counts):
    Mission.objects.filter(pk=mission.pk).update(status="paused")
    a = block(feature(mission, "a"), "budget_exhausted")
    b = block(feature(mission, "b"), "operator")
    before = counts()
    response = act(admin_client, "mission", "resume_missions", [mission])
    assert response.status_code == 200
    assert_message(response, "error", "repair them first", "feature a", "budget_exhausted", "since")
    assert not [m for m in messages_of(response) if m[0] == "success"]
    assert counts() == before
    mission.refresh_from_db()
    b.refresh_from_db()
    assert mission.status == "paused" and b.loop_state == "blocked"
    # the change page says what blocks a resume, with a link to the feature
    body = admin_client.get(reverse("admin:missions_mission_change", args=[mission.pk])).content.decode()
    assert "blocks a resume" in body.lower() and reverse("admin:missions_missionfeature_change", args=[a.pk]) in body
    assert "budget_exhausted" in body


# --- tasks -------------------------------------------------------------------------------------


def test_start_task(admin_client, mission):
    Mission.objects.filter(pk=mission.pk).update(status="active")
    task = task_create(user=None, feature=feature(mission, "a"))
    response = act(admin_client, "task", "start_tasks", [task])
    assert_message(response, "success", "Started", "in_progress")
    task.refresh_from_db()
    assert task.status == "in_progress" and task.started_at is not None


def test_start_task_of_a_paused_mission_is_refused(admin_client, mission):
    Mission.objects.filter(pk=mission.pk).update(status="paused")
    task = task_create(user=None, feature=feature(mission, "a"))
    response = act(admin_client, "task", "start_tasks", [task])
    assert_message(response, "error", "not active")
    assert Task.objects.get(pk=task.pk).status == "todo"


def test_complete_task_asks_for_the_revision(admin_client, admin_user, mission, git_repo):
    Mission.objects.filter(pk=mission.pk).update(status="active")
    task = task_create(user=None, feature=feature(mission, "a"))
    page = act(admin_client, "task", "complete_tasks", [task])
    assert page.status_code == 200
    assert "admin/missions/action_form.html" in [t.name for t in page.templates]
    body = page.content.decode()
    assert 'name="revision"' in body and 'name="summary"' in body and str(task) in body
    assert Task.objects.get(pk=task.pk).status == "todo"

    blank = act(admin_client, "task", "complete_tasks", [task], apply="Complete", revision="  ")
    assert blank.status_code == 200 and "revision" in blank.context["form"].errors
    assert Task.objects.get(pk=task.pk).status == "todo"

    revision = implement(git_repo, "a")
    done = act(
        admin_client, "task", "complete_tasks", [task], apply="Complete", revision=revision, summary="wrote a.txt"
    )
    assert_message(done, "success", "Completed", revision[:12])
    task.refresh_from_db()
    assert (task.status, task.revision, task.summary) == ("done", revision, "wrote a.txt")
    event = MissionEvent.objects.filter(type="task:updated", payload__change="completed").get()
    assert event.actor_id == admin_user.pk


def test_complete_a_failed_task_is_refused(admin_client, mission):
    task = Task.objects.create(mission=mission, feature=feature(mission, "a"), title="t", status="failed")
    response = act(admin_client, "task", "complete_tasks", [task], apply="Complete", revision="abc")
    assert_message(response, "error", "cannot be completed")
    assert Task.objects.get(pk=task.pk).status == "failed"


def test_fail_task(admin_client, mission):
    Mission.objects.filter(pk=mission.pk).update(status="active")
    first = task_create(user=None, feature=feature(mission, "a"))
    second = task_create(user=None, feature=feature(mission, "b"))
    assert act(admin_client, "task", "fail_tasks", [first]).status_code == 200  # the form
    act(admin_client, "task", "fail_tasks", [first], apply="Fail", reason="wrong approach")
    act(admin_client, "task", "fail_tasks", [second], apply="Fail", reason="")
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.summary) == ("failed", "wrong approach")
    assert second.status == "failed" and "admin" in second.summary


def test_task_log_is_shown_read_only_and_preformatted(admin_client, mission):
    task = Task.objects.create(
        mission=mission,
        feature=feature(mission, "a"),
        title="t",
        status="done",
        log="step 1\n<b>bold?</b>\nstep 3",
        summary="ok",
    )
    response = admin_client.get(reverse("admin:missions_task_change", args=[task.pk]))
    body = response.content.decode()
    assert "<pre" in body and "step 1\n&lt;b&gt;bold?&lt;/b&gt;\nstep 3" in body and "<b>bold?</b>" not in body
    form = response.context["adminform"].form
    assert not {"log", "summary", "executor", "status", "revision"} & set(form.fields)


def test_task_added_in_the_admin_goes_through_the_service(admin_client, mission):
    Mission.objects.filter(pk=mission.pk).update(executor="command", executor_command="true")
    a = feature(mission, "a")
    response = admin_client.post(
        reverse("admin:missions_task_add"),
        {"mission": mission.pk, "feature": a.pk, "title": "Do a", "prompt": "write a.txt"},
    )
    assert response.status_code == 302
    task = Task.objects.get(feature=a)
    a.refresh_from_db()
    assert (task.title, task.executor, task.status) == ("Do a", "command", "todo")  # planning: not started
    assert (a.loop_state, a.implementation_attempts) == ("implementing", 1)
    again = admin_client.post(
        reverse("admin:missions_task_add"), {"mission": mission.pk, "feature": a.pk, "title": "x"}
    )
    assert again.status_code == 200 and "already has an open task" in again.content.decode()


def test_editing_a_task_does_not_overwrite_its_state(admin_client, mission):
    task = Task.objects.create(mission=mission, feature=feature(mission, "a"), title="t", status="in_progress")
    url = reverse("admin:missions_task_change", args=[task.pk])
    admin_client.get(url)
    Task.objects.filter(pk=task.pk).update(status="done", revision="abc123")  # the executor finished meanwhile
    response = admin_client.post(
        url, {"mission": mission.pk, "feature": task.feature_id, "title": "renamed", "prompt": ""}
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert (task.title, task.status, task.revision) == ("renamed", "done", "abc123")


# --- features ----------------------------------------------------------------------------------


def test_validate_feature(admin_client, admin_user, mission, git_repo):
    Mission.objects.filter(pk=mission.pk).update(status="active")
    implement(git_repo, "a")
    a = feature(mission, "a")
    response = act(admin_client, "missionfeature", "validate_features", [a])
    run = ValidatorRun.objects.get(feature=a)
    assert_message(response, "success", "Validation requested", f"validation run {run.pk} started")
    assert run.status == RunStatus.RUNNING and run.requested_by_id == admin_user.pk
    again = act(admin_client, "missionfeature", "validate_features", [a])
    assert_message(again, "error", "already running")


def test_validate_feature_of_a_paused_mission_is_refused(admin_client, mission):
    Mission.objects.filter(pk=mission.pk).update(status="paused")
    response = act(admin_client, "missionfeature", "validate_features", [feature(mission, "a")])
    assert_message(response, "error", "activate or resume it first")
    assert not ValidatorRun.objects.exists()


def test_repair_clear_asks_why_and_records_it(admin_client, admin_user, mission):
    a = block(feature(mission, "a"), "budget_exhausted")
    page = act(admin_client, "missionfeature", "repair_clear", [a])
    assert page.status_code == 200 and 'name="reason"' in page.content.decode()
    assert MissionFeature.objects.get(pk=a.pk).loop_state == "blocked"
    response = act(admin_client, "missionfeature", "repair_clear", [a], apply="Repair", reason="new approach")
    assert_message(response, "success", "Repaired (clear)", "counters reset")
    a.refresh_from_db()
    assert (a.loop_state, a.stop_reason, a.fix_rounds) == ("implementing", "", 0)
    event = MissionEvent.objects.filter(type="feature:updated", payload__cause="clear").get()
    assert event.actor_id == admin_user.pk and event.payload["reason"] == "new approach"


def test_repair_re_run_starts_a_run(admin_client, mission, git_repo):
    Mission.objects.filter(pk=mission.pk).update(status="active")
    implement(git_repo, "a")
    a = block(feature(mission, "a"), "fingerprint_failures")
    response = act(admin_client, "missionfeature", "repair_re_run", [a], apply="Repair", reason="the check was flaky")
    run = ValidatorRun.objects.get(feature=a)
    assert_message(response, "success", "Repaired (re_run)", f"run {run.pk} started")
    a.refresh_from_db()
    assert a.loop_state == "validating" and a.last_run_id == run.pk


def test_repair_of_an_idle_feature_is_refused(admin_client, mission):
    response = act(admin_client, "missionfeature", "repair_clear", [feature(mission, "a")], apply="Repair", reason="")
    assert_message(response, "error", "needs no repair")


def test_create_fix_for_a_report_only_failure(admin_client, mission):
    Mission.objects.filter(pk=mission.pk).update(status="active", auto_fix=False)
    a = feature(mission, "a")
    run = ValidatorRun.objects.create(
        mission=mission, feature=a, milestone=a.slice.milestone, status="failed", revision="abc", validator="checks"
    )
    ValidatorFailure.objects.create(
        run=run,
        feature=a,
        assertion=a.assertions.get(),
        assertion_key="VAL-a",
        message="a.txt is missing",
        expected="done a",
        actual="nothing",
    )
    MissionFeature.objects.filter(pk=a.pk).update(loop_state="needs_fix", last_run=run)
    response = act(admin_client, "missionfeature", "create_fix", [a])
    fix = MissionFeature.objects.get(generated_from=a)
    assert_message(response, "success", "Fix created", fix.key)
    assert FixLineage.objects.filter(source=a, fix=fix, run=run).exists()
    again = act(admin_client, "missionfeature", "create_fix", [MissionFeature.objects.get(pk=a.pk)])
    assert [tag for tag, _ in messages_of(again)] == ["error"]
    assert MissionFeature.objects.filter(generated_from=a).count() == 1


def test_actions_need_the_change_permission(client, mission, django_user_model):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_mission"))
    client.force_login(viewer)
    response = act(client, "mission", "activate_missions", [mission])
    assert response.status_code == 200
    mission.refresh_from_db()
    assert mission.status == "planning"
