"""A person validates a milestone (docs/TRUTH.md, "A slice, a milestone, a mission is
complete when"): with the autopilot off, nothing else does. Over a real repository, the
request completes the milestone's slices and starts a milestone run; its pass completes
the milestone and the mission. Every surface calls the one service: the API, the admin,
the command line (the MCP tool: tests/mcp/test_milestone_validate.py)."""

from __future__ import annotations

import io

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice
from missions.services.tasks import task_complete, task_create
from tests.missions.loop_helpers import add_slice, events, feature, implement, make_mission, milestone_ready
from tests.reliability.conftest import mission_rows
from validation.models import RunScope, RunStatus, ValidatorRun
from validation.services.operator import milestone_validate
from validation.services.runner import execute_run
from validation.services.verdicts.task import task_outcome_process

pytestmark = pytest.mark.django_db(transaction=True)

ON_REQUEST = ["slice:activated", "milestone:activated", "slice:completed", "validator-run:started"]


def a_mission(owner, repo, *, check: dict | None = None, **fields) -> Mission:
    """An active mission with its autopilot off: milestone m1, slice s1 of features a and
    b (each judged by its own file check), and a milestone-scoped assertion VAL-M."""
    mission = make_mission(owner, repo.path, status="active", autopilot=False, **fields)
    add_slice(mission, "m1", "s1", ["a", "b"])
    ContractAssertion(
        milestone=Milestone.objects.get(mission=mission, key="m1"),
        key="VAL-M",
        title="the whole",
        statement="the milestone holds",
        scope="milestone",
        check_spec=check or {"file": "b.txt", "exists": True},
    ).save()
    return mission


def land(owner, repo, mission: Mission, key: str, worker=None) -> None:
    """A person's task for `key`, completed at a real commit and passed (by the worker, or
    judged here when there is none)."""
    task = task_create(user=owner, feature=feature(mission, key))
    task_complete(user=owner, task=task, revision=implement(repo, key))
    if worker is not None:
        worker.drain()
    else:
        assert task_outcome_process(task_id=task.pk) == "started"
        assert execute_run(feature(mission, key).last_run_id) == RunStatus.PASSED
    assert feature(mission, key).loop_state == "passed"


def statuses(mission: Mission) -> tuple[str, str, str]:
    mission.refresh_from_db()
    return (Slice.objects.get(mission=mission).status, Milestone.objects.get(mission=mission).status, mission.status)


def types_after(mission: Mission, seq: int) -> list[str]:
    return [e.type for e in events(mission) if e.seq > seq]


def last_seq(mission: Mission) -> int:
    return max((e.seq for e in events(mission)), default=0)


def milestone_runs(mission: Mission) -> list[ValidatorRun]:
    return list(ValidatorRun.objects.filter(mission=mission, scope=RunScope.MILESTONE).order_by("id"))


# --- the API -----------------------------------------------------------------------------------


def test_without_the_autopilot_a_person_validates_the_milestone_and_the_mission_completes(
    worker, alice, git_repo, api_for
):
    mission = a_mission(alice, git_repo)
    land(alice, git_repo, mission, "a", worker)
    land(alice, git_repo, mission, "b", worker)
    # Every feature passed, and nothing more happens by itself.
    assert statuses(mission) == ("pending", "pending", "active")
    assert milestone_runs(mission) == []
    milestone = Milestone.objects.get(mission=mission)
    seq = last_seq(mission)

    response = api_for(alice).post(f"/api/milestones/{milestone.pk}/validate/")
    assert response.status_code == 202, response.json()
    body = response.json()
    [run] = milestone_runs(mission)
    assert (body["outcome"], body["id"], body["status"]) == ("started", run.pk, "running")
    assert body["run"]["scope"] == "milestone" and body["run"]["trigger"] == "manual"
    assert run.revision == feature(mission, "b").last_run.revision  # the newest passed revision
    assert body["milestone"]["status"] == "active" and body["mission_status"] == "active"
    assert types_after(mission, seq) == ON_REQUEST
    assert {e.actor_id for e in events(mission) if e.seq > seq} == {alice.pk}
    seq = last_seq(mission)

    worker.drain()
    assert ValidatorRun.objects.get(pk=run.pk).status == RunStatus.PASSED
    assert statuses(mission) == ("complete", "complete", "complete")
    after = types_after(mission, seq)
    assert after[-3:] == ["validator-run:completed", "milestone:completed", "mission:completed"], after
    assert after.count("milestone:completed") == 1 and after.count("mission:completed") == 1

    # A complete mission is not validated again (as a feature of it is not).
    again = api_for(alice).post(f"/api/milestones/{milestone.pk}/validate/")
    assert again.status_code == 409 and again.json()["code"] == "mission_not_active"


def test_a_milestone_without_assertions_completes_on_request_and_the_last_one_completes_the_mission(
    worker, alice, git_repo, api_for
):
    mission = a_mission(alice, git_repo)
    empty = Milestone.objects.create(mission=mission, key="m2", title="Nothing to judge", order=2)
    seq = last_seq(mission)
    response = api_for(alice).post(f"/api/milestones/{empty.pk}/validate/")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["outcome"], body["run"], body["mission_status"]) == ("complete", None, "active")
    assert body["milestone"]["status"] == "complete" and body["detail"] == "milestone m2 is complete"
    assert types_after(mission, seq) == ["milestone:completed"]

    land(alice, git_repo, mission, "a", worker)
    land(alice, git_repo, mission, "b", worker)
    m1 = Milestone.objects.get(mission=mission, key="m1")
    assert api_for(alice).post(f"/api/milestones/{m1.pk}/validate/").status_code == 202
    worker.drain()
    mission.refresh_from_db()
    assert (Milestone.objects.get(pk=m1.pk).status, mission.status) == ("complete", "complete")


@pytest.mark.parametrize("case", ["features_open", "dependencies_open", "mission_not_active"])
def test_a_refusal_says_why_and_changes_nothing(case, idle_broker, alice, git_repo, api_for):
    mission = a_mission(alice, git_repo)
    target = Milestone.objects.get(mission=mission, key="m1")
    if case == "features_open":
        land(alice, git_repo, mission, "a")
        task_create(user=alice, feature=feature(mission, "b"))
    elif case == "dependencies_open":
        add_slice(mission, "m2", "s2", ["c"], milestone_order=2)
        target = Milestone.objects.get(mission=mission, key="m2")
        target.dependencies.add(Milestone.objects.get(mission=mission, key="m1"))
    else:
        Mission.objects.filter(pk=mission.pk).update(status="paused")
    before = mission_rows(mission.pk)

    response = api_for(alice).post(f"/api/milestones/{target.pk}/validate/")
    assert response.status_code == 409, response.json()
    body = response.json()
    assert body["code"] == case
    if case == "features_open":
        assert body["features"] == [
            {"id": feature(mission, "b").pk, "key": "b", "loop_state": "implementing"},
        ]
        assert "b (implementing)" in body["detail"]
    elif case == "dependencies_open":
        assert [d["key"] for d in body["dependencies"]] == ["m1"] and "m1 (pending)" in body["detail"]
    assert mission_rows(mission.pk) == before


def test_revisions_on_diverging_branches_are_refused(worker, alice, git_repo, api_for):
    mission = a_mission(alice, git_repo)
    git_repo.git("checkout", "-q", "-b", "side")
    land(alice, git_repo, mission, "b", worker)
    git_repo.git("checkout", "-q", "main")
    land(alice, git_repo, mission, "a", worker)
    before = mission_rows(mission.pk)
    milestone = Milestone.objects.get(mission=mission)
    response = api_for(alice).post(f"/api/milestones/{milestone.pk}/validate/")
    assert response.status_code == 409
    assert response.json()["code"] == "no_milestone_revision"
    assert "one line of history" in response.json()["detail"]
    assert mission_rows(mission.pk) == before  # not even its slice was completed


def test_only_the_missions_people_may_validate_its_milestones(idle_broker, alice, git_repo, api_for, django_user_model):
    mission = a_mission(alice, git_repo)
    milestone = Milestone.objects.get(mission=mission)
    member = django_user_model.objects.create_user("member")
    mission.members.add(member)
    stranger = django_user_model.objects.create_user("stranger")
    before = mission_rows(mission.pk)
    url = f"/api/milestones/{milestone.pk}/validate/"
    anonymous = api_for(None).post(url)
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "not_authenticated"
    hidden = api_for(stranger).post(url)
    assert hidden.status_code == 404 and hidden.json()["code"] == "not_found"
    assert mission_rows(mission.pk) == before
    refused = api_for(member).post(url)  # a member is answered by the rules (its features are open)
    assert refused.status_code == 409 and refused.json()["code"] == "features_open"


# --- what a milestone run's verdict does ---------------------------------------------------------


def test_a_failing_milestone_assertion_fails_the_run_and_completes_nothing(worker, alice, git_repo, api_for):
    mission = a_mission(alice, git_repo, check={"file": "c.txt", "exists": True})
    land(alice, git_repo, mission, "a", worker)
    land(alice, git_repo, mission, "b", worker)
    milestone = Milestone.objects.get(mission=mission)
    assert api_for(alice).post(f"/api/milestones/{milestone.pk}/validate/").status_code == 202
    worker.drain()
    [run] = milestone_runs(mission)
    assert run.status == RunStatus.FAILED
    assert list(run.failures.values_list("assertion_key", flat=True)) == ["VAL-M"]
    mission.refresh_from_db()
    assert Milestone.objects.get(pk=milestone.pk).status == "active" and mission.status == "active"
    assert not events(mission, "milestone:completed") and not events(mission, "mission:completed")
    # The failure goes back to the feature that landed last, with a fix (the mission has auto_fix).
    b = feature(mission, "b")
    assert b.loop_state == "implementing"
    fix = MissionFeature.objects.get(generated_from=b)
    assert fix.generated_from_run_id == run.pk and "### VAL-M" in fix.description
    again = api_for(alice).post(f"/api/milestones/{milestone.pk}/validate/")
    assert again.status_code == 409 and again.json()["code"] == "features_open"
    assert {f["key"] for f in again.json()["features"]} == {"b", fix.key}


def test_asking_again_after_a_blocked_run_judges_the_same_input_again(idle_broker, alice, git_repo):
    """The autopilot stops at a milestone run that did not pass, until something changes; a
    person who asks again gets a new run over the same input."""
    mission = a_mission(alice, git_repo, check={"file": "b.txt", "exists": "false"})  # a spec the judge blocks
    land(alice, git_repo, mission, "a")
    land(alice, git_repo, mission, "b")
    milestone = Milestone.objects.get(mission=mission)
    first = milestone_validate(milestone_id=milestone.pk, actor_id=alice.pk)
    assert first.outcome == "started"
    running = milestone_validate(milestone_id=milestone.pk, actor_id=alice.pk)
    assert (running.outcome, running.run.pk) == ("already_running", first.run.pk)
    assert execute_run(first.run.pk) == RunStatus.BLOCKED
    assert milestone_ready(milestone=milestone).startswith(f"stop:milestone m1 validation blocked (run {first.run.pk})")

    second = milestone_validate(milestone_id=milestone.pk, actor_id=alice.pk)
    assert second.outcome == "started" and second.run.pk != first.run.pk
    assert second.run.input_fingerprint == first.run.input_fingerprint
    assert second.run.requested_by_id == alice.pk
    assert execute_run(second.run.pk) == RunStatus.BLOCKED
    assert statuses(mission) == ("complete", "active", "active")


# --- the admin -------------------------------------------------------------------------------------


def test_the_admin_action_validates_each_selected_milestone(idle_broker, admin_client, admin_user, git_repo):
    mission = a_mission(admin_user, git_repo)
    add_slice(mission, "m2", "s2", ["c"], milestone_order=2)
    land(admin_user, git_repo, mission, "a")
    land(admin_user, git_repo, mission, "b")
    m1, m2 = (Milestone.objects.get(mission=mission, key=k) for k in ("m1", "m2"))
    response = admin_client.post(
        reverse("admin:missions_milestone_changelist"),
        {"action": "validate_milestones", ACTION_CHECKBOX_NAME: [m1.pk, m2.pk]},
        follow=True,
    )
    assert response.status_code == 200
    shown = [(m.level_tag, str(m)) for m in response.context["messages"]]
    [run] = milestone_runs(mission)
    assert ("success", f"Milestone validation requested: {m1} (validation run {run.pk} started)") in shown, shown
    assert any(level == "error" and str(m2) in text and "c (idle)" in text for level, text in shown), shown
    assert events(mission, "validator-run:started")[-1].actor_id == admin_user.pk
    assert execute_run(run.pk) == RunStatus.PASSED
    assert Milestone.objects.get(pk=m1.pk).status == "complete"
    assert Mission.objects.get(pk=mission.pk).status == "active"  # m2 is not complete


# --- the command line ------------------------------------------------------------------------------


def command(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("validate_milestone", *args, stdout=out, stderr=io.StringIO())
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    except CommandError as exc:
        return exc.returncode, str(exc)
    return 0, out.getvalue()


def test_the_command_waits_for_the_verdict_with_sync(idle_broker, alice, git_repo):
    mission = a_mission(alice, git_repo)
    Milestone.objects.filter(mission=mission).update(key="cart")
    assert command("life/cart", "--sync")[0] == 2  # refused: nothing landed yet
    land(alice, git_repo, mission, "a")
    land(alice, git_repo, mission, "b")
    code, out = command("cart", "--mission", "life", "--sync", "--user", "alice")
    [run] = milestone_runs(mission)
    assert code == 0, out
    assert f"run {run.pk} for milestone life/cart (started" in out and "VAL-M" in out and "pass" in out
    assert "milestone life/cart: complete; mission life: complete" in out
    assert run.requested_by_id == alice.pk


def test_the_command_exits_1_on_a_failed_run_and_2_when_it_cannot_judge(idle_broker, alice, git_repo):
    mission = a_mission(alice, git_repo, check={"file": "c.txt", "exists": True})
    land(alice, git_repo, mission, "a")
    land(alice, git_repo, mission, "b")
    milestone = Milestone.objects.get(mission=mission)
    code, out = command(str(milestone.pk), "--sync")
    assert code == 1, out
    assert "VAL-M" in out and "fail" in out and "milestone life/m1: active; mission life: active" in out
    code, message = command("life/m1", "--sync")
    assert code == 2 and "features_open" in message and "b (" in message  # b was sent back with a fix
    assert command("nope", "--sync")[0] == 2
    assert command("m1", "--mission", "other")[0] == 2
    assert command("m1", "--user", "nobody")[0] == 2
    assert len(milestone_runs(mission)) == 1
