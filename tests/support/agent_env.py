"""Fixtures for agent and command validator tests: a scripted model registered under a
profile, a feature over a real git repository, runs started through admission."""

from __future__ import annotations

import uuid

import pytest

from missions.models import MissionFeature
from tests.support.openai_server import ScriptedOpenAIServer
from tests.support.scripted_model import ScriptedFunction
from validation.models import ValidatorRun
from validation.services.runner import execute_run
from validation.services.verdicts.admit import feature_admit
from validation.validators.agent_models import register_model

HELLO = "def hello():\n    return 'hi'\n"


def add_profile(settings, name: str, profile: dict) -> None:
    settings.FUSION_VALIDATORS = {**(settings.FUSION_VALIDATORS or {}), name: profile}


@pytest.fixture
def scripted(settings):
    """scripted(turns, **profile options) -> ScriptedFunction, registered as profile 'scripted'."""
    registered = []

    def make(turns, *, profile: str = "scripted", usage=(100, 20), **options) -> ScriptedFunction:
        fn = ScriptedFunction(turns, usage)
        model_name = f"scripted-{uuid.uuid4().hex[:8]}"
        register_model(model_name, fn.model())
        registered.append(model_name)
        add_profile(settings, profile, {"kind": "agent", "model": model_name, **options})
        return fn

    yield make
    for name in registered:
        register_model(name, None)


@pytest.fixture
def openai_server(settings):
    """openai_server(turns, **profile options) -> a started ScriptedOpenAIServer behind profile 'http'."""
    servers = []

    def make(turns, *, profile: str = "http", usage=None, **options) -> ScriptedOpenAIServer:
        server = ScriptedOpenAIServer(turns, usage=usage).start()
        servers.append(server)
        add_profile(settings, profile, {"kind": "agent", "model": server.model, "base_url": server.base_url, **options})
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def hello_feature(build_mission, git_repo):
    """feature(assertions, validator=...) -> Feature over a repo holding hello.py."""

    def make(assertions, *, validator: str = "scripted", files: dict | None = None) -> MissionFeature:
        git_repo.commit(files or {"hello.py": HELLO}, "hello")
        build_mission({"hello": assertions}, validator=validator)
        return MissionFeature.objects.get(key="hello")

    return make


def start_run(feature: MissionFeature, *, profile: str | None = None) -> ValidatorRun:
    admission = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate", profile_name=profile)
    assert admission.outcome == "started", admission
    return admission.run


def run_now(feature: MissionFeature, *, profile: str | None = None) -> ValidatorRun:
    run = start_run(feature, profile=profile)
    execute_run(run.pk)
    run.refresh_from_db()
    return run
