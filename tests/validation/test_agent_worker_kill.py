"""SIGKILL a real `rundramatiq` worker in the middle of an agent run, after the first
model answer is journaled; the redelivered job resumes the run from its journal and the
scripted server never receives an answered request again.

Redelivery: dramatiq's RedisBroker requeues a dead worker's unacked message only after a
60 s heartbeat timeout and then only during its probabilistic maintenance, so the test
sends the same message again itself, as that requeue would — once the dead worker's
claim on the run has lapsed (its lease, FUSION_RUN_LEASE_SECONDS, is shorter than the
broker's timeout): a redelivery never judges a run a live worker holds. The same resume without a
subprocess (the worker dying in-process) runs in every pass: test_agent_resume.py.
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.utils import timezone

from tests.support.agent_env import hello_feature, start_run  # noqa: F401
from tests.support.openai_server import ScriptedOpenAIServer
from tests.support.verdicts import item, verdict
from tests.support.workers import wait_until, worker_processes  # noqa: F401
from validation.journal import verify_chain
from validation.models import JournalEntry, RunStatus, ValidatorRun
from validation.replay import replay_run

pytestmark = [
    pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL: runs in the PostgreSQL+Redis pass of .ci/run"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.redis,
]

GOOD = verdict(item("VAL-1", evidence=[{"kind": "file", "text": "hello.py:1"}]))


def test_killed_worker_resumes_without_paying_twice(worker_processes, hello_feature, settings):
    server = ScriptedOpenAIServer([("tool", "read", {"path": "hello.py"}), ("verdict", GOOD)]).start()
    release = server.hold(1)  # the second model call waits: the worker dies with it in flight
    profiles = {"http": {"kind": "agent", "model": server.model, "base_url": server.base_url, "timeout": 120}}
    settings.FUSION_VALIDATORS = profiles
    env = {"FUSION_VALIDATORS": json.dumps(profiles), "FUSION_RUN_LEASE_SECONDS": "3"}
    try:
        first = worker_processes.start(**env)
        run = start_run(hello_feature([("VAL-1", None)], validator="http"))
        server.wait_for(lambda requests: any(r["turn"] == 1 for r in requests), timeout=120)
        answered = JournalEntry.objects.filter(run=run, kind="model_response").count()
        assert answered == 1  # the first answer is journaled; the second is in flight
        worker_processes.kill(first)
        release.set()
        assert ValidatorRun.objects.get(pk=run.pk).status == RunStatus.RUNNING

        worker_processes.start(**env)
        wait_until(
            lambda: ValidatorRun.objects.filter(pk=run.pk, lease_until__lt=timezone.now()).exists(),
            timeout=60,
            what="the dead worker's lease to pass",
            logs=worker_processes.logs,
        )
        from validation.actors import run_validator

        run_validator.send(run.pk)  # the redelivery
        wait_until(
            lambda: ValidatorRun.objects.get(pk=run.pk).status != RunStatus.RUNNING,
            timeout=120,
            what="the resumed run to finish",
            logs=worker_processes.logs,
        )
        run.refresh_from_db()
        assert run.status == RunStatus.PASSED, run.error
        assert server.turns_received() == [0, 1, 1]  # turn 0 was answered once and never sent again
        assert JournalEntry.objects.filter(run=run, kind="tool_result").count() == 1
        assert verify_chain(run.pk).ok and replay_run(run.pk).ok
    finally:
        server.stop()
