"""The operator commands: `mission`, `task` and `repair_feature` — what they print, what
they change, and their exit codes (0 done, 1 refused by the rules, 2 unknown object)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import ManagementUtility, call_command
from django.core.management.base import CommandError
from django.utils import timezone

from missions.models import Mission, MissionEvent, MissionFeature, Task
from missions.services.tasks import task_create
from tests.missions.loop_helpers import add_slice, feature, implement, make_mission
from validation.models import ValidatorRun

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refused(*args: str) -> tuple[CommandError, str]:
    err = io.StringIO()
    with pytest.raises(CommandError) as info:
        call_command(*args, stdout=io.StringIO(), stderr=err)
    return info.value, err.getvalue()


@pytest.fixture
def mission(owner, git_repo):
    mission = make_mission(owner, git_repo.path)
    add_slice(mission, "m1", "s1", ["a", "b"])
    return mission


def block(f: MissionFeature, reason: str) -> MissionFeature:
    MissionFeature.objects.filter(pk=f.pk).update(
        loop_state="blocked", status="blocked", stop_reason=reason, stopped_at=timezone.now() - timedelta(minutes=7)
    )
    f.refresh_from_db()
    return f


# --- mission -----------------------------------------------------------------------------------


def test_mission_lifecycle_by_key_and_by_id(mission, owner):
    out, _ = run("mission", "activate", "life", "--user", owner.username)
    assert out.strip() == f"mission life (id {mission.pk}): active, autopilot off"
    out, _ = run("mission", "autopilot-on", str(mission.pk))
    assert "active, autopilot on" in out
    out, _ = run("mission", "pause", "life")
    assert "paused, autopilot on" in out
    out, _ = run("mission", "resume", str(mission.pk))
    assert "active, autopilot on" in out
    out, _ = run("mission", "autopilot-off", "life")
    assert "active, autopilot off" in out
    mission.refresh_from_db()
    assert (mission.status, mission.autopilot) == ("active", False)
    changes = [
        (e.type, e.payload.get("enabled"), e.actor_id)
        for e in MissionEvent.objects.filter(mission=mission, type__startswith="mission:").order_by("seq")
    ]
    assert changes == [
        ("mission:activated", None, owner.pk),
        ("mission:autopilot", True, None),
        ("mission:paused", None, None),
        ("mission:resumed", None, None),
        ("mission:autopilot", False, None),
    ]


@pytest.mark.parametrize(
    ("status", "action"),
    [("active", "activate"), ("planning", "pause"), ("active", "resume"), ("complete", "activate")],
)
def test_illegal_lifecycle_change_exits_1(mission, status, action):
    Mission.objects.filter(pk=mission.pk).update(status=status)
    error, _ = refused("mission", action, "life")
    assert error.returncode == 1
    assert f"cannot {action} mission life" in str(error) and "illegal_mission_state" in str(error)
    assert Mission.objects.get(pk=mission.pk).status == status


def test_resume_conflict_prints_every_blocker_and_changes_nothing(mission, counts):
    Mission.objects.filter(pk=mission.pk).update(status="paused")
    a = block(feature(mission, "a"), "budget_exhausted")
    b = block(feature(mission, "b"), "validator_unavailable")
    before = counts()
    error, err = refused("mission", "resume", "life")
    assert error.returncode == 1 and "resume_conflict" in str(error)
    lines = [line for line in err.splitlines() if "blocker" in line]
    assert len(lines) == 2
    assert f"feature a (id {a.pk}): budget_exhausted since {a.stopped_at.isoformat()}" in lines[0]
    assert f"feature b (id {b.pk}): validator_unavailable" in lines[1]
    assert "repair_feature" in lines[0]
    assert counts() == before and Mission.objects.get(pk=mission.pk).status == "paused"


def test_mission_status_shows_the_blockers(mission):
    block(feature(mission, "a"), "fingerprint_failures")
    out, _ = run("mission", "status", "life")
    assert out.startswith("mission life") and "planning" in out and "feature a" in out and "fingerprint_failures" in out


def test_unknown_mission_or_user_exits_2(mission):
    error, _ = refused("mission", "activate", "nope")
    assert error.returncode == 2 and "no mission with key or id 'nope'" in str(error)
    error, _ = refused("mission", "activate", "life", "--user", "ghost")
    assert error.returncode == 2 and "no user 'ghost'" in str(error)
    assert Mission.objects.get(pk=mission.pk).status == "planning"


def test_exit_codes_from_the_command_line(mission, capsys, monkeypatch):
    # run_from_argv closes the connections when it ends; the test's transaction needs its own
    monkeypatch.setattr("django.core.management.base.connections.close_all", lambda: None)
    Mission.objects.filter(pk=mission.pk).update(status="paused")
    block(feature(mission, "a"), "budget_exhausted")
    for argv, code in (
        (["mission", "resume", "life"], 1),
        (["mission", "pause", "missing"], 2),
        (["mission", "explode", "life"], 2),
    ):
        with pytest.raises(SystemExit) as info:
            ManagementUtility(["manage.py", *argv]).execute()
        assert info.value.code == code, argv
    err = capsys.readouterr().err
    assert "budget_exhausted" in err and "cannot resume mission life" in err
    assert "no mission with key or id 'missing'" in err and "invalid choice: 'explode'" in err
    ManagementUtility(["manage.py", "mission", "status", "life"]).execute()  # 0: returns normally


# --- task --------------------------------------------------------------------------------------


def test_task_create_start_complete(mission, owner, git_repo):
    Mission.objects.filter(pk=mission.pk).update(status="active")
    out, _ = run("task", "create", "life/a", "--title", "Write a", "--user", owner.username)
    task = Task.objects.get(feature__key="a")
    assert out.strip() == f"task {task.pk} for life/a: todo"
    assert task.title == "Write a" and "VAL-a" in task.prompt
    assert feature(mission, "a").loop_state == "implementing"
    out, _ = run("task", "start", str(task.pk))
    assert out.strip() == f"task {task.pk} for life/a: in_progress"
    revision = implement(git_repo, "a")
    out, _ = run("task", "complete", str(task.pk), "--revision", revision, "--summary", "wrote it")
    assert out.strip() == f"task {task.pk} for life/a: done at {revision}; validation queued"
    task.refresh_from_db()
    assert (task.status, task.revision, task.summary) == ("done", revision, "wrote it")


def test_task_create_with_a_prompt_file(mission, tmp_path):
    prompt = tmp_path / "prompt.md"
    prompt.write_text("Do exactly this.\n")
    run("task", "create", str(feature(mission, "b").pk), "--prompt-file", str(prompt))
    assert Task.objects.get(feature__key="b").prompt == "Do exactly this.\n"
    error, _ = refused("task", "create", "life/a", "--prompt-file", str(tmp_path / "missing.md"))
    assert error.returncode == 2


def test_task_refusals_and_unknowns(mission):
    task = task_create(user=None, feature=feature(mission, "a"))
    error, _ = refused("task", "start", str(task.pk))  # the mission is planning
    assert error.returncode == 1 and "mission_not_active" in str(error)
    error, _ = refused("task", "create", "life/a")  # already an open task
    assert error.returncode == 1 and "task_open" in str(error)
    error, _ = refused("task", "complete", "999", "--revision", "abc")
    assert error.returncode == 2 and "no task" in str(error)
    error, _ = refused("task", "create", "life/zzz")
    assert error.returncode == 2
    error, _ = refused("task", "complete", str(task.pk), "--revision", " ")
    assert error.returncode == 1 and "revision" in str(error)


def test_task_fail_and_log(mission):
    task = Task.objects.create(
        mission=mission, feature=feature(mission, "a"), title="t", status="in_progress", log="line 1\nline 2\n"
    )
    out, _ = run("task", "log", str(task.pk))
    assert out == "line 1\nline 2\n"
    out, _ = run("task", "fail", str(task.pk), "--reason", "gave up")
    assert out.strip() == f"task {task.pk} for life/a: failed"
    task.refresh_from_db()
    assert (task.status, task.summary) == ("failed", "gave up")
    error, _ = refused("task", "fail", str(task.pk))
    assert error.returncode == 1 and "illegal_task_state" in str(error)


# --- repair_feature ------------------------------------------------------------------------------


def test_repair_clear(mission, owner):
    a = block(feature(mission, "a"), "budget_exhausted")
    out, _ = run(
        "repair_feature", "life/a", "--mode", "clear", "--reason", "rewrote the spec", "--user", owner.username
    )
    assert out.strip() == "feature life/a: implementing; attempts and fix rounds reset"
    a.refresh_from_db()
    assert (a.loop_state, a.stop_reason) == ("implementing", "")
    event = MissionEvent.objects.get(type="feature:updated", payload__cause="clear")
    assert event.actor_id == owner.pk and event.payload["reason"] == "rewrote the spec"


def test_repair_re_run(mission, git_repo):
    Mission.objects.filter(pk=mission.pk).update(status="active")
    implement(git_repo, "a")
    a = block(feature(mission, "a"), "fingerprint_failures")
    out, _ = run("repair_feature", str(a.pk), "--mode", "re_run", "--reason", "the check was flaky")
    run_ = ValidatorRun.objects.get(feature=a)
    assert out.strip() == f"feature life/a: validating; validation run {run_.pk} started"


def test_repair_re_run_records_the_reason(mission, git_repo, owner):
    """leaving `blocked` is recorded with who and why — for a re-run too."""
    Mission.objects.filter(pk=mission.pk).update(status="active")
    implement(git_repo, "a")
    block(feature(mission, "a"), "fingerprint_failures")
    run("repair_feature", "life/a", "--mode", "re_run", "--reason", "the check was flaky", "--user", owner.username)
    recorded = [
        e for e in MissionEvent.objects.filter(mission=mission, actor=owner) if "the check was flaky" in str(e.payload)
    ]
    assert recorded, [(e.type, e.payload) for e in MissionEvent.objects.filter(mission=mission).order_by("seq")]


def test_repair_refusals_and_unknowns(mission):
    error, _ = refused("repair_feature", "life/a", "--mode", "clear", "--reason", "x")
    assert error.returncode == 1 and "not_repairable" in str(error)
    block(feature(mission, "a"), "budget_exhausted")
    error, _ = refused("repair_feature", "life/a", "--mode", "re_run", "--reason", "x")  # the mission is planning
    assert error.returncode == 1 and "mission_not_active" in str(error)
    error, _ = refused("repair_feature", "life/nope", "--mode", "clear", "--reason", "x")
    assert error.returncode == 2
    with pytest.raises(CommandError):
        call_command("repair_feature", "life/a", "--mode", "clear", stdout=io.StringIO(), stderr=io.StringIO())
