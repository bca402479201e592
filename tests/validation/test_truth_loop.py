"""A pass means exactly what the docs say (the feature loop): refs are pinned to commit
ids, a reuse honours newer evidence and never leaves `blocked`, a run judges its frozen
assertion set, a declared check outranks a model, a root is judged at the revision it
stands on, long checks keep their lease, claims are exclusive, and a fix that passes
while its root is validating or blocked keeps its pass.

Each test asserts what a user notices: states, runs and their revisions, and the audit
events a step emits. Names that only the new loop has are imported inside the tests, so
that each test fails on its own against an older loop."""

from __future__ import annotations

import re
import sys
import textwrap
import threading
from datetime import timedelta

import dramatiq
import pytest
from django.db import connection, transaction
from django.utils import timezone

from missions.errors import Conflict
from missions.models import MissionEvent, MissionFeature
from missions.services.tasks import task_complete, task_create
from tests.missions.loop_helpers import events, wait_for
from tests.reliability.conftest import race
from tests.support.agent_env import add_profile, hello_feature, scripted  # noqa: F401 — fixtures
from tests.support.verdicts import item, verdict
from validation.models import JournalEntry, RunStatus, ValidatorFailure, ValidatorRun
from validation.services.operator import feature_repair, feature_validate
from validation.services.runner import execute_run
from validation.services.verdicts.admit import admit_or_raise, feature_admit, rerun
from validation.services.verdicts.task import task_outcome_process

pytestmark = pytest.mark.django_db(transaction=True)

GREETING = {"file": "hello.py", "contains": r"def hello\("}
GOOD = {"hello.py": "def hello():\n    return 'hi'\n"}
BAD = {"hello.py": "def goodbye():\n    pass\n"}
FULL_ID = re.compile(r"^[0-9a-f]{40}$")


class _Recorder(dramatiq.Middleware):
    def __init__(self):
        self.messages: list[dramatiq.Message] = []

    def before_enqueue(self, broker, message, delay):
        self.messages.append(message)


@pytest.fixture
def sent(idle_broker):
    """Every message enqueued while the test runs, whatever the broker."""
    recorder = _Recorder()
    idle_broker.middleware.append(recorder)
    yield recorder.messages
    idle_broker.middleware.remove(recorder)


def hello() -> MissionFeature:
    return MissionFeature.objects.get(key="hello")


def runs_of(feature: MissionFeature) -> list[ValidatorRun]:
    return list(ValidatorRun.objects.filter(feature=feature).order_by("id"))


def changes(mission, type: str, *, after: int = 0) -> list[MissionEvent]:
    return [e for e in events(mission, type) if e.seq > after]


def last_seq(mission) -> int:
    seqs = [e.seq for e in events(mission)]
    return max(seqs) if seqs else 0


# --- 1. refs are pinned ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["main", "HEAD", "short"])
def test_a_ref_is_pinned_to_its_commit_and_a_moved_ref_is_judged_anew(worker, build_mission, git_repo, alice, name):
    mission = build_mission({"hello": [("VAL-1", GREETING)]}, auto_fix=False)
    feature = hello()
    task = task_create(user=alice, feature=feature)
    good = git_repo.commit(GOOD, "good hello")
    given = good[:9] if name == "short" else name
    with transaction.atomic():  # the run executes only after the branch has moved
        task_complete(user=alice, task=task, revision=given)
        bad = git_repo.commit(BAD, "main moves on to a wrong hello")
    worker.drain()
    task.refresh_from_db()
    assert task.revision == good and FULL_ID.match(task.revision) and task.revision_name == given
    [run] = runs_of(feature)
    assert run.revision == good and run.status == RunStatus.PASSED  # judged what was named, not where main is now
    feature.refresh_from_db()
    assert feature.loop_state == "passed"
    completed = [e for e in events(mission, "task:updated") if e.payload.get("change") == "completed"]
    assert completed[-1].payload["revision"] == good

    second = task_create(user=alice, feature=feature)
    task_complete(user=alice, task=second, revision="main")
    worker.drain()
    second.refresh_from_db()
    assert second.revision == bad and second.revision_name == "main"
    first, again = runs_of(feature)
    assert again.revision == bad and again.status == RunStatus.FAILED and again.reused_from_id is None
    feature.refresh_from_db()
    assert feature.loop_state == "needs_fix" and feature.last_run_id == again.pk


def test_an_unknown_revision_is_refused_and_changes_nothing(worker, build_mission, git_repo, alice, api_for):
    mission = build_mission({"hello": [("VAL-1", GREETING)]})
    feature = hello()
    task = task_create(user=alice, feature=feature)
    before = last_seq(mission)
    response = api_for(alice).post(f"/api/tasks/{task.pk}/complete/", {"revision": "nope"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "unknown_revision", response.json()
    assert "nope" in response.json()["detail"]
    worker.drain()
    task.refresh_from_db()
    feature.refresh_from_db()
    assert (task.status, task.revision, task.revision_name) == ("todo", "", "")
    assert not ValidatorRun.objects.exists() and feature.loop_state == "implementing"
    assert last_seq(mission) == before  # no event at all


# --- 2. reuse honours newer evidence; a blocked feature stays blocked --------------------------


def test_a_failing_re_run_on_the_same_input_is_newer_evidence_than_the_pass(
    worker, build_mission, git_repo, alice, tmp_path, settings
):
    settings.FUSION_SANDBOX = "off"  # the check reads a file of the test's, outside any sandbox
    outcome = tmp_path / "outcome.txt"  # outside the repository: the input stays the same
    outcome.write_text("ok")
    judge = tmp_path / "judge.py"
    judge.write_text(f"import pathlib, sys\nsys.exit(0 if pathlib.Path({str(outcome)!r}).read_text() == 'ok' else 1)\n")
    check = {"run": f"{sys.executable} {judge}", "expect_exit": 0, "timeout": 60}
    mission = build_mission({"hello": [("VAL-1", check)]}, auto_fix=False)
    feature = hello()
    revision = git_repo.commit(GOOD)
    task_complete(user=alice, task=task_create(user=alice, feature=feature), revision=revision)
    worker.drain()
    [passed] = runs_of(feature)
    assert passed.status == RunStatus.PASSED

    outcome.write_text("flaky")
    admission = feature_repair(feature=feature, user=alice, mode="re_run")
    assert admission.outcome == "started"
    worker.drain()
    rerun = ValidatorRun.objects.get(pk=admission.run.pk)
    assert rerun.status == RunStatus.FAILED and rerun.input_fingerprint == passed.input_fingerprint

    before = last_seq(mission)
    task_complete(user=alice, task=task_create(user=alice, feature=feature), revision=revision)
    worker.drain()
    runs = runs_of(feature)
    assert len(runs) == 3
    newest = runs[-1]
    assert newest.reused_from_id is None and newest.status == RunStatus.FAILED  # judged again, not the old pass
    assert newest.input_fingerprint == passed.input_fingerprint
    started = [e for e in events(mission, "validator-run:started") if e.seq > before]
    assert [e.payload["run"] for e in started] == [newest.pk]
    feature.refresh_from_db()
    assert feature.loop_state == "needs_fix"


def test_a_blocked_feature_is_never_moved_out_of_blocked_by_a_reuse(worker, build_mission, git_repo, alice):
    mission = build_mission({"hello": [("VAL-1", GREETING)]}, retry_budget=0)
    feature = hello()
    good = git_repo.commit(GOOD)
    task_complete(user=alice, task=task_create(user=alice, feature=feature), revision=good)
    worker.drain()
    feature.refresh_from_db()
    assert feature.loop_state == "passed"
    task_complete(user=alice, task=task_create(user=alice, feature=feature), revision=git_repo.commit(BAD))
    worker.drain()
    feature.refresh_from_db()
    assert (feature.loop_state, feature.stop_reason) == ("blocked", "budget_exhausted")
    runs_before, events_before = len(runs_of(feature)), last_seq(mission)

    for cause in ("validate", "task_done", "recovery"):  # `good` passed before: a reuse would be possible
        admission = feature_admit(feature_id=feature.pk, trigger="manual", cause=cause, revision=good)
        assert admission.outcome == "refused" and admission.run is None, (cause, admission)
    with pytest.raises(Conflict) as refused:
        admit_or_raise(feature_id=feature.pk, trigger="manual", cause="validate", revision=good)
    assert refused.value.code == "feature_blocked"
    worker.drain()
    feature.refresh_from_db()
    assert (feature.loop_state, feature.stop_reason) == ("blocked", "budget_exhausted")
    assert len(runs_of(feature)) == runs_before and last_seq(mission) == events_before

    # Only an operator leaves it: a re-run (it judges the standing revision, fails, and the
    # spent budget blocks it again), then a clear.
    rerun = feature_repair(feature=feature, user=alice, mode="re_run")
    assert rerun.outcome == "started" and rerun.run.revision == feature.tasks.order_by("-id").first().revision
    worker.drain()
    feature.refresh_from_db()
    assert (feature.loop_state, feature.stop_reason) == ("blocked", "budget_exhausted")
    assert feature_repair(feature=feature, user=alice, mode="clear") is None
    feature.refresh_from_db()
    assert feature.loop_state == "implementing"
    left = [e for e in events(mission, "feature:updated") if e.seq > events_before]
    assert [(e.payload["from"], e.payload["loop_state"], e.payload["cause"]) for e in left] == [
        ("blocked", "validating", "re_run"),
        ("validating", "needs_fix", "fail"),
        ("needs_fix", "blocked", "budget_exhausted"),
        ("blocked", "implementing", "clear"),
    ]


# --- 3. a run judges exactly its admitted assertion set ----------------------------------------


def test_a_run_judges_the_assertion_set_frozen_at_admission(idle_broker, build_mission, git_repo):
    git_repo.commit(GOOD)
    build_mission({"hello": [("VAL-1", GREETING), ("VAL-2", {"file": "hello.py", "contains": "hi"})]})
    feature = hello()
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    feature.assertions.clear()  # unlinked after admission, before the run executes
    assert execute_run(run.pk) == RunStatus.PASSED
    run.refresh_from_db()
    assert [(a["key"], a["verdict"]) for a in run.verdict["assertions"]] == [("VAL-1", "pass"), ("VAL-2", "pass")]
    assert [a["key"] for a in run.assertions] == ["VAL-1", "VAL-2"]
    assert run.assertions[0]["check"] == GREETING
    # ... and decides nothing: the feature's contract is now empty, which never passes
    feature.refresh_from_db()
    assert feature.loop_state == "blocked" and feature.stop_reason == "no_assertions"


def test_nothing_to_judge_is_never_a_pass(idle_broker, build_mission, git_repo, alice, api_for):
    from validation.verdict import Verdict, normalize, overall_status

    git_repo.commit(GOOD)
    mission = build_mission({"hello": [], "other": []})
    feature = hello()
    admission = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate")
    assert admission.outcome == "blocked" and admission.run is None
    feature.refresh_from_db()
    assert (feature.loop_state, feature.stop_reason) == ("blocked", "no_assertions")
    other = MissionFeature.objects.get(key="other")
    response = api_for(alice).post(f"/api/features/{other.pk}/validate/", {}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "no_assertions", response.json()
    assert response.json()["detail"]
    other.refresh_from_db()
    assert other.loop_state == "idle" and not ValidatorRun.objects.filter(mission=mission).exists()
    assert overall_status([]) == "blocked"
    assert normalize(Verdict(status="pass", assertions=[])).status == "blocked"


# --- 5. a model's pass cannot override a failing check -----------------------------------------

MIXED = [
    ("VAL-1", {"file": "hello.py", "contains": r"def missing\("}),  # the check fails; the model says pass
    ("VAL-2", None),  # no check: the model decides
    ("VAL-3", GREETING),  # the check passes; the model says fail
]
MODEL_SAYS = verdict(
    item("VAL-1"),
    item("VAL-2", message="the model looked"),
    item("VAL-3", "fail", expected="a friendly hello", actual="a curt hello"),
)


def assert_checks_outrank_the_model(run: ValidatorRun) -> None:
    assert run.status == RunStatus.FAILED, run.error
    judged = {a["key"]: a for a in run.verdict["assertions"]}
    assert {k: a["verdict"] for k, a in judged.items()} == {"VAL-1": "fail", "VAL-2": "pass", "VAL-3": "fail"}
    assert (
        judged["VAL-1"]["expected"] == "hello.py matches /def missing\\(/" and judged["VAL-1"]["actual"] == "no match"
    )
    assert judged["VAL-2"]["message"] == "the model looked"
    assert (judged["VAL-3"]["expected"], judged["VAL-3"]["actual"]) == ("a friendly hello", "a curt hello")
    failures = {f.assertion_key: f for f in ValidatorFailure.objects.filter(run=run)}
    assert sorted(failures) == ["VAL-1", "VAL-3"] and failures["VAL-1"].actual == "no match"
    feature = MissionFeature.objects.get(pk=run.feature_id)
    fix = MissionFeature.objects.get(generated_from=feature)  # auto_fix: the failures come back as a fix
    assert feature.loop_state == "implementing" and "VAL-1" in fix.description and "VAL-3" in fix.description


def test_a_command_validators_pass_cannot_override_a_failing_check(settings, tmp_path, hello_feature):
    script = tmp_path / "says_pass.py"
    script.write_text(
        "import json, sys\nsys.stdin.read()\n"
        + textwrap.dedent(f"""
        print(json.dumps({MODEL_SAYS!r}))
    """)
    )
    add_profile(settings, "cmd", {"kind": "command", "command": [sys.executable, str(script)]})
    feature = hello_feature(MIXED, validator="cmd")
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    execute_run(run.pk)
    run.refresh_from_db()
    assert_checks_outrank_the_model(run)


def test_an_agent_validators_pass_cannot_override_a_failing_check(scripted, hello_feature):
    scripted([("verdict", MODEL_SAYS)])
    feature = hello_feature(MIXED)
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    execute_run(run.pk)
    run.refresh_from_db()
    assert_checks_outrank_the_model(run)


# --- 8. a root is judged at the revision it stands on ------------------------------------------


def test_a_root_is_judged_at_its_fixs_revision_afterwards(worker, build_mission, git_repo, alice):
    build_mission({"hello": [("VAL-1", GREETING)]})
    root = hello()
    r1 = git_repo.commit(BAD, "r1: wrong")
    task_complete(user=alice, task=task_create(user=alice, feature=root), revision=r1)
    worker.drain()
    fix = MissionFeature.objects.get(generated_from=root)
    r2 = git_repo.commit(GOOD, "r2: the fix")
    task_complete(user=alice, task=task_create(user=alice, feature=fix), revision=r2)
    worker.drain()
    root.refresh_from_db()
    assert root.loop_state == "passed"
    assert [(r.revision, r.status) for r in runs_of(root)] == [(r1, "failed"), (r2, "passed")]

    admission = feature_validate(feature=root, user=alice)
    assert admission.run.revision == r2, (admission.outcome, admission.run.revision)
    from validation.selectors import feature_revision

    assert feature_revision(root) == r2
    worker.drain()
    root.refresh_from_db()
    assert root.loop_state == "passed" and ValidatorRun.objects.get(pk=admission.run.pk).status == RunStatus.PASSED

    again = feature_repair(feature=root, user=alice, mode="re_run")
    assert again.outcome == "started" and again.run.revision == r2
    worker.drain()
    root.refresh_from_db()
    assert root.loop_state == "passed" and ValidatorRun.objects.get(pk=again.run.pk).status == RunStatus.PASSED


# --- 13. long checks are not reaped --------------------------------------------------------------


def test_a_long_check_keeps_its_lease_and_is_never_reaped(sent, settings, build_mission, git_repo, tmp_path):
    from validation.services.recovery import reap_runs

    settings.FUSION_RUN_LEASE_SECONDS = 2
    settings.FUSION_RUN_HEARTBEAT_SECONDS = 0.2
    settings.FUSION_SANDBOX = "off"  # the check waits for a file of the test's, outside any sandbox
    flag = tmp_path / "go.flag"
    waiter = tmp_path / "waiter.py"
    waiter.write_text(
        textwrap.dedent(f"""
        import os, sys, time
        deadline = time.monotonic() + 120
        while not os.path.exists({str(flag)!r}):
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.05)
    """)
    )
    git_repo.commit(GOOD)
    build_mission({"hello": [("VAL-1", {"run": f"{sys.executable} {waiter}", "expect_exit": 0, "timeout": 900})]})
    feature = hello()
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    [message] = [m for m in sent if m.actor_name == "run_validator"]
    assert list(message.args) == [run.pk]

    outcome: dict = {}

    def judge():
        try:
            outcome["status"] = execute_run(run.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=judge, daemon=True)
    thread.start()
    try:

        def lease():
            return ValidatorRun.objects.filter(pk=run.pk).values_list("lease_until", flat=True).get()

        wait_for(lambda: lease() is not None, timeout=60, message="the run to be claimed")
        first = lease()
        wait_for(lambda: lease() >= first + timedelta(seconds=1.5), timeout=60, message="the lease to be renewed")
        assert reap_runs(now=first + timedelta(seconds=1)) == []
        wait_for(lambda: timezone.now() > first + timedelta(seconds=0.5), timeout=60, message="the first lease to pass")
        assert reap_runs() == []
        assert ValidatorRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
    finally:
        flag.write_text("go")
        thread.join(120)
    assert not thread.is_alive() and outcome["status"] == RunStatus.PASSED
    run.refresh_from_db()
    assert run.status == RunStatus.PASSED and run.error == ""
    feature.refresh_from_db()
    assert feature.loop_state == "passed"
    # The message carried a time limit that leaves room for the check's own 900 s.
    assert message.options.get("time_limit", 0) >= (settings.FUSION_VALIDATOR_TIMEOUT + 900) * 1000
    from validation.services.queueing import run_time_limit_ms

    assert message.options["time_limit"] == run_time_limit_ms(run) >= 900 * 1000


# --- 14. a fix that passes while its root is validating or blocked ------------------------------


def _root_failed_and_fix_in_flight(build_mission, git_repo, alice, **mission_fields):
    build_mission({"hello": [("VAL-1", GREETING)]}, **mission_fields)
    root = hello()
    task = task_create(user=alice, feature=root)
    r1 = git_repo.commit(BAD, "r1: wrong")
    task_complete(user=alice, task=task, revision=r1)
    assert task_outcome_process(task_id=task.pk) == "started"
    root.refresh_from_db()
    assert execute_run(root.last_run_id) == RunStatus.FAILED
    fix = MissionFeature.objects.get(generated_from=root)
    fix_task = task_create(user=alice, feature=fix)
    r2 = git_repo.commit(GOOD, "r2: the fix")
    task_complete(user=alice, task=fix_task, revision=r2)
    assert task_outcome_process(task_id=fix_task.pk) == "started"
    fix.refresh_from_db()
    root.refresh_from_db()
    assert fix.loop_state == "validating" and root.loop_state == "implementing"
    return root, fix, fix.last_run, r1, r2


def test_a_fix_passing_while_its_root_is_validating_re_judges_the_root_at_the_fix(
    idle_broker, build_mission, git_repo, alice
):
    root, fix, fix_run, r1, r2 = _root_failed_and_fix_in_flight(build_mission, git_repo, alice)
    busy = rerun(feature_id=root.pk, trigger="manual", cause="re_run")
    assert busy.outcome == "started" and busy.run.revision == r1
    root.refresh_from_db()
    assert root.loop_state == "validating"

    assert execute_run(fix_run.pk) == RunStatus.PASSED
    fix.refresh_from_db()
    root.refresh_from_db()
    assert fix.loop_state == "passed" and fix.stop_reason == ""
    assert ValidatorRun.objects.get(pk=busy.run.pk).status == RunStatus.CANCELLED
    current = ValidatorRun.objects.get(feature=root, status=RunStatus.RUNNING)
    assert current.revision == r2 and current.trigger == "fix"
    assert root.loop_state == "validating" and root.last_run_id == current.pk

    assert execute_run(busy.run.pk) == "stale"  # the cancelled judgement's late delivery changes nothing
    assert execute_run(current.pk) == RunStatus.PASSED
    root.refresh_from_db()
    assert root.loop_state == "passed"
    again = feature_repair(feature=root, user=alice, mode="re_run")
    assert again.outcome == "started" and again.run.revision == r2


def test_a_fix_passing_while_its_root_is_blocked_keeps_its_pass(idle_broker, build_mission, git_repo, alice):
    root, fix, fix_run, r1, r2 = _root_failed_and_fix_in_flight(build_mission, git_repo, alice, retry_budget=1)
    # The root is judged again at r1 meanwhile and fails: its budget is spent, it is blocked.
    busy = rerun(feature_id=root.pk, trigger="manual", cause="re_run")
    assert execute_run(busy.run.pk) == RunStatus.FAILED
    root.refresh_from_db()
    assert (root.loop_state, root.stop_reason) == ("blocked", "budget_exhausted")

    assert execute_run(fix_run.pk) == RunStatus.PASSED
    fix.refresh_from_db()
    root.refresh_from_db()
    assert (fix.loop_state, fix.stop_reason) == ("passed", "")
    assert (root.loop_state, root.stop_reason) == ("blocked", "budget_exhausted")
    assert not ValidatorRun.objects.filter(feature=root, status=RunStatus.RUNNING).exists()
    [note] = changes(root.mission, "fix-feature:root-blocked")
    assert note.payload["feature"] == root.pk and note.payload["fix"] == fix.pk and note.payload["run"] == fix_run.pk

    again = feature_repair(feature=root, user=alice, mode="re_run")
    assert again.outcome == "started" and again.run.revision == r2
    assert execute_run(again.run.pk) == RunStatus.PASSED
    root.refresh_from_db()
    assert root.loop_state == "passed"


# --- 15. claims are exclusive --------------------------------------------------------------------


def test_a_claim_is_exclusive_until_its_lease_passes(idle_broker, build_mission, git_repo):
    from validation.services.runner import _claim

    git_repo.commit(GOOD)
    build_mission({"hello": [("VAL-1", GREETING)]})
    run = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate").run
    first = _claim(run.pk)
    assert execute_run(run.pk) == "stale"  # another delivery while it is held judges nothing
    assert not JournalEntry.objects.filter(run=run).exists()
    assert ValidatorRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
    held, token = first
    assert held is not None and held.pk == run.pk and token
    assert _claim(run.pk) == (None, "")
    ValidatorRun.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timedelta(seconds=1))  # the holder died
    taken, second = _claim(run.pk)
    assert taken is not None and second and second != token
    assert ValidatorRun.objects.get(pk=run.pk).claim_token == second


def test_two_deliveries_at_once_judge_a_run_once(idle_broker, build_mission, git_repo):
    git_repo.commit(GOOD)
    slow = {"run": 'python -c "import time; time.sleep(1)"', "expect_exit": 0, "timeout": 60}
    build_mission({"hello": [("VAL-1", GREETING), ("VAL-2", slow)]})
    feature = hello()
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    results = race(lambda: execute_run(run.pk), lambda: execute_run(run.pk))
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(results) in (["passed", "stale"], ["passed", "passed"]), results
    assert results.count("stale") <= 1
    accepted = JournalEntry.objects.filter(run=run, kind="decision", key="final", payload__verdict="accepted")
    assert accepted.count() == 1
    checks = list(JournalEntry.objects.filter(run=run, kind="check").values_list("key", flat=True))
    assert sorted(checks) == ["VAL-1", "VAL-2"]  # each check ran once
    run.refresh_from_db()
    assert run.status == RunStatus.PASSED
    assert MissionEvent.objects.filter(type="validator-run:completed", payload__run=run.pk).count() == 1


# --- 14. a verdict wakes the autopilot only when it has work ------------------------------------


@pytest.mark.parametrize("autopilot", [False, True])
def test_a_verdict_notifies_the_autopilot_only_when_it_is_on(sent, build_mission, git_repo, autopilot):
    git_repo.commit(GOOD)
    build_mission({"hello": [("VAL-1", GREETING)]}, autopilot=autopilot)
    run = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate").run
    del sent[:]
    assert execute_run(run.pk) == "passed"
    assert hello().loop_state == "passed"
    woken = [list(m.args) for m in sent if m.actor_name == "autopilot_advance"]
    assert woken == ([[run.mission_id]] if autopilot else [])
