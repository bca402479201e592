"""A pass means exactly what the docs say (milestones): a milestone, its slices and the
mission are complete only while everything under them is done; a milestone run judges a
defined commit (the newest passed feature revision that contains the others); a
milestone regression in a report-only mission waits for an operator's fix, which carries
the milestone run's failures; a fix still in flight when its root passes is closed as
superseded, and the autopilot counts its slice done.

Names that only the new loop has are imported inside the tests, so that each test fails
on its own against an older loop."""

from __future__ import annotations

import pytest
from django.db import transaction

from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice, Task
from missions.services.lifecycle import mission_activate
from missions.services.tasks import task_complete, task_create
from tests.missions.loop_helpers import add_slice, events, feature, implement, make_mission, milestone_ready, open_task
from validation.models import FixLineage, RunScope, RunStatus, ValidatorRun
from validation.services.operator import feature_repair
from validation.services.runner import execute_run
from validation.services.verdicts.admit import feature_admit
from validation.services.verdicts.task import task_outcome_process

pytestmark = pytest.mark.django_db(transaction=True)

REOPENED = ["slice:reopened", "milestone:reopened", "mission:reopened"]
GREETING = {"file": "hello.py", "contains": r"def hello\("}
GOOD = {"hello.py": "def hello():\n    return 'hi'\n"}
BAD = {"hello.py": "def goodbye():\n    pass\n"}


def changes(mission: Mission, *, after: int = 0) -> list[str]:
    """The named events after `after`, in order."""
    return [e.type for e in events(mission) if e.seq > after]


def last_seq(mission: Mission) -> int:
    return max((e.seq for e in events(mission)), default=0)


def statuses(mission: Mission) -> tuple[str, str, str]:
    mission.refresh_from_db()
    return (Slice.objects.get(mission=mission).status, Milestone.objects.get(mission=mission).status, mission.status)


def milestone_runs(mission: Mission) -> list[ValidatorRun]:
    return list(ValidatorRun.objects.filter(mission=mission, scope=RunScope.MILESTONE).order_by("id"))


def milestone_assertion(mission: Mission, check: dict) -> ContractAssertion:
    milestone = Milestone.objects.get(mission=mission, key="m1")
    assertion = ContractAssertion(
        milestone=milestone,
        key="VAL-M",
        title="the whole",
        statement="the milestone holds",
        scope="milestone",
        check_spec=check,
    )
    assertion.save()
    return assertion


def land(worker, alice, repo, mission: Mission, key: str, *, good: bool = True) -> str:
    """Complete the open task of `key` with a real commit; returns the revision."""
    task = open_task(feature(mission, key))
    assert task is not None, f"no open task for {key}"
    revision = implement(repo, key, good=good)
    task_complete(user=alice, task=task, revision=revision)
    worker.drain()
    return revision


def completed_mission(worker, alice, git_repo, **fields) -> Mission:
    """The autopilot flow to the end: one milestone (a feature-scoped assertion per feature
    and one milestone-scoped assertion), one slice of features a and b."""
    mission = make_mission(alice, git_repo.path, autopilot=True, **fields)
    add_slice(mission, "m1", "s1", ["a", "b"])
    milestone_assertion(mission, {"file": "b.txt", "exists": True})
    mission_activate(mission=mission, user=alice)
    worker.drain()
    land(worker, alice, git_repo, mission, "a")
    land(worker, alice, git_repo, mission, "b")
    assert statuses(mission) == ("complete", "complete", "complete"), mission.status_reason
    assert [r.status for r in milestone_runs(mission)] == ["passed"]
    return mission


def assert_reopened(mission: Mission, *, after: int, cause: str) -> None:
    assert statuses(mission) == ("active", "active", "active")
    reopened = [e for e in events(mission) if e.seq > after and e.type in REOPENED]
    assert [e.type for e in reopened] == REOPENED
    assert {e.payload["cause"] for e in reopened} == {cause}
    assert "mission:completed" not in changes(mission, after=after) and "milestone:completed" not in changes(
        mission, after=after
    )


# --- 6. complete only while everything under it is done -------------------------------------


def test_clearing_a_passed_feature_reopens_slice_milestone_and_mission(worker, alice, git_repo):
    mission = completed_mission(worker, alice, git_repo)
    seq = last_seq(mission)
    assert feature_repair(feature=feature(mission, "a"), user=alice, mode="clear") is None
    worker.drain()
    assert feature(mission, "a").loop_state == "implementing"
    assert_reopened(mission, after=seq, cause="clear")


def test_a_new_task_on_a_passed_feature_reopens_slice_milestone_and_mission(worker, alice, git_repo):
    mission = completed_mission(worker, alice, git_repo)
    seq = last_seq(mission)
    task_create(user=alice, feature=feature(mission, "b"))
    worker.drain()
    assert feature(mission, "b").loop_state == "implementing"
    assert_reopened(mission, after=seq, cause="task_linked")


def test_a_failed_manual_validation_leaves_the_mission_incomplete(worker, alice, git_repo, tmp_path, settings):
    """A manual re-run at the same revision fails (the check's environment changed: a
    flaky check); with auto_fix off the feature waits in needs_fix, and the milestone it
    belongs to is not completed, whatever a milestone run would say."""
    settings.FUSION_SANDBOX = "off"  # the flaky check reads a file of the test's, outside any sandbox
    flag = tmp_path / "broken-flag"
    flaky = {"run": f'python -c "import os, sys; sys.exit(os.path.exists({str(flag)!r}))"'}
    mission = make_mission(alice, git_repo.path, status="active", auto_fix=False)
    add_slice(mission, "m1", "s1", ["a"], extra_check=flaky)
    task_create(user=alice, feature=feature(mission, "a"))
    land(worker, alice, git_repo, mission, "a")
    a = feature(mission, "a")
    assert a.loop_state == "passed"
    flag.write_text("now it fails\n")
    admission = feature_repair(feature=a, user=alice, mode="re_run")
    assert admission.outcome == "started"
    worker.drain()
    run = ValidatorRun.objects.get(pk=admission.run.pk)
    assert run.status == RunStatus.FAILED and run.revision == a.last_run.revision
    a.refresh_from_db()
    assert a.loop_state == "needs_fix" and not MissionFeature.objects.filter(generated_from=a).exists()
    assert "fix-feature:report-only" in changes(mission)
    with transaction.atomic():
        assert milestone_ready(milestone=Milestone.objects.get(mission=mission)) == "waiting"
    assert Milestone.objects.get(mission=mission).status != "complete"


def test_a_passing_milestone_run_does_not_complete_a_milestone_with_an_unfinished_feature(worker, alice, git_repo):
    mission = make_mission(alice, git_repo.path, status="active")
    add_slice(mission, "m1", "s1", ["a"])
    milestone_assertion(mission, {"file": "a.txt", "exists": True})
    task_create(user=alice, feature=feature(mission, "a"))
    land(worker, alice, git_repo, mission, "a")
    assert feature(mission, "a").loop_state == "passed"
    milestone = Milestone.objects.get(mission=mission)
    with transaction.atomic():  # the milestone run executes after a has left `passed`
        assert milestone_ready(milestone=milestone) == "validating_milestone"
        task_create(user=alice, feature=feature(mission, "a"))
    worker.drain()
    [run] = milestone_runs(mission)
    assert run.status == RunStatus.PASSED
    assert feature(mission, "a").loop_state == "implementing"
    assert milestone_ready(milestone=milestone) == "waiting"
    milestone.refresh_from_db()
    assert milestone.status != "complete"
    assert "milestone:completed" not in changes(mission)
    assert len(milestone_runs(mission)) == 1


# --- 9. the milestone run judges a defined commit -----------------------------------------------


def _two_features(alice, git_repo) -> Mission:
    mission = make_mission(alice, git_repo.path, status="active")
    add_slice(mission, "m1", "s1", ["a", "b"])
    milestone_assertion(mission, {"file": "a.txt", "exists": True})
    for key in ("a", "b"):
        task_create(user=alice, feature=feature(mission, key))
    return mission


def test_the_milestone_run_judges_the_newest_passed_revision_not_the_workspace_head(worker, alice, git_repo):
    mission = _two_features(alice, git_repo)
    a_rev = land(worker, alice, git_repo, mission, "a")
    b_rev = land(worker, alice, git_repo, mission, "b")  # b's commit contains a's
    assert {feature(mission, k).loop_state for k in "ab"} == {"passed"}
    git_repo.git("checkout", "-q", "-b", "other")  # the workspace moves to unrelated work
    git_repo.git("rm", "-q", "a.txt")
    head = git_repo.commit({"b.txt": "unrelated\n"}, "unrelated work on another branch")
    assert git_repo.git("rev-parse", "HEAD").strip() == head
    milestone = Milestone.objects.get(mission=mission)
    with transaction.atomic():
        assert milestone_ready(milestone=milestone) == "validating_milestone"
    worker.drain()
    [run] = milestone_runs(mission)
    assert run.revision == b_rev and run.revision not in (a_rev, head)
    assert run.status == RunStatus.PASSED  # judged at b, where a.txt and b.txt hold
    assert milestone_ready(milestone=milestone) == "complete"
    from validation.services.milestones import milestone_revision

    assert milestone_revision(milestone) == (b_rev, "")  # a passed revision: no branch named


def test_passed_revisions_on_diverging_branches_stop_the_milestone(worker, alice, git_repo):
    mission = _two_features(alice, git_repo)
    git_repo.git("checkout", "-q", "-b", "side")
    b_rev = land(worker, alice, git_repo, mission, "b")
    git_repo.git("checkout", "-q", "main")
    a_rev = land(worker, alice, git_repo, mission, "a")
    assert git_repo.git("merge-base", a_rev, b_rev).strip() not in (a_rev, b_rev)  # neither contains the other
    assert {feature(mission, k).loop_state for k in "ab"} == {"passed"}
    milestone = Milestone.objects.get(mission=mission)
    state = milestone_ready(milestone=milestone)
    assert state.startswith("stop:") and "one line of history" in state, state
    assert milestone_runs(mission) == []
    milestone.refresh_from_db()
    assert milestone.status != "complete"


# --- 17. a milestone regression in a report-only mission ---------------------------------------


def test_a_milestone_regression_without_auto_fix_waits_for_an_operators_fix(worker, alice, git_repo, api_for):
    mission = make_mission(alice, git_repo.path, status="active", auto_fix=False)
    add_slice(mission, "m1", "s1", ["a", "b"])
    for key in ("a", "b"):
        task_create(user=alice, feature=feature(mission, key))
    land(worker, alice, git_repo, mission, "a")
    b_task = open_task(feature(mission, "b"))
    b_rev = git_repo.commit({"b.txt": "done b\n", "a.txt": "broken by b\n"}, "b, breaking a")
    task_complete(user=alice, task=b_task, revision=b_rev)
    worker.drain()
    assert {feature(mission, k).loop_state for k in "ab"} == {"passed"}  # each passed its own contract
    milestone = Milestone.objects.get(mission=mission)
    with transaction.atomic():
        assert milestone_ready(milestone=milestone) == "validating_milestone"
    worker.drain()
    [run] = milestone_runs(mission)
    assert run.status == RunStatus.FAILED and run.revision == b_rev
    assert list(run.failures.values_list("assertion_key", flat=True)) == ["VAL-a"]
    a = feature(mission, "a")
    assert a.loop_state == "needs_fix" and a.last_run_id == run.pk
    assert not MissionFeature.objects.filter(generated_from=a).exists()  # report only: nothing made by itself
    moved = [e for e in events(mission, "feature:updated") if e.payload.get("feature") == a.pk][-1]
    assert (moved.payload["from"], moved.payload["loop_state"], moved.payload["cause"]) == (
        "passed",
        "needs_fix",
        "milestone_regression",
    )

    response = api_for(alice).post(f"/api/features/{a.pk}/create_fix/")
    assert response.status_code == 201, response.json()
    fix = MissionFeature.objects.get(pk=response.json()["id"])
    assert fix.generated_from_id == a.pk and fix.generated_from_run_id == run.pk
    assert "## Validation cause" in fix.description and f"Validator run {run.pk}" in fix.description
    assert "### VAL-a" in fix.description
    assert list(fix.assertions.values_list("key", flat=True)) == ["VAL-a"]
    assert FixLineage.objects.get(fix=fix).run_id == run.pk
    created = [e for e in events(mission, "fix-feature:created") if e.payload["feature"] == fix.pk]
    assert len(created) == 1 and created[0].payload["run"] == run.pk and created[0].payload["assertions"] == ["VAL-a"]


# --- 16. superseded fixes ------------------------------------------------------------------------


def test_a_fix_in_flight_when_its_root_passes_is_superseded(idle_broker, build_mission, git_repo, alice):
    from validation.services.autopilot import autopilot_advance

    mission = build_mission({"hello": [("VAL-1", GREETING)]}, autopilot=True)
    assert autopilot_advance(mission_id=mission.pk) == "activated"
    root = MissionFeature.objects.get(key="hello")
    task = Task.objects.get(feature=root)
    task_complete(user=alice, task=task, revision=git_repo.commit(BAD, "wrong"))
    assert task_outcome_process(task_id=task.pk) == "started"
    root.refresh_from_db()
    assert execute_run(root.last_run_id) == RunStatus.FAILED
    fix = MissionFeature.objects.get(generated_from=root)
    fix_task = Task.objects.get(feature=fix)  # the autopilot's
    task_complete(
        user=alice, task=fix_task, revision=git_repo.commit({"hello.py": "def hullo():\n    pass\n"}, "fix attempt")
    )
    assert task_outcome_process(task_id=fix_task.pk) == "started"
    fix.refresh_from_db()
    fix_run = fix.last_run
    assert fix.loop_state == "validating" and fix_run.status == RunStatus.RUNNING
    root.refresh_from_db()
    rounds = root.fix_rounds
    assert rounds == 1

    # Meanwhile the root gets a correct implementation of its own and passes.
    second = task_create(user=alice, feature=root)
    task_complete(user=alice, task=second, revision=git_repo.commit(GOOD, "right"))
    assert task_outcome_process(task_id=second.pk) == "started"
    root.refresh_from_db()
    assert execute_run(root.last_run_id) == RunStatus.PASSED
    root.refresh_from_db()
    fix.refresh_from_db()
    assert root.loop_state == "passed" and root.fix_rounds == rounds
    assert fix.loop_state == "superseded" and fix.status == "done"
    assert ValidatorRun.objects.get(pk=fix_run.pk).status == RunStatus.CANCELLED
    closed = [e for e in events(mission, "feature:updated") if e.payload.get("feature") == fix.pk][-1]
    assert (closed.payload["from"], closed.payload["loop_state"], closed.payload["cause"]) == (
        "validating",
        "superseded",
        "superseded",
    )

    # The cancelled run's late delivery changes nothing.
    features, runs, seq = MissionFeature.objects.count(), ValidatorRun.objects.count(), last_seq(mission)
    assert execute_run(fix_run.pk) == "stale"
    fix.refresh_from_db()
    root.refresh_from_db()
    assert fix.loop_state == "superseded" and ValidatorRun.objects.get(pk=fix_run.pk).status == RunStatus.CANCELLED
    assert (MissionFeature.objects.count(), ValidatorRun.objects.count(), last_seq(mission)) == (features, runs, seq)
    assert root.fix_rounds == rounds and FixLineage.objects.filter(root=root).count() == 1

    # The autopilot counts the slice done: the milestone is judged, then the mission completes.
    assert autopilot_advance(mission_id=mission.pk) == "validating_milestone"
    assert Slice.objects.get(mission=mission).status == "complete"
    milestone_run = ValidatorRun.objects.get(mission=mission, scope="milestone")
    assert execute_run(milestone_run.pk) == RunStatus.PASSED
    assert autopilot_advance(mission_id=mission.pk) == "complete"
    mission.refresh_from_db()
    assert mission.status == "complete" and Milestone.objects.get(mission=mission).status == "complete"


# --- 6. a changed contract is judged again ----------------------------------------------------


def test_an_assertion_linked_to_a_passed_feature_reopens_and_judges_it_again(worker, alice, git_repo):
    from missions.services.hierarchy import assertion_create, assertion_link

    mission = completed_mission(worker, alice, git_repo)
    before = last_seq(mission)
    a = feature(mission, "a")
    passed_run = a.last_run_id
    with transaction.atomic():
        extra = assertion_create(
            user=alice,
            milestone=Milestone.objects.get(mission=mission),
            key="VAL-a-more",
            title="a says more",
            statement="a.txt says more",
            check_spec=None,
        )
        assertion_link(user=alice, feature=a, assertion=extra)
    # the milestone was judged over another set: not complete; `a` is judged over its new set
    assert statuses(mission)[1:] == ("active", "active")
    milestone_reopened = [e for e in events(mission, "milestone:reopened") if e.seq > before]
    assert milestone_reopened and milestone_reopened[0].payload["cause"] == "assertion_created"
    moved = [e.payload for e in events(mission, "feature:updated") if e.seq > before and e.payload["feature"] == a.pk]
    assert [(p["from"], p["loop_state"], p["cause"]) for p in moved][:2] == [
        ("passed", "idle", "contract_changed"),
        ("idle", "validating", "contract_changed"),
    ]
    worker.drain()
    a.refresh_from_db()
    run = a.last_run
    assert run.pk != passed_run and [x["key"] for x in run.assertions] == ["VAL-a", "VAL-a-more"]
    # the new assertion has no check and the mission no agent: blocked, never the old pass
    assert a.loop_state == "blocked" and run.status == RunStatus.BLOCKED
    assert statuses(mission) == ("active", "active", "active")


def test_an_edited_check_of_a_passed_feature_is_judged_again(worker, alice, git_repo, staff):
    from missions.services.hierarchy import assertion_update

    mission = completed_mission(worker, alice, git_repo)
    assertion = ContractAssertion.objects.get(mission=mission, key="VAL-b")
    with transaction.atomic():
        assertion_update(user=staff, assertion=assertion, check_spec={"file": "b.txt", "contains": "never written"})
    worker.drain()
    b = feature(mission, "b")
    assert b.loop_state in ("needs_fix", "implementing") and b.last_run.status == RunStatus.FAILED
    assert statuses(mission)[1:] == ("active", "active")


# --- a milestone run over an older input ------------------------------------------------------


def test_a_milestone_run_over_an_older_input_is_cancelled_for_one_over_the_current(
    idle_broker, build_mission, git_repo, alice, staff
):
    """Found by the property test: a milestone-scoped check edited while the milestone run
    was running made the autopilot start a second milestone run (a constraint error that
    stalled the mission). The stale run now ends `cancelled` and decides nothing."""
    from missions.services.hierarchy import assertion_create, assertion_update
    from validation.services.autopilot import autopilot_advance

    mission = build_mission({"hello": [("VAL-1", GREETING)]}, autopilot=True)
    milestone = Milestone.objects.get(mission=mission)
    whole = assertion_create(
        user=staff,
        milestone=milestone,
        key="VAL-M",
        title="whole",
        statement="hello exists",
        scope="milestone",
        check_spec={"file": "hello.py", "contains": "def"},
    )
    assert autopilot_advance(mission_id=mission.pk) == "activated"
    task = Task.objects.get(feature__key="hello")
    task_complete(user=alice, task=task, revision=git_repo.commit(GOOD, "right"))
    assert task_outcome_process(task_id=task.pk) == "started"
    assert execute_run(feature(mission, "hello").last_run_id) == RunStatus.PASSED
    assert autopilot_advance(mission_id=mission.pk) == "validating_milestone"
    stale = ValidatorRun.objects.get(mission=mission, scope="milestone")

    assertion_update(user=staff, assertion=whole, check_spec={"file": "hello.py", "contains": "return"})
    assert autopilot_advance(mission_id=mission.pk) == "validating_milestone"
    stale.refresh_from_db()
    current = ValidatorRun.objects.get(mission=mission, scope="milestone", status=RunStatus.RUNNING)
    assert stale.status == RunStatus.CANCELLED and current.pk != stale.pk
    assert [a["check"]["contains"] for a in current.assertions if a["key"] == "VAL-M"] == ["return"]
    cancelled = [e for e in events(mission, "validator-run:completed") if e.payload["run"] == stale.pk]
    assert [e.payload["status"] for e in cancelled] == ["cancelled"]

    assert execute_run(stale.pk) == "stale"  # its late delivery decides nothing
    assert execute_run(current.pk) == RunStatus.PASSED
    assert autopilot_advance(mission_id=mission.pk) == "complete"
