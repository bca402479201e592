"""Validator profiles: what `manage.py check` reports, what a run does with a bad one,
and fingerprint reuse for agent profiles."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from tests.support.agent_env import hello_feature, run_now, scripted, start_run  # noqa: F401
from tests.support.verdicts import passing
from validation import profiles
from validation.services.verdicts.admit import feature_admit

AGENT = {"kind": "agent", "model": "openai:gpt-4o"}


@pytest.mark.parametrize(
    "profile, problem",
    [
        ({"kind": "agent"}, "needs 'model'"),
        ({**AGENT, "api_key": "sk-x"}, "never put the key in the profile"),
        ({**AGENT, "api_key_env": "not a name"}, "api_key_env must be the NAME"),
        ({**AGENT, "output_mode": "json"}, "output_mode must be one of tool, native, prompted"),
        ({**AGENT, "journal_policy": "none"}, "journal_policy must be one of transcript, hash-only"),
        ({**AGENT, "max_repairs": -1}, "max_repairs must be an integer between 0 and 10"),
        ({**AGENT, "max_repairs": True}, "max_repairs must be an integer"),
        ({**AGENT, "token_budget": "lots"}, "token_budget must be an integer at least 0"),
        ({**AGENT, "timeout": 0}, "timeout must be an integer between 1"),
        ({**AGENT, "temperature": 3}, "temperature must be a number between 0 and 2"),
        ({**AGENT, "base_url": "ftp://x"}, "base_url must be an http(s) URL"),
        ({**AGENT, "tools": ["read", "shell"]}, "tools must be a list drawn from"),
        ({**AGENT, "max_repair": 3}, "unknown option 'max_repair'"),
        ({**AGENT, "tool_choice": "output", "output_mode": "native"}, "tool_choice 'output' needs output_mode 'tool'"),
        ({"kind": "command"}, "a command profile needs 'command'"),
        ({"kind": "command", "command": ["ok", 3]}, "a command profile needs 'command'"),
        ({"kind": "command", "command": "x", "shell": "yes"}, "shell must be true or false"),
        ({"kind": "composite", "agent": "nowhere"}, "unknown agent profile 'nowhere'"),
        ({"kind": "composite", "agent": "checks"}, "must name an agent or command profile"),
        ({"kind": "robot"}, "kind must be one of"),
    ],
)
def test_profile_problems(profile, problem):
    problems = profiles.profile_problems("p", profile)
    assert any(problem in p for p in problems), problems
    assert all(p.startswith("validator profile 'p': ") for p in problems)


def test_good_profiles_have_no_problems(settings):
    settings.FUSION_VALIDATORS = {
        "local": {
            "kind": "agent",
            "base_url": "http://127.0.0.1:8080/v1",
            "model": "m",
            "api_key_env": "LOCAL_LLM_KEY",
            "output_mode": "tool",
            "max_repairs": 2,
            "temperature": 0.2,
            "timeout": 60,
            "token_budget": 20000,
            "journal_policy": "hash-only",
            "tools": ["read", "grep"],
            "tool_choice": "auto",
        },
        "cli": {"kind": "command", "command": "agent --print", "timeout": 600, "max_repairs": 1},
        "mixed": {"kind": "composite", "agent": "local"},
    }
    for name, profile in profiles.all_profiles().items():
        assert profiles.profile_problems(name, profile) == []


def test_manage_check_reports_errors_and_missing_key_variables(settings, monkeypatch):
    monkeypatch.delenv("FUSION_TEST_UNSET_KEY", raising=False)
    settings.FUSION_VALIDATORS = {
        "bad": {"kind": "agent", "model": "m", "output_mode": "xml"},
        "keyless": {"kind": "agent", "model": "m", "api_key_env": "FUSION_TEST_UNSET_KEY"},
        "slow": {"kind": "command", "command": "x", "timeout": 86_400},
    }
    out = io.StringIO()
    with pytest.raises(SystemCheckError) as info:
        call_command("check", stdout=out, stderr=out)
    text = str(info.value)
    assert "fusion.E001" in text and "'bad'" in text and "output_mode must be one of" in text
    assert "fusion.W001" in text and "FUSION_TEST_UNSET_KEY" in text
    assert "timeout 86400s is longer than FUSION_VALIDATOR_TIMEOUT" in text


def test_public_config_of_a_composite_carries_its_agent(settings):
    settings.FUSION_VALIDATORS = {
        "local": {"kind": "agent", "model": "a"},
        "mixed": {"kind": "composite", "agent": "local"},
    }
    before = profiles.public_config(profiles.get_profile("mixed"))
    settings.FUSION_VALIDATORS = {
        "local": {"kind": "agent", "model": "b"},
        "mixed": {"kind": "composite", "agent": "local"},
    }
    after = profiles.public_config(profiles.get_profile("mixed"))
    assert before["agent_config"]["model"] == "a" and after["agent_config"]["model"] == "b"


@pytest.mark.django_db(transaction=True)
def test_a_broken_profile_is_a_run_error_not_a_crash(settings, hello_feature, scripted):
    scripted([("verdict", passing("VAL-1"))])
    feature = hello_feature([("VAL-1", None)])
    run = start_run(feature)
    settings.FUSION_VALIDATORS = {"scripted": {"kind": "agent"}}  # broken after admission
    from validation.services.runner import execute_run

    assert execute_run(run.pk) == "error"
    run.refresh_from_db()
    assert run.error.startswith("misconfigured: validator profile 'scripted': an agent profile needs 'model'")


@pytest.mark.django_db(transaction=True)
def test_fingerprint_reuse_covers_agent_profiles(scripted, hello_feature):
    fn = scripted([("verdict", passing("VAL-1"))])
    feature = hello_feature([("VAL-1", None)])
    first = run_now(feature)
    assert first.status == "passed" and first.tokens_in > 0
    admission = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate")
    assert admission.outcome == "reused" and admission.run.reused_from_id == first.pk
    assert admission.run.tokens_in == 0 and len(fn.calls) == 1  # zero tokens, no model call


@pytest.mark.django_db(transaction=True)
def test_a_changed_agent_profile_is_not_reused(scripted, hello_feature, settings):
    scripted([("verdict", passing("VAL-1"))])
    feature = hello_feature([("VAL-1", None)])
    assert run_now(feature).status == "passed"
    settings.FUSION_VALIDATORS = {"scripted": {**settings.FUSION_VALIDATORS["scripted"], "temperature": 0.5}}
    admission = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate")
    assert admission.outcome == "started"
