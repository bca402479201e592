"""Mission lifecycle through the API: activate, pause, resume
(all-or-nothing), autopilot; what a paused mission does and does not do. The admin and
the CLI are covered in test_admin_actions.py and test_cli.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from missions.models import Mission, MissionEvent, MissionFeature, Slice, Task
from missions.services.lifecycle import mission_pause
from missions.services.tasks import task_complete, task_create
from tests.missions.loop_helpers import (
    add_slice,
    events,
    feature,
    implement,
    make_mission,
    open_task,
    wait_for,
)
from validation.models import RunStatus, ValidatorRun

LIFECYCLE = ("activate", "pause", "resume")
ALLOWED = {
    "activate": {"planning", "blocked"},
    "pause": {"active", "blocked"},
    "resume": {"paused", "blocked"},
}
RESULT = {"activate": "active", "pause": "paused", "resume": "active"}
NAMED = {"activate": "mission:activated", "pause": "mission:paused", "resume": "mission:resumed"}
ALL_STATUSES = ("planning", "active", "paused", "blocked", "complete", "archived")


@pytest.fixture
def mission(git_repo, owner):
    mission = make_mission(owner, git_repo.path)
    add_slice(mission, "m1", "s1", ["a", "b", "c", "d", "e"])
    return mission


def post(client, mission, action, body=None):
    return client.post(f"/api/missions/{mission.pk}/{action}/", body or {}, format="json")


def block(f: MissionFeature, reason: str, *, minutes_ago: int = 5) -> MissionFeature:
    MissionFeature.objects.filter(pk=f.pk).update(
        loop_state="blocked",
        status="blocked",
        stop_reason=reason,
        stop_detail=f"blocked by {reason}",
        stopped_at=timezone.now() - timedelta(minutes=minutes_ago),
    )
    f.refresh_from_db()
    return f


# --- the rules, through the API --------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("action", LIFECYCLE)
@pytest.mark.parametrize("status", ALL_STATUSES)
def test_lifecycle_transitions_follow_the_rules(api, owner, mission, action, status):
    Mission.objects.filter(pk=mission.pk).update(status=status)
    before = MissionEvent.objects.filter(mission=mission).count()
    response = post(api(owner), mission, action)
    mission.refresh_from_db()
    if status in ALLOWED[action]:
        assert response.status_code == 200, response.json()
        assert response.json()["status"] == RESULT[action] == mission.status
        event = events(mission)[-1]
        assert event.type == NAMED[action] and event.payload["from"] == status
        assert event.actor_id == owner.pk and event.payload["status"] == RESULT[action]
    else:
        assert response.status_code == 409, response.json()
        body = response.json()
        assert body["code"] == "illegal_mission_state" and status in body["detail"]
        assert mission.status == status
        assert MissionEvent.objects.filter(mission=mission).count() == before


@pytest.mark.django_db
def test_lifecycle_is_hidden_from_strangers(api, stranger, mission):
    for action in LIFECYCLE:
        assert post(api(stranger), mission, action).status_code == 404
    assert post(api(stranger), mission, "autopilot", {"enabled": True}).status_code == 404
    assert post(api(None), mission, "activate").status_code == 401
    mission.refresh_from_db()
    assert mission.status == "planning" and not mission.autopilot


@pytest.mark.django_db
def test_autopilot_switch_is_recorded_with_the_user(api, owner, mission):
    client = api(owner)
    response = post(client, mission, "autopilot", {"enabled": True})
    assert response.status_code == 200 and response.json()["autopilot"] is True
    response = post(client, mission, "autopilot", {"enabled": False})
    assert response.status_code == 200 and response.json()["autopilot"] is False
    changes = [(e.payload["enabled"], e.actor_id) for e in events(mission, "mission:autopilot")]
    assert changes[-2:] == [(True, owner.pk), (False, owner.pk)]
    bad = post(client, mission, "autopilot", {})
    assert bad.status_code == 400 and "enabled" in bad.json()["fields"]


# --- resume: all-or-nothing ------------------------------------------------------------------


@pytest.mark.django_db
def test_resume_conflict_lists_every_blocker_and_changes_nothing(api, owner, mission, counts):
    Mission.objects.filter(pk=mission.pk).update(status="paused")
    hard = {
        "a": block(feature(mission, "a"), "budget_exhausted", minutes_ago=30),
        "b": block(feature(mission, "b"), "validator_unavailable", minutes_ago=20),
        "c": block(feature(mission, "c"), "fingerprint_failures", minutes_ago=10),
    }
    operator_stopped = block(feature(mission, "d"), "operator")
    mission.refresh_from_db()
    before = counts()
    rows = {f.pk: (f.loop_state, f.stop_reason, f.stopped_at, f.updated_at) for f in MissionFeature.objects.all()}

    response = post(api(owner), mission, "resume")

    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "resume_conflict"
    blockers = sorted(body["blockers"], key=lambda b: b["feature"])
    assert [(b["feature"], b["reason"]) for b in blockers] == [
        (hard["a"].pk, "budget_exhausted"),
        (hard["b"].pk, "validator_unavailable"),
        (hard["c"].pk, "fingerprint_failures"),
    ]
    for b in blockers:
        f = MissionFeature.objects.get(pk=b["feature"])
        assert set(b) >= {"feature", "reason", "since"}
        assert b["since"] == f.stopped_at.isoformat()
    # nothing changed: not the mission, not the operator-stopped feature, no audit row
    assert counts() == before
    fresh = Mission.objects.get(pk=mission.pk)
    assert (fresh.status, fresh.updated_at, fresh.event_seq) == ("paused", mission.updated_at, mission.event_seq)
    assert {
        f.pk: (f.loop_state, f.stop_reason, f.stopped_at, f.updated_at) for f in MissionFeature.objects.all()
    } == rows
    assert MissionFeature.objects.get(pk=operator_stopped.pk).loop_state == "blocked"


@pytest.mark.django_db
def test_blocks_a_resume_can_clear_do_not_conflict(api, owner, mission):
    Mission.objects.filter(pk=mission.pk).update(status="paused")
    stopped = block(feature(mission, "a"), "operator")
    judged = block(feature(mission, "b"), "validator_blocked")  # the validator's verdict: not the mission's to clear
    response = post(api(owner), mission, "resume")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "active"
    stopped.refresh_from_db()
    judged.refresh_from_db()
    assert (stopped.loop_state, stopped.stop_reason, stopped.stopped_at) == ("implementing", "", None)
    assert (judged.loop_state, judged.stop_reason) == ("blocked", "validator_blocked")
    rearm = [e for e in events(mission, "feature:updated") if e.payload.get("cause") == "resume"]
    assert [(e.payload["feature"], e.payload["from"], e.payload["loop_state"], e.actor_id) for e in rearm] == [
        (stopped.pk, "blocked", "implementing", owner.pk)
    ]
    resumed = events(mission, "mission:resumed")[-1]
    assert resumed.actor_id == owner.pk
    assert rearm[0].seq < resumed.seq


@pytest.mark.django_db
def test_resume_after_the_blocker_is_repaired(api, owner, mission):
    Mission.objects.filter(pk=mission.pk).update(status="paused")
    blocked = block(feature(mission, "a"), "budget_exhausted")
    client = api(owner)
    assert post(client, mission, "resume").status_code == 409
    repaired = client.post(
        f"/api/features/{blocked.pk}/repair/", {"mode": "clear", "reason": "new approach"}, format="json"
    )
    assert repaired.status_code == 200, repaired.json()
    assert post(client, mission, "resume").status_code == 200
    mission.refresh_from_db()
    assert mission.status == "active"


# --- a paused mission -----------------------------------------------------------------------


@pytest.mark.django_db
def test_paused_mission_validates_nothing_and_starts_no_task(api, owner, mission, git_repo):
    client = api(owner)
    assert post(client, mission, "activate").status_code == 200
    a = feature(mission, "a")
    task = task_create(user=owner, feature=a)
    b = block(feature(mission, "b"), "validator_blocked")
    assert post(client, mission, "pause").status_code == 200
    refused = [
        client.post(f"/api/features/{a.pk}/validate/", {}, format="json"),
        client.post(f"/api/features/{b.pk}/repair/", {"mode": "re_run"}, format="json"),
        client.post(f"/api/tasks/{task.pk}/start/"),
    ]
    for response in refused:
        assert response.status_code == 409 and response.json()["code"] == "mission_not_active", response.json()
    assert not ValidatorRun.objects.exists()
    assert Task.objects.get(pk=task.pk).status == "todo"


@pytest.mark.django_db
def test_command_executor_does_not_start_tasks_of_a_paused_mission(api, owner, mission):
    Mission.objects.filter(pk=mission.pk).update(status="paused", executor="command", executor_command="true")
    response = api(owner).post("/api/tasks/", {"feature": feature(mission, "a").pk}, format="json")
    assert response.status_code == 201
    assert response.json()["status"] == "todo" and response.json()["started_at"] is None


@pytest.mark.django_db(transaction=True)
def test_task_completed_while_paused_is_recorded_and_redriven_after_resume(worker, api, owner, mission, git_repo):
    from validation.services.recovery import recover

    client = api(owner)
    assert post(client, mission, "activate").status_code == 200
    a = feature(mission, "a")
    task = task_create(user=owner, feature=a)
    assert post(client, mission, "pause").status_code == 200

    response = client.post(f"/api/tasks/{task.pk}/complete/", {"revision": implement(git_repo, "a")}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "done"
    worker.drain()

    assert not ValidatorRun.objects.exists()
    a.refresh_from_db()
    assert a.loop_state == "implementing"
    warnings = [e for e in events(mission, "task:updated") if "warning" in e.payload]
    assert len(warnings) == 1 and "paused" in warnings[0].payload["warning"]
    assert warnings[0].payload["task"] == task.pk

    assert post(client, mission, "resume").status_code == 200
    recover()
    worker.drain()
    a.refresh_from_db()
    run = ValidatorRun.objects.get(feature=a)
    assert run.status == RunStatus.PASSED and run.revision == Task.objects.get(pk=task.pk).revision
    assert a.loop_state == "passed"
    assert recover()["implementing"] == []  # idempotent: nothing left to re-drive


@pytest.mark.django_db(transaction=True)
def test_run_in_flight_when_pausing_finishes_and_is_recorded(worker, api, owner, git_repo):
    """The autopilot's first slice is validating (a slow check) when the mission is
    paused: the run finishes and is recorded; the next slice is not started until resume."""
    mission = make_mission(owner, git_repo.path, autopilot=True)
    slow = {"run": 'python -c "import time; time.sleep(1.5)"', "timeout": 30}
    add_slice(mission, "m1", "s1", ["a"], extra_check=slow)
    add_slice(mission, "m1", "s2", ["b"], slice_order=1)
    client = api(owner)
    assert post(client, mission, "activate").status_code == 200
    worker.drain()
    a, b = feature(mission, "a"), feature(mission, "b")
    task = open_task(a)
    assert task is not None and open_task(b) is None

    task_complete(user=owner, task=task, revision=implement(git_repo, "a"))
    wait_for(
        lambda: ValidatorRun.objects.filter(feature=a, lease_until__isnull=False).exists(), message="the run to start"
    )
    assert post(client, mission, "pause").status_code == 200
    paused_at = events(mission, "mission:paused")[-1].seq
    worker.drain()

    run = ValidatorRun.objects.get(feature=a)
    assert run.status == RunStatus.PASSED
    a.refresh_from_db()
    assert a.loop_state == "passed"
    completed = [e for e in events(mission, "validator-run:completed") if e.payload["run"] == run.pk]
    assert len(completed) == 1 and completed[0].seq > paused_at
    mission.refresh_from_db()
    assert mission.status == "paused"
    assert Slice.objects.get(mission=mission, key="s2").status == "pending"
    assert not b.tasks.exists()

    assert post(client, mission, "resume").status_code == 200
    worker.drain()
    assert Slice.objects.get(mission=mission, key="s2").status == "active"
    assert open_task(b) is not None


@pytest.mark.django_db(transaction=True)
def test_pause_inside_the_admission_transaction_lets_the_run_finish(worker, owner, mission, git_repo):
    """A run admitted in the same transaction that pauses the mission is still judged."""
    from validation.services.operator import feature_validate

    Mission.objects.filter(pk=mission.pk).update(status="active")
    mission.refresh_from_db()
    a = feature(mission, "a")
    implement(git_repo, "a")  # no task: the operator validates the workspace's HEAD
    with transaction.atomic():
        admission = feature_validate(feature=a, user=owner)
        mission_pause(mission=mission, user=owner)
    worker.drain()
    run = ValidatorRun.objects.get(pk=admission.run.pk)
    assert run.status == RunStatus.PASSED
    a.refresh_from_db()
    assert a.loop_state == "passed"
