"""The agent validator over real HTTP: pydantic-ai's OpenAI provider against a scripted
OpenAI-compatible server on 127.0.0.1 that records every request."""

from __future__ import annotations

import json

import pytest

from tests.support.agent_env import hello_feature, openai_server, run_now  # noqa: F401
from tests.support.verdicts import host_rejections, item, verdict
from validation.models import JournalEntry, RunStatus
from validation.replay import replay_run

pytestmark = pytest.mark.django_db(transaction=True)

TWO = [("VAL-1", None), ("VAL-2", {"file": "hello.py", "contains": "def hello"})]
GOOD = verdict(item("VAL-1", evidence=[{"kind": "file", "text": "hello.py:2"}]), item("VAL-2"))
BAD = verdict(item("VAL-1"))


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("FUSION_TEST_LLM_KEY", "sk-test-key-for-the-scripted-server")


def roles(request):
    return [m["role"] for m in request["body"]["messages"]]


def test_pass_with_tool_use_over_http(openai_server, hello_feature):
    server = openai_server(
        [("tools", [("read", {"path": "hello.py"}), ("run_check", {"key": "VAL-2"})]), ("verdict", GOOD)],
        api_key_env="FUSION_TEST_LLM_KEY",
        temperature=0,
    )
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    first, second = server.requests
    assert first["headers"]["authorization"] == "Bearer sk-test-key-for-the-scripted-server"
    body = first["body"]
    assert body["model"] == server.model and body["temperature"] == 0 and body["tool_choice"] == "required"
    assert {t["function"]["name"] for t in body["tools"]} == {
        "read",
        "grep",
        "find",
        "ls",
        "run_check",
        "submit_verdict",
    }
    assert "Judge every linked assertion exactly once" in body["messages"][0]["content"]
    assert "VAL-1" in body["messages"][1]["content"]
    assert roles(second) == ["system", "user", "assistant", "tool", "tool"]
    tool_answers = [m["content"] for m in second["body"]["messages"] if m["role"] == "tool"]
    assert "1: def hello():" in tool_answers[0] and '"verdict": "pass"' in tool_answers[1]
    assert run.tokens_in > 0 and run.tokens_out > 0
    assert (
        sum(e.payload["usage"]["input_tokens"] for e in JournalEntry.objects.filter(run=run, kind="model_response"))
        == run.tokens_in
    )


@pytest.mark.parametrize("validator", sorted(host_rejections()))
def test_each_host_validator_rejection_is_repaired_over_http(openai_server, hello_feature, validator):
    bad, offender = host_rejections()[validator]
    server = openai_server([("verdict", bad), ("verdict", GOOD)])
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    repair_turn = server.requests[1]["body"]["messages"][-1]
    assert repair_turn["role"] == "tool" and repair_turn["tool_call_id"] == "call_0_0"
    assert f"- {validator}:" in repair_turn["content"] and offender in repair_turn["content"]
    assert "Repairs remaining, this one included: 2 of 2" in repair_turn["content"]


def test_repairs_exhausted_over_http(openai_server, hello_feature):
    server = openai_server([("verdict", BAD)] * 3)
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.ERROR and run.verdict is None and "after 2 of 2 repairs" in run.error
    assert server.turns_received() == [0, 1, 2]


def test_raising_host_validator_over_http(openai_server, hello_feature, monkeypatch):
    from validation import verdict as contract
    from validation.validators import repair

    def boom(v, ctx):
        raise KeyError("defect")

    real = contract.run_host_validators
    monkeypatch.setattr(
        repair,
        "run_host_validators",
        lambda v, ctx: real(v, ctx, validators=(("boom", boom),) + contract.HOST_VALIDATORS),
    )
    server = openai_server([("verdict", GOOD)])
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.ERROR and run.verdict is None and run.error.startswith("host_defect:")
    assert len(server.requests) == 1 and not JournalEntry.objects.filter(run=run, kind="decision").exists()


def test_escape_attempt_over_http(openai_server, hello_feature):
    server = openai_server(
        [("tools", [("read", {"path": "../../etc/passwd"}), ("ls", {"path": "/"})]), ("verdict", GOOD)]
    )
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    answers = [m["content"] for m in server.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert len(answers) == 2 and all(a.startswith("refused:") for a in answers) and "root:" not in "".join(answers)


def test_native_mode_with_a_json_object_schema_server(openai_server, hello_feature):
    server = openai_server(
        [("verdict", BAD), ("verdict", GOOD)], output_mode="native", native_format="json_object", tool_choice="auto"
    )
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    body = server.requests[0]["body"]
    assert body["response_format"]["type"] == "json_object"
    assert body["response_format"]["schema"]["properties"]["assertions"]["type"] == "array"
    assert body["tool_choice"] == "auto" and "submit_verdict" not in json.dumps(body["tools"])
    assert roles(server.requests[1])[-1] == "user"  # the repair turn of a text answer


def test_prompted_mode(openai_server, hello_feature):
    server = openai_server([("verdict", GOOD)], output_mode="prompted", tools=[])
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    body = server.requests[0]["body"]
    assert replay_run(run.pk).ok
    assert "tools" not in body and body["response_format"] == {"type": "json_object"}
    assert any('"assertions"' in m["content"] for m in body["messages"]), body["messages"]


def test_naming_the_output_tool(openai_server, hello_feature):
    server = openai_server([("verdict", GOOD)], tool_choice="output")
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    assert server.requests[0]["body"]["tool_choice"] == {"type": "function", "function": {"name": "submit_verdict"}}


def test_replay_of_an_http_run_sends_nothing(openai_server, hello_feature):
    server = openai_server([("tool", "find", {"pattern": "*.py"}), ("verdict", BAD), ("verdict", GOOD)])
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    sent = len(server.requests)
    report = replay_run(run.pk)
    assert report.ok, report.problems
    assert len(server.requests) == sent == 3


def test_token_budget_over_http(openai_server, hello_feature):
    server = openai_server([("tool", "ls", {}), ("verdict", GOOD)], usage=(3000, 100), token_budget=3500)
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.ERROR and run.error.startswith("budget_exceeded:")
    assert len(server.requests) == 1 and (run.tokens_in, run.tokens_out) == (3000, 100)


def test_unreachable_server_is_a_run_error(settings, hello_feature):
    from tests.support.agent_env import add_profile

    add_profile(settings, "http", {"kind": "agent", "model": "m", "base_url": "http://127.0.0.1:9/v1", "timeout": 5})
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.ERROR and run.error.startswith("model_unavailable:"), run.error


@pytest.mark.parametrize("field", [None, "max_tokens", "max_completion_tokens"])
def test_the_output_limit_reaches_the_server_in_the_field_it_reads(openai_server, hello_feature, field):
    # llama-cpp-python's server reads only `max_tokens`: a limit sent as the other field
    # is ignored there, and the model writes until its context is full.
    server = openai_server([("verdict", GOOD)], max_tokens=321, **({"max_tokens_field": field} if field else {}))
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    body = server.requests[0]["body"]
    sent = field or "max_tokens"
    unsent = {"max_tokens", "max_completion_tokens"} - {sent}
    assert body[sent] == 321 and not unsent & set(body)
