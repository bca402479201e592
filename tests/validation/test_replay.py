"""`replay_run`: every answer from the journal, no live call, the same verdict hash."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from tests.support.agent_env import hello_feature, run_now, scripted  # noqa: F401
from tests.support.verdicts import item, verdict
from validation.journal import JournalIntegrityError, sha256_of
from validation.models import JournalEntry, RunStatus
from validation.replay import replay_run

pytestmark = pytest.mark.django_db(transaction=True)

TWO = [("VAL-1", None), ("VAL-2", None)]
GOOD = verdict(item("VAL-1", evidence=[{"kind": "file", "text": "hello.py:1"}]), item("VAL-2"))


def replay_cli(run_id: int) -> tuple[int, dict]:
    import io

    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("replay_run", str(run_id), "--json", stdout=out)
    return exit_info.value.code, json.loads(out.getvalue())


def test_replay_of_a_passed_run_with_tools(scripted, hello_feature):
    fn = scripted([("tool", "grep", {"pattern": "def hello"}), ("verdict", GOOD)])
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.PASSED
    code, result = replay_cli(run.pk)
    assert code == 0 and result["ok"], result
    assert result["replayed"] == "pass" and result["verdict_sha256"] == sha256_of(run.verdict)
    assert result["recorded_sha256"] == result["verdict_sha256"] == result["stored_verdict_sha256"]
    assert result["tokens"] == {"in": run.tokens_in, "out": run.tokens_out}
    assert len(fn.calls) == 2  # nothing was sent during the replay


def test_replay_of_a_failed_run(scripted, hello_feature):
    fn = scripted([("verdict", verdict(item("VAL-1"), item("VAL-2", "fail")))])
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.FAILED
    report = replay_run(run.pk)
    assert report.ok and report.replayed == "fail" and report.verdict_sha256 == sha256_of(run.verdict)
    assert len(fn.calls) == 1


def test_replay_of_a_repaired_run_judges_each_candidate_again(scripted, hello_feature):
    fn = scripted([("verdict", verdict(item("VAL-1"))), ("verdict", {**GOOD, "summary": "x\u200b"}), ("verdict", GOOD)])
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.PASSED
    assert [e.payload["verdict"] for e in JournalEntry.objects.filter(run=run, kind="decision").order_by("seq")] == [
        "repair",
        "repair",
        "accepted",
        "accepted",
    ]
    report = replay_run(run.pk)
    assert report.ok, report.problems
    assert len(fn.calls) == 3


def test_replay_of_an_error_run_reproduces_the_error(scripted, hello_feature):
    scripted([("verdict", verdict(item("VAL-1")))] * 2, max_repairs=1)
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR
    report = replay_run(run.pk)
    assert report.ok and report.replayed == "error" and report.error_code == "invalid_verdict"


def test_replay_of_a_checks_run(hello_feature):
    run = run_now(
        hello_feature(
            [("VAL-1", {"file": "hello.py", "contains": "def hello"}), ("VAL-2", {"run": "python hello.py"})],
            validator="checks",
        )
    )
    assert run.status == RunStatus.PASSED
    report = replay_run(run.pk)
    assert report.ok, report.problems


def test_tampered_entry_is_named(scripted, hello_feature):
    scripted([("tool", "ls", {}), ("verdict", GOOD)])
    run = run_now(hello_feature(TWO))
    entry = JournalEntry.objects.get(run=run, kind="tool_result")
    JournalEntry.objects.filter(pk=entry.pk).update(payload={**entry.payload, "output": "hello.py\nforged.py"})
    with pytest.raises(JournalIntegrityError) as info:
        replay_run(run.pk)
    assert info.value.seq == entry.seq and f"journal entry {entry.seq} (tool_result" in str(info.value)
    code, result = replay_cli(run.pk)
    assert code == 2 and result["first_bad_seq"] == entry.seq and not result["ok"]


def test_replay_human_output(scripted, hello_feature, capsys):
    scripted([("verdict", GOOD)])
    run = run_now(hello_feature(TWO))
    import io

    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("replay_run", str(run.pk), stdout=out)
    assert exit_info.value.code == 0
    text = out.getvalue()
    assert f"run {run.pk}: reproduced (recorded passed, replayed pass)" in text and "chain verified" in text


def test_replay_of_a_composite_run_with_an_agent(scripted, hello_feature, settings):
    from tests.support.agent_env import add_profile

    fn = scripted([("verdict", verdict(item("VAL-2")))])
    add_profile(settings, "mixed", {"kind": "composite", "agent": "scripted"})
    run = run_now(
        hello_feature([("VAL-1", {"file": "hello.py", "contains": "def hello"}), ("VAL-2", None)], validator="mixed")
    )
    assert run.status == RunStatus.PASSED, run.error
    assert [a["key"] for a in run.verdict["assertions"]] == ["VAL-1", "VAL-2"]
    assert JournalEntry.objects.filter(run=run, kind="check", key="VAL-1").exists()
    report = replay_run(run.pk)
    assert report.ok, report.problems
    assert len(fn.calls) == 1


def test_replay_of_a_run_that_timed_out_mid_call(scripted, hello_feature):
    import time

    def slow(context):
        time.sleep(3)
        return ("verdict", GOOD)

    fn = scripted([("tool", "ls", {}), slow], timeout=2)
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR and run.error.startswith("timeout:")
    report = replay_run(run.pk)
    assert report.ok and report.replayed == "error" and report.error_code == "timeout", report
    # Where the clock ran out is timing: the slow answer was never journaled (the replay
    # stops at that call), or it was, just before the host's decision (the replay goes on
    # to a verdict that was never accepted). Either way nothing is sent.
    answered = JournalEntry.objects.filter(run=run, kind="model_response").count() == 2
    assert ("never accepted" if answered else "while this call was unanswered") in report.notes[-1]
    assert len(fn.calls) == 2


def test_a_timed_out_run_whose_replay_diverges_is_not_reproduced(scripted, hello_feature, monkeypatch):
    """A timeout excuses a journal that ends early, not one the replay leaves mid-way."""
    import time

    from validation.validators import agent

    def slow(context):
        time.sleep(3)
        return ("verdict", GOOD)

    scripted([("tool", "ls", {}), slow], timeout=2)
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR and run.error.startswith("timeout:")
    # the replay builds other requests than the run sent (as a changed prompt would)
    original = agent.request_document
    monkeypatch.setattr(agent, "request_document", lambda *a: {**original(*a), "changed": True})
    report = replay_run(run.pk)
    assert not report.ok and report.problems and "model call 1" in report.problems[0], report


def test_replay_through_the_api(scripted, hello_feature, api_for, alice, django_user_model):
    bob = django_user_model.objects.create_user("bob")  # signed in, a member of nothing
    fn = scripted([("tool", "ls", {}), ("verdict", GOOD)])
    run = run_now(hello_feature(TWO))
    url = f"/api/validation-runs/{run.pk}/replay/"
    answer = api_for(alice).post(url)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["ok"] and body["run"] == run.pk and body["replayed"] == "pass"
    assert body["verdict_sha256"] == sha256_of(run.verdict) and body["problems"] == []
    assert len(fn.calls) == 2  # the replay sent nothing
    # not a member: the run does not exist for them; anonymous: refused
    assert api_for(bob).post(url).json()["code"] == "not_found"
    assert api_for().post(url).status_code in (401, 403)
    # a tampered journal is a result of the replay, naming the first bad entry
    JournalEntry.objects.filter(run=run, seq=2).update(payload={"forged": True})
    body = api_for(alice).post(url).json()
    assert body["ok"] is False and body["first_bad_seq"] == 2 and "entry 2" in body["integrity_error"]


def test_a_running_run_is_not_replayed(scripted, hello_feature, api_for, alice):
    from tests.support.agent_env import start_run

    scripted([("verdict", GOOD)])
    run = start_run(hello_feature(TWO))
    answer = api_for(alice).post(f"/api/validation-runs/{run.pk}/replay/")
    assert answer.status_code == 409 and answer.json()["code"] == "run_running"
