"""The autopilot on a real worker: strictly serial slices,
milestone dependencies, harmless duplicate triggers, a stop at a blocked feature that
says why, and continuing after a repair."""

from __future__ import annotations

import threading

import pytest
from django.db import close_old_connections

from missions.models import Milestone, Mission, Slice, Task
from missions.services.tasks import task_complete
from tests.missions.loop_helpers import (
    activated_slices,
    add_slice,
    assert_serial_history,
    events,
    feature,
    implement,
    make_mission,
    open_task,
    python_command,
)
from validation.models import RunScope, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)


def slice_statuses(mission: Mission) -> dict[str, str]:
    return dict(Slice.objects.filter(mission=mission).values_list("key", "status"))


def assert_one_active_slice_at_most(mission: Mission) -> None:
    active = [k for k, s in slice_statuses(mission).items() if s == "active"]
    assert len(active) <= 1, f"two active slices: {active}"


def complete(owner, repo, mission, key: str, *, good: bool = True) -> None:
    task = open_task(feature(mission, key))
    assert task is not None, f"no open task for {key}"
    task_complete(user=owner, task=task, revision=implement(repo, key, good=good))


def test_slices_advance_strictly_in_order(worker, api, owner, git_repo):
    mission = make_mission(owner, git_repo.path, autopilot=True)
    add_slice(mission, "m1", "s1", ["a", "b"], milestone_order=1)
    add_slice(mission, "m1", "s2", ["c"], slice_order=1)
    add_slice(mission, "m2", "s3", ["d"], milestone_order=2)
    assert api(owner).post(f"/api/missions/{mission.pk}/activate/").status_code == 200
    worker.drain()
    assert slice_statuses(mission) == {"s1": "active", "s2": "pending", "s3": "pending"}
    assert open_task(feature(mission, "a")) and open_task(feature(mission, "b"))
    assert not Task.objects.filter(feature__key__in=["c", "d"]).exists()

    # b first, then a: s2 waits for every feature of s1
    complete(owner, git_repo, mission, "b")
    worker.drain()
    assert_one_active_slice_at_most(mission)
    assert slice_statuses(mission) == {"s1": "active", "s2": "pending", "s3": "pending"}
    assert not Task.objects.filter(feature__key="c").exists()

    complete(owner, git_repo, mission, "a")
    worker.drain()
    assert_one_active_slice_at_most(mission)
    assert slice_statuses(mission) == {"s1": "complete", "s2": "active", "s3": "pending"}

    complete(owner, git_repo, mission, "c")
    worker.drain()
    assert_one_active_slice_at_most(mission)
    # m1 completes only after its milestone run passed; then m2 starts
    assert Milestone.objects.get(mission=mission, key="m1").status == "complete"
    milestone_runs = ValidatorRun.objects.filter(mission=mission, scope=RunScope.MILESTONE, milestone__key="m1")
    assert list(milestone_runs.values_list("status", flat=True)) == ["passed"]
    assert slice_statuses(mission) == {"s1": "complete", "s2": "complete", "s3": "active"}

    complete(owner, git_repo, mission, "d")
    worker.drain()
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    assert activated_slices(mission) == ["s1", "s2", "s3"]
    assert_serial_history(mission)
    # m2 started only after m1 completed
    seqs = {e.payload.get("milestone"): e.seq for e in events(mission, "milestone:completed")}
    s3_activated = next(e.seq for e in events(mission, "slice:activated") if e.payload["key"] == "s3")
    assert seqs[Milestone.objects.get(mission=mission, key="m1").pk] < s3_activated


IMPLEMENTER = """
import os, pathlib
key = os.environ["FUSION_FEATURE_KEY"].split("-fix-")[0]
pathlib.Path(key + ".txt").write_text("done " + key + "\\n")
"""


def test_a_self_running_mission_never_has_two_active_slices(worker, owner, git_repo, tmp_path):
    script = tmp_path / "impl.py"
    script.write_text(IMPLEMENTER)
    mission = make_mission(
        owner, git_repo.path, autopilot=True, executor="command", executor_command=python_command(script)
    )
    add_slice(mission, "m1", "s1", ["a", "b", "c"], milestone_order=1)
    add_slice(mission, "m1", "s2", ["d", "e"], slice_order=1)
    add_slice(mission, "m2", "s3", ["f"], milestone_order=2)
    add_slice(mission, "m2", "s4", ["g"], slice_order=1)
    from missions.services.lifecycle import mission_activate

    mission_activate(mission=mission, user=owner)
    worker.drain(timeout=120)
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    assert activated_slices(mission) == ["s1", "s2", "s3", "s4"]
    assert_serial_history(mission)
    # tasks of a slice started only after the slice was activated
    activation = {e.payload["slice"]: e.seq for e in events(mission, "slice:activated")}
    for e in events(mission, "task:updated"):
        if e.payload.get("change") == "created":
            task = Task.objects.get(pk=e.payload["task"])
            assert e.seq > activation[task.feature.slice_id]


def test_a_milestone_waits_for_its_dependencies(worker, owner, git_repo):
    mission = make_mission(owner, git_repo.path, autopilot=True)
    add_slice(mission, "m1", "s1", ["a"], milestone_order=1)
    add_slice(mission, "m2", "s2", ["b"], milestone_order=2)
    m1, m2 = Milestone.objects.get(mission=mission, key="m1"), Milestone.objects.get(mission=mission, key="m2")
    m2.dependencies.add(m1)
    from missions.services.lifecycle import mission_activate

    mission_activate(mission=mission, user=owner)
    worker.drain()
    complete(owner, git_repo, mission, "a")
    worker.drain()
    complete(owner, git_repo, mission, "b")
    worker.drain()
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    m1_done = next(e.seq for e in events(mission, "milestone:completed"))
    s2_activated = next(e.seq for e in events(mission, "slice:activated") if e.payload["key"] == "s2")
    assert m1_done < s2_activated


def test_a_milestone_ordered_first_waits_for_a_later_dependency(worker, owner, git_repo):
    """m1 comes first in the plan but depends on m2: the autopilot runs m2 first, then m1."""
    mission = make_mission(owner, git_repo.path, autopilot=True)
    add_slice(mission, "m1", "s1", ["a"], milestone_order=1)
    add_slice(mission, "m2", "s2", ["b"], milestone_order=2)
    m1, m2 = Milestone.objects.get(mission=mission, key="m1"), Milestone.objects.get(mission=mission, key="m2")
    m1.dependencies.add(m2)
    from missions.services.lifecycle import mission_activate

    mission_activate(mission=mission, user=owner)
    worker.drain()
    assert slice_statuses(mission) == {"s1": "pending", "s2": "active"}, Mission.objects.get(
        pk=mission.pk
    ).status_reason
    complete(owner, git_repo, mission, "b")
    worker.drain()
    assert Milestone.objects.get(pk=m2.pk).status == "complete"
    assert slice_statuses(mission) == {"s1": "active", "s2": "complete"}
    complete(owner, git_repo, mission, "a")
    worker.drain()
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    assert activated_slices(mission) == ["s2", "s1"]


def test_five_concurrent_triggers_activate_once(worker, owner, git_repo):
    from validation.actors import autopilot_advance

    mission = make_mission(owner, git_repo.path, status="active", autopilot=True)  # no trigger sent yet
    add_slice(mission, "m1", "s1", ["a", "b"])
    add_slice(mission, "m1", "s2", ["c"], slice_order=1)
    for _ in range(5):
        autopilot_advance.send(mission.pk)
    worker.drain()
    assert activated_slices(mission) == ["s1"]
    assert slice_statuses(mission) == {"s1": "active", "s2": "pending"}
    assert Task.objects.filter(mission=mission).count() == 2
    assert sorted(Task.objects.values_list("feature__key", flat=True)) == ["a", "b"]


def test_concurrent_service_calls_activate_once(owner, git_repo):
    from validation.services.autopilot import autopilot_advance

    mission = make_mission(owner, git_repo.path, status="active", autopilot=True)
    add_slice(mission, "m1", "s1", ["a"])
    add_slice(mission, "m1", "s2", ["b"], slice_order=1)
    barrier = threading.Barrier(5)
    results, errors = [], []

    def call():
        try:
            barrier.wait()
            results.append(autopilot_advance(mission_id=mission.pk))
        except Exception as exc:  # noqa: BLE001 — reported below
            errors.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=call) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(results) == ["activated"] + ["waiting"] * 4
    assert activated_slices(mission) == ["s1"]
    assert Task.objects.filter(mission=mission).count() == 1


def test_the_recovery_sweep_redrives_the_autopilot(worker, owner, git_repo):
    from validation.services.recovery import recover

    mission = make_mission(owner, git_repo.path, status="active", autopilot=True)  # its trigger was lost
    add_slice(mission, "m1", "s1", ["a"])
    assert recover()["autopilot"] == [mission.pk]
    worker.drain()
    assert activated_slices(mission) == ["s1"]
    assert open_task(feature(mission, "a")) is not None


def test_a_mission_file_creating_an_active_mission_starts_its_autopilot(worker, owner, git_repo):
    from missions.services.files import mission_import

    document = {
        "mission": {"key": "born", "title": "Born", "status": "active", "autopilot": True},
        "milestones": [
            {
                "key": "m1",
                "title": "M1",
                "slices": [{"key": "s1", "title": "S1", "features": [{"key": "a", "title": "A"}]}],
            }
        ],
    }
    document["mission"]["repository"] = str(git_repo.path)
    mission, _ = mission_import(document=document, user=None, owner=owner)
    worker.drain()
    assert activated_slices(mission) == ["s1"]
    assert open_task(feature(mission, "a")) is not None


def test_turning_the_autopilot_off_holds_the_next_slice(worker, api, owner, git_repo):
    mission = make_mission(owner, git_repo.path, autopilot=True)
    add_slice(mission, "m1", "s1", ["a"])
    add_slice(mission, "m1", "s2", ["b"], slice_order=1)
    client = api(owner)
    client.post(f"/api/missions/{mission.pk}/activate/")
    worker.drain()
    assert client.post(f"/api/missions/{mission.pk}/autopilot/", {"enabled": False}, format="json").status_code == 200
    complete(owner, git_repo, mission, "a")
    worker.drain()
    assert feature(mission, "a").loop_state == "passed"
    assert slice_statuses(mission) == {"s1": "active", "s2": "pending"}
    assert client.post(f"/api/missions/{mission.pk}/autopilot/", {"enabled": True}, format="json").status_code == 200
    worker.drain()
    assert slice_statuses(mission) == {"s1": "complete", "s2": "active"}
    assert open_task(feature(mission, "b")) is not None


# --- a blocked feature stops the autopilot; a repair lets it continue --------------------------


def _blocked_by_budget(worker, api, owner, git_repo, **mission_fields):
    mission = make_mission(owner, git_repo.path, autopilot=True, retry_budget=0, **mission_fields)
    add_slice(mission, "m1", "s1", ["a"])
    add_slice(mission, "m1", "s2", ["b"], slice_order=1)
    api(owner).post(f"/api/missions/{mission.pk}/activate/")
    worker.drain()
    return mission


def _assert_stopped_at(mission: Mission, key: str) -> None:
    a = feature(mission, key)
    assert (a.loop_state, a.stop_reason) == ("blocked", "budget_exhausted")
    mission.refresh_from_db()
    assert mission.status == "active"
    assert key in mission.status_reason and "blocked" in mission.status_reason
    stops = events(mission, "mission:halted")
    assert stops and key in stops[-1].payload["reason"] and "budget_exhausted" in stops[-1].payload["reason"]
    assert slice_statuses(mission) == {"s1": "active", "s2": "pending"}
    assert not feature(mission, "b").tasks.exists()


def test_the_autopilot_stops_at_a_blocked_feature_and_continues_after_a_repair(worker, api, owner, git_repo):
    mission = _blocked_by_budget(worker, api, owner, git_repo)
    complete(owner, git_repo, mission, "a", good=False)
    worker.drain()
    _assert_stopped_at(mission, "a")
    stops = len(events(mission, "mission:halted"))
    # more outcomes do not repeat the stop
    from validation.actors import autopilot_advance

    autopilot_advance.send(mission.pk)
    worker.drain()
    assert len(events(mission, "mission:halted")) == stops

    client = api(owner)
    a = feature(mission, "a")
    response = client.post(f"/api/features/{a.pk}/repair/", {"mode": "clear", "reason": "try again"}, format="json")
    assert response.status_code == 200 and response.json()["loop_state"] == "implementing"
    worker.drain()
    # the new task: the autopilot's, or else one made by hand
    if open_task(a) is None:
        assert client.post("/api/tasks/", {"feature": a.pk}, format="json").status_code == 201
    complete(owner, git_repo, mission, "a")
    worker.drain()
    assert feature(mission, "a").loop_state == "passed"
    assert slice_statuses(mission) == {"s1": "complete", "s2": "active"}
    assert open_task(feature(mission, "b")) is not None
    complete(owner, git_repo, mission, "b")
    worker.drain()
    mission.refresh_from_db()
    assert mission.status == "complete"
    assert_serial_history(mission)


def test_the_stop_reason_is_cleared_when_the_autopilot_continues(worker, api, owner, git_repo):
    mission = _blocked_by_budget(worker, api, owner, git_repo)
    complete(owner, git_repo, mission, "a", good=False)
    worker.drain()
    _assert_stopped_at(mission, "a")
    a = feature(mission, "a")
    api(owner).post(f"/api/features/{a.pk}/repair/", {"mode": "clear", "reason": "try again"}, format="json")
    worker.drain()
    if open_task(a) is None:
        api(owner).post("/api/tasks/", {"feature": a.pk}, format="json")
    complete(owner, git_repo, mission, "a")
    worker.drain()
    assert slice_statuses(mission) == {"s1": "complete", "s2": "active"}
    mission.refresh_from_db()
    # the mission no longer says it is stopped at a feature that has passed
    assert "blocked" not in mission.status_reason, mission.status_reason


FLAKY = """
import os, pathlib, sys
key = os.environ["FUSION_FEATURE_KEY"]
attempts = pathlib.Path(sys.argv[1])
n = int(attempts.read_text()) + 1 if attempts.exists() else 1
attempts.write_text(str(n))
good = key != "a" or n > 1   # the first attempt at `a` is wrong
pathlib.Path(key + ".txt").write_text(("done " if good else "not yet ") + key + "\\n")
"""


def test_after_a_repair_the_autopilot_makes_the_new_task_itself(worker, api, owner, git_repo, tmp_path):
    """With the `command` executor nobody is there to create a task by hand: after
    `repair clear` the autopilot must triage the feature again and run it."""
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    command = python_command(script, str(tmp_path / "attempts"))
    mission = _blocked_by_budget(worker, api, owner, git_repo, executor="command", executor_command=command)
    _assert_stopped_at(mission, "a")
    a = feature(mission, "a")
    response = api(owner).post(
        f"/api/features/{a.pk}/repair/", {"mode": "clear", "reason": "fixed the script"}, format="json"
    )
    assert response.status_code == 200
    worker.drain(timeout=120)
    assert a.tasks.count() == 2, "no new task was made for the repaired feature"
    mission.refresh_from_db()
    assert feature(mission, "a").loop_state == "passed"
    assert mission.status == "complete", mission.status_reason
