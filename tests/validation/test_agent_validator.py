"""The agent validator with scripted FunctionModel conversations."""

from __future__ import annotations

import pytest

from tests.support.agent_env import hello_feature, run_now, scripted  # noqa: F401
from tests.support.verdicts import host_rejections, item, passing, verdict
from validation.journal import verify_chain
from validation.models import JournalEntry, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def kinds(run):
    return list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))


def test_pass_with_tool_use_inside_the_snapshot(scripted, hello_feature):
    fn = scripted(
        [
            ("tool", "read", {"path": "hello.py"}),
            ("verdict", verdict(item("VAL-1", evidence=[{"kind": "file", "text": "hello.py:1"}]))),
        ]
    )
    feature = hello_feature([("VAL-1", None)])
    run = run_now(feature)
    assert run.status == RunStatus.PASSED, run.error
    assert len(fn.calls) == 2
    assert "1: def hello():" in fn.calls[1]["text"]
    assert kinds(run) == [
        "note",
        "model_request",
        "model_response",
        "tool_call",
        "tool_result",
        "model_request",
        "model_response",
        "decision",
        "decision",
    ]
    assert run.tokens_in == 200 and run.tokens_out == 40
    assert verify_chain(run.pk).ok


def decisions(run):
    return [
        e.payload for e in JournalEntry.objects.filter(run=run, kind="decision").exclude(key="final").order_by("seq")
    ]


TWO = [("VAL-1", None), ("VAL-2", None)]
GOOD = verdict(item("VAL-1"), item("VAL-2"))
BAD = host_rejections()


@pytest.mark.parametrize("validator", sorted(BAD))
def test_each_host_validator_rejects_once_then_accepts(scripted, hello_feature, validator):
    bad, offender = BAD[validator]
    fn = scripted([("verdict", bad), ("verdict", GOOD)])
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.PASSED, run.error
    first, second = decisions(run)
    assert first["verdict"] == "repair" and first["failed_validators"] == [validator]
    assert first["repairs_used"] == 0 and first["max_repairs"] == 2 and first["candidate"] == bad
    assert first["candidate_sha256"] and first["candidate_size"] > 0
    assert second["verdict"] == "accepted" and second["repairs_used"] == 1 and "candidate" not in second
    feedback = fn.calls[1]["text"]
    assert f"- {validator}:" in feedback and offender in feedback
    assert "Repairs remaining, this one included: 2 of 2" in feedback
    assert verify_chain(run.pk).ok


def test_repairs_exhausted_ends_in_error_without_verdict(scripted, hello_feature):
    bad = BAD["keys_accounted"][0]
    fn = scripted([("verdict", bad), ("verdict", bad)], max_repairs=1)
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR and run.verdict is None
    assert run.error.startswith("invalid_verdict: the verdict stayed invalid after 1 of 1 repairs")
    assert "VAL-2: missing" in run.error
    assert [d["verdict"] for d in decisions(run)] == ["repair", "rejected"]
    assert len(fn.calls) == 2
    assert not JournalEntry.objects.filter(run=run, key="final").exists()


def test_zero_repairs_means_first_rejection_is_final(scripted, hello_feature):
    fn = scripted([("verdict", BAD["evidence_present"][0])], max_repairs=0)
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR and len(fn.calls) == 1
    assert [d["verdict"] for d in decisions(run)] == ["rejected"]


def test_raising_host_validator_is_a_host_defect(scripted, hello_feature, monkeypatch):
    from validation import verdict as contract
    from validation.validators import repair

    def boom(v, ctx):
        raise RuntimeError("the validator itself is broken")

    real = contract.run_host_validators
    monkeypatch.setattr(
        repair,
        "run_host_validators",
        lambda v, ctx: real(v, ctx, validators=contract.HOST_VALIDATORS + (("boom", boom),)),
    )
    fn = scripted([("verdict", GOOD)])
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR and run.verdict is None
    assert run.error.startswith("host_defect: host validator boom raised RuntimeError")
    assert decisions(run) == [] and len(fn.calls) == 1  # nothing judged, no repair granted


def test_hash_only_policy_keeps_no_rejected_bytes_and_says_why(scripted, hello_feature):
    scripted([("verdict", BAD["keys_accounted"][0]), ("verdict", GOOD)], journal_policy="hash-only")
    run = run_now(hello_feature(TWO))
    first = decisions(run)[0]
    assert "candidate" not in first and first["bytes_unavailable_reason"] == "hash-only-persistence"
    assert first["policy"] == "hash-only" and len(first["candidate_sha256"]) == 64


@pytest.mark.parametrize("mode", ["native", "prompted"])
def test_text_output_modes(scripted, hello_feature, mode):
    scripted([("verdict", BAD["keys_accounted"][0]), ("verdict", GOOD)], output_mode=mode)
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.PASSED, run.error
    first = decisions(run)[0]
    assert first["verdict"] == "repair" and first["call_id"] == "1:text"


def test_fail_verdict_records_failures(scripted, hello_feature):
    scripted([("verdict", verdict(item("VAL-1"), item("VAL-2", "fail", expected="hi", actual="bye")))])
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.FAILED
    assert list(run.failures.values_list("assertion_key", "expected", "actual")) == [("VAL-2", "hi", "bye")]


def test_token_budget_stops_before_overspending(scripted, hello_feature):
    fn = scripted([("tool", "ls", {}), ("verdict", GOOD)], usage=(900, 50), token_budget=1500)
    feature = hello_feature(TWO)
    run = run_now(feature)
    assert run.status == RunStatus.ERROR and run.error.startswith(
        "budget_exceeded: the run's budget of 1500 tokens would be exceeded"
    )
    assert len(fn.calls) == 1  # the second request was never sent
    assert (run.tokens_in, run.tokens_out) == (900, 50)
    feature.refresh_from_db()
    assert feature.loop_state == "blocked" and feature.stop_reason == "validator_unavailable"  # not retried


def test_missing_api_key_variable_is_a_run_error(settings, hello_feature, monkeypatch):
    from tests.support.agent_env import add_profile

    monkeypatch.delenv("FUSION_TEST_NO_SUCH_KEY", raising=False)
    add_profile(
        settings, "scripted", {"kind": "agent", "model": "openai:gpt-4o", "api_key_env": "FUSION_TEST_NO_SUCH_KEY"}
    )
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR
    assert (
        run.error == "misconfigured: the environment variable FUSION_TEST_NO_SUCH_KEY named by api_key_env is not set"
    )


def test_a_model_that_never_submits_a_verdict_ends_in_error(scripted, hello_feature):
    fn = scripted([("text", "I believe it works.")] * 3, max_repairs=2)
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR and run.verdict is None
    assert run.error.startswith("invalid_verdict: the model's output stayed unusable")
    assert len(fn.calls) == 3 and decisions(run) == []


def test_an_agent_past_its_timeout_ends_in_timeout(scripted, hello_feature):
    import time

    def slow(context):
        time.sleep(3)
        return ("verdict", GOOD)

    scripted([slow], timeout=1)
    run = run_now(hello_feature(TWO))
    assert run.status == RunStatus.ERROR and run.error == "timeout: the agent did not finish within 1s"
