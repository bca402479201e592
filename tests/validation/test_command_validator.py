"""The command validator with small scripts standing in for an agent CLI."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from tests.support.agent_env import add_profile, hello_feature, run_now  # noqa: F401
from tests.support.verdicts import item, verdict
from validation.models import JournalEntry, RunStatus
from validation.replay import replay_run
from validation.validators.command import read_stdout

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = verdict(item("VAL-1", evidence=[{"kind": "file", "text": "hello.py:1"}]))


@pytest.fixture
def command_profile(settings, tmp_path):
    def make(body: str, **options) -> None:
        script = tmp_path / f"validator_{len(list(tmp_path.glob('validator_*.py')))}.py"
        script.write_text("import json, sys\nprompt = sys.stdin.read()\n" + textwrap.dedent(body))
        add_profile(settings, "cmd", {"kind": "command", "command": [sys.executable, str(script)], **options})

    return make


def decisions(run):
    return [
        e.payload for e in JournalEntry.objects.filter(run=run, kind="decision").exclude(key="final").order_by("seq")
    ]


def test_valid_json_on_stdout(command_profile, hello_feature):
    command_profile(f"""
        assert "VAL-1" in prompt and "print exactly one JSON object" in prompt and '"assertions"' in prompt
        sys.stderr.write("some progress noise\\n")
        print(json.dumps({GOOD!r}))
    """)
    run = run_now(hello_feature([("VAL-1", None)], validator="cmd"))
    assert run.status == RunStatus.PASSED, run.error
    [decision] = decisions(run)
    assert decision["verdict"] == "accepted" and decision["parse"] == "json"
    response = JournalEntry.objects.get(run=run, kind="model_response").payload
    assert response["exit_code"] == 0 and "some progress noise" in response["stderr_tail"]


def test_single_fenced_block_is_accepted_and_recorded(command_profile, hello_feature):
    command_profile(f"""
        print("Here is my verdict:")
        print("```json")
        print(json.dumps({GOOD!r}, indent=2))
        print("```")
    """)
    run = run_now(hello_feature([("VAL-1", None)], validator="cmd"))
    assert run.status == RunStatus.PASSED, run.error
    assert decisions(run)[0]["parse"] == "fenced"


def test_invalid_then_valid_is_repaired_by_reinvocation(command_profile, hello_feature):
    command_profile(f"""
        if "## Repair" in prompt:
            assert "keys_accounted" in prompt and "VAL-1" in prompt and '"status": "pass"' in prompt
            print(json.dumps({GOOD!r}))
        else:
            print(json.dumps({{"status": "pass", "assertions": []}}))
    """)
    run = run_now(hello_feature([("VAL-1", None)], validator="cmd"))
    assert run.status == RunStatus.PASSED, run.error
    assert [d["verdict"] for d in decisions(run)] == ["repair", "accepted"]
    assert JournalEntry.objects.filter(run=run, kind="model_request").count() == 2
    assert replay_run(run.pk).ok


def test_prose_is_not_a_verdict_and_repairs_run_out(command_profile, hello_feature):
    command_profile(
        """
        print("I think it passes.")
    """,
        max_repairs=1,
    )
    run = run_now(hello_feature([("VAL-1", None)], validator="cmd"))
    assert run.status == RunStatus.ERROR and run.verdict is None
    assert [d["verdict"] for d in decisions(run)] == ["repair", "rejected"]
    assert decisions(run)[0]["parse"] == "text" and decisions(run)[0]["candidate"] == "I think it passes.\n"
    assert "no JSON document was found" in run.error


def test_hanging_command_is_killed_and_the_run_errors(command_profile, hello_feature):
    command_profile(
        """
        import time
        time.sleep(60)
    """,
        timeout=2,
    )
    run = run_now(hello_feature([("VAL-1", None)], validator="cmd"))
    assert run.status == RunStatus.ERROR
    assert run.error.startswith("timeout: the validator command did not finish within 2s")


def test_failing_command_is_a_validator_error(command_profile, hello_feature):
    command_profile("""
        sys.stderr.write("agent CLI: not logged in\\n")
        sys.exit(3)
    """)
    run = run_now(hello_feature([("VAL-1", None)], validator="cmd"))
    assert run.status == RunStatus.ERROR and run.error.startswith("validator_error: the validator command exited 3")
    assert "not logged in" in run.error


def test_the_command_gets_a_scrubbed_environment(command_profile, hello_feature, monkeypatch):
    monkeypatch.setenv("FUSION_SECRET_FOR_TEST", "do-not-leak-me")
    monkeypatch.setenv("AGENT_CLI_KEY", "the-agent-key")
    command_profile(
        f"""
        import os
        assert "FUSION_SECRET_FOR_TEST" not in os.environ
        assert os.environ["AGENT_CLI_KEY"] == "the-agent-key"
        print(json.dumps({GOOD!r}))
    """,
        api_key_env="AGENT_CLI_KEY",
    )
    run = run_now(hello_feature([("VAL-1", None)], validator="cmd"))
    assert run.status == RunStatus.PASSED, run.error


@pytest.mark.parametrize(
    "text, parse",
    [
        ('{"a": 1}', "json"),
        ('  \n{"a": 1}\n', "json"),
        ('x\n```json\n{"a": 1}\n```\ny', "fenced"),
        ('```json\n{"a": 1}\n```\n```json\n{"a": 2}\n```', "text"),  # two blocks: ambiguous
        ('{"a": NaN}', "text"),
        ('{"a": 1, "a": 2}', "text"),
        ('```\n{"a": 1}\n```', "text"),  # only a ```json block counts
    ],
)
def test_read_stdout_is_strict(text, parse):
    assert read_stdout(text)[1] == parse
