"""The `schema` output mode over real HTTP: the per-run verdict schema sent as
`response_format` in each `schema_format`, the reading tools still offered, the keyed
answer converted and host-validated, a refusal of the format named, the schema's hash
journaled with every request and reproduced by replay and resume."""

from __future__ import annotations

import json

import pytest
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.support.agent_env import add_profile, hello_feature, run_now, scripted, start_run  # noqa: F401
from tests.support.openai_server import ScriptedOpenAIServer
from validation import profiles, verdict_schema
from validation.journal import sha256_of, verify_chain
from validation.models import JournalEntry, RunStatus
from validation.replay import replay_run
from validation.services.run_input import input_fingerprint
from validation.services.runner import execute_run
from validation.validators.agent_models import register_model

pytestmark = pytest.mark.django_db(transaction=True)

TWO = [("VAL-1", None), ("VAL-2", {"file": "hello.py", "contains": "def hello"})]


def judged(verdict="pass", evidence=None, **fields):
    return {
        "verdict": verdict,
        "message": fields.get("message", f"it does {verdict}"),
        "expected": fields.get("expected", "hi" if verdict == "fail" else ""),
        "actual": fields.get("actual", "ho" if verdict == "fail" else ""),
        "evidence": evidence or [{"kind": "file", "path": "hello.py", "line": 2}],
    }


def answer(**items):
    return {"summary": "judged", "assertions": items}


GOOD = answer(**{"VAL-1": judged(), "VAL-2": judged()})


@pytest.fixture
def server(settings):
    """server(turns, response_formats=..., enforce_schema=..., **profile options), behind profile 'http'."""
    started = []

    def make(turns, *, response_formats=None, enforce_schema=True, refusal_status=400, **options):
        srv = ScriptedOpenAIServer(
            turns, response_formats=response_formats, enforce_schema=enforce_schema, refusal_status=refusal_status
        ).start()
        started.append(srv)
        profile = {"kind": "agent", "model": srv.model, "base_url": srv.base_url, "output_mode": "schema"}
        add_profile(settings, "http", {**profile, **options})
        return srv

    yield make
    for srv in started:
        srv.stop()


def sent_schema(request) -> dict:
    rf = request["body"]["response_format"]
    return rf["schema"] if rf["type"] == "json_object" else rf["json_schema"]["schema"]


def test_openai_format_with_tools_before_the_answer(server, hello_feature):
    srv = server([("tool", "read", {"path": "hello.py"}), ("text", json.dumps(GOOD))])
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    first, second = srv.requests
    rf = first["body"]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["name"] == "verdict" and rf["json_schema"]["strict"]
    schema = rf["json_schema"]["schema"]
    assert schema["properties"]["assertions"]["required"] == ["VAL-1", "VAL-2"]
    assert schema["properties"]["assertions"]["additionalProperties"] is False
    assert "status" not in schema["properties"]
    tools = {t["function"]["name"] for t in first["body"]["tools"]}
    assert tools == {"read", "grep", "find", "ls", "run_check"} and first["body"]["tool_choice"] == "auto"
    assert "1: def hello():" in [m for m in second["body"]["messages"] if m["role"] == "tool"][0]["content"]
    assert sent_schema(second) == schema  # the same schema on every request of the run
    assert "exactly these keys" in first["body"]["messages"][0]["content"]
    # The stored verdict is the contract's list form, its status derived by the host.
    assert run.verdict["status"] == "pass" and [a["key"] for a in run.verdict["assertions"]] == ["VAL-1", "VAL-2"]
    assert run.verdict["assertions"][0]["evidence"][0] == {"kind": "file", "text": "hello.py:2"}
    # The journal: the schema (a note) and its sha256 with every request.
    note = JournalEntry.objects.get(run=run, kind="note", key="verdict_schema:agent").payload
    assert note["schema"] == schema and note["sha256"] == sha256_of(schema) and note["schema_format"] == "openai"
    requests = JournalEntry.objects.filter(run=run, kind="model_request").order_by("seq")
    assert [r.payload["verdict_schema_sha256"] for r in requests] == [note["sha256"]] * 2
    report = replay_run(run.pk)
    assert report.ok, report.problems
    assert len(srv.requests) == 2  # the replay made no live call


def test_llama_cpp_format_and_control_characters_inside_lenient_strings(server, hello_feature, monkeypatch):
    # Strings without the pattern (LLAMA_STRINGS = "lenient") admit raw control characters.
    monkeypatch.setattr(verdict_schema, "LLAMA_STRINGS", "lenient")
    item = judged(message="line one\nline two")  # a raw newline: the text below is not strict JSON
    text = json.dumps(answer(**{"VAL-1": item, "VAL-2": judged()})).replace("\\n", "\n")
    srv = server([("text", text)], schema_format="llama_cpp", tools=[], response_formats=("json_object",))
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    rf = srv.requests[0]["body"]["response_format"]
    assert rf["type"] == "json_object" and rf["schema"]["properties"]["assertions"]["required"] == ["VAL-1", "VAL-2"]
    assert "tools" not in srv.requests[0]["body"]
    assert run.verdict["assertions"][0]["message"] == "line one\nline two"
    decision = JournalEntry.objects.get(run=run, kind="decision", key__startswith="decision:").payload
    assert decision["verdict"] == "accepted" and decision["parse"] == "json-lenient"
    assert replay_run(run.pk).ok and len(srv.requests) == 1


@pytest.mark.parametrize("status", [400, 500])  # 500: what llama-cpp-python's server answers
def test_a_refused_format_is_an_error_naming_the_option(server, hello_feature, status):
    srv = server([("text", json.dumps(GOOD))], response_formats=("json_object",), refusal_status=status)
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.ERROR and run.verdict is None
    assert run.error.startswith("misconfigured:") and "schema_format" in run.error and "llama_cpp" in run.error
    assert f"HTTP {status}" in run.error and "response_format type must be one of json_object" in run.error
    assert len(srv.requests) == (1 if status == 400 else 3)  # the client retries a 500 twice by itself
    report = replay_run(run.pk)
    assert report.ok, report.problems


def test_what_the_schema_cannot_say_is_still_refused_and_repaired(server, hello_feature):
    # An invisible format character (a zero-width space) is a string like any to a schema.
    hidden = {**judged(), "message": "it does\u200b pass"}
    srv = server(
        [("text", json.dumps(answer(**{"VAL-1": hidden, "VAL-2": judged()}))), ("text", json.dumps(GOOD))],
        tools=[],
    )
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.PASSED, run.error
    made = [e.payload for e in JournalEntry.objects.filter(run=run, kind="decision").exclude(key="final")]
    assert [d["verdict"] for d in made] == ["repair", "accepted"]
    assert made[0]["failed_validators"] == ["no_invisible_characters"]
    repair_turn = srv.requests[1]["body"]["messages"][-1]
    assert repair_turn["role"] == "user" and "VAL-1" in repair_turn["content"] and "invisible" in repair_turn["content"]
    assert replay_run(run.pk).ok


def test_a_server_that_ignores_the_schema_is_still_judged_by_the_host(server, hello_feature):
    missing = answer(**{"VAL-1": judged()})
    srv = server([("text", json.dumps(missing))] * 3, tools=[], enforce_schema=False)
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.ERROR and run.verdict is None and run.error.startswith("invalid_verdict:")
    assert "VAL-2: missing" in run.error and len(srv.requests) == 3
    assert replay_run(run.pk).ok


def test_a_fail_reaches_the_run_and_a_declared_check_stays_final(server, hello_feature):
    fail = judged("fail", evidence=[{"kind": "other", "text": "returns ho"}])
    server([("text", json.dumps(answer(**{"VAL-1": fail, "VAL-2": judged("blocked")})))], tools=[])
    run = run_now(hello_feature(TWO, validator="http"))
    assert run.status == RunStatus.FAILED, run.error
    by_key = {a["key"]: a for a in run.verdict["assertions"]}
    assert by_key["VAL-1"]["verdict"] == "fail" and by_key["VAL-2"]["verdict"] == "pass"  # the check decided


class WorkerDied(BaseException):
    """Stands in for the SIGKILL of the worker (tests/validation/test_agent_worker_kill.py)."""


def test_resume_reuses_the_journaled_schema(scripted, hello_feature):
    died = {"once": False}

    def dies_once(context):
        if not died["once"]:
            died["once"] = True
            raise WorkerDied("killed after the first answer was journaled")
        return ("verdict", GOOD)

    fn = scripted([("tool", "read", {"path": "hello.py"}), dies_once], output_mode="schema", schema_format="llama_cpp")
    run = start_run(hello_feature(TWO))
    with pytest.raises(WorkerDied):
        execute_run(run.pk)
    note = JournalEntry.objects.get(run=run, kind="note", key="verdict_schema:agent")
    assert execute_run(run.pk) == RunStatus.PASSED
    assert [c["index"] for c in fn.calls] == [0, 1, 1]  # the answered call was not sent again
    assert JournalEntry.objects.filter(run=run, kind="note", key="verdict_schema:agent").count() == 1
    digests = {e.payload["verdict_schema_sha256"] for e in JournalEntry.objects.filter(run=run, kind="model_request")}
    assert digests == {note.payload["sha256"]}
    assert verify_chain(run.pk).ok and replay_run(run.pk).ok and len(fn.calls) == 3


def test_the_schema_reaches_an_in_process_model_in_its_settings(settings, hello_feature):
    seen = []

    def model_fn(messages, info: AgentInfo) -> ModelResponse:
        seen.append(info.model_settings)
        return ModelResponse(parts=[TextPart(json.dumps(GOOD))])

    register_model("schema-in-process", FunctionModel(model_fn))
    try:
        add_profile(settings, "local", {"kind": "agent", "model": "schema-in-process", "output_mode": "schema"})
        run = run_now(hello_feature(TWO, validator="local"))
    finally:
        register_model("schema-in-process", None)
    assert run.status == RunStatus.PASSED, run.error
    rf = seen[0]["extra_body"]["response_format"]
    note = JournalEntry.objects.get(run=run, kind="note", key="verdict_schema:agent").payload
    assert rf["json_schema"]["schema"] == note["schema"]


def test_profile_options_and_the_fingerprint(settings):
    add_profile(settings, "s", {"kind": "agent", "model": "m", "output_mode": "schema", "schema_format": "llama_cpp"})
    add_profile(settings, "bad", {"kind": "agent", "model": "m", "output_mode": "schema", "schema_format": "vllm"})
    add_profile(settings, "stray", {"kind": "agent", "model": "m", "schema_format": "openai"})
    add_profile(settings, "o", {"kind": "agent", "model": "m", "output_mode": "schema"})
    add_profile(settings, "mixed", {"kind": "composite", "agent": "s"})
    assert (
        "schema_format must be one of openai, llama_cpp"
        in profiles.profile_problems("bad", profiles.all_profiles()["bad"])[0]
    )
    assert "needs output_mode 'schema'" in profiles.profile_problems("stray", profiles.all_profiles()["stray"])[0]
    config = profiles.public_config(profiles.get_profile("s"))
    assert config["verdict_schema_version"] >= 1
    assert profiles.public_config(profiles.get_profile("mixed"))["agent_config"]["verdict_schema_version"] >= 1

    def fingerprint(name):
        assertions = [{"key": "VAL-1", "statement": "s", "check": None}]
        return input_fingerprint(revision="r", assertions=assertions, profile=profiles.get_profile(name))

    assert fingerprint("s") != fingerprint("o")  # the schema's form is part of the validator


def test_what_the_host_implies_is_in_the_fingerprint(settings, monkeypatch):
    add_profile(settings, "near", {"kind": "agent", "model": "m", "base_url": "http://127.0.0.1:1/v1"})
    add_profile(
        settings, "llama", {"kind": "agent", "model": "m", "output_mode": "schema", "schema_format": "llama_cpp"}
    )

    def fingerprint(name):
        assertions = [{"key": "VAL-1", "statement": "s", "check": None}]
        return input_fingerprint(revision="r", assertions=assertions, profile=profiles.get_profile(name))

    assert profiles.public_config(profiles.get_profile("near"))["max_tokens_field"] == "max_tokens"
    before = fingerprint("near")
    add_profile(
        settings,
        "near",
        {
            "kind": "agent",
            "model": "m",
            "base_url": "http://127.0.0.1:1/v1",
            "max_tokens_field": "max_completion_tokens",
        },
    )
    assert fingerprint("near") != before  # the limit reaches the server in another field
    strings = fingerprint("llama")
    monkeypatch.setattr(verdict_schema, "LLAMA_STRINGS", "lenient")
    assert fingerprint("llama") != strings  # another grammar for the same keys
