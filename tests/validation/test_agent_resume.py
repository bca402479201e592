"""A run whose worker died is re-executed (redelivery, recovery): answered model calls,
tool calls and decisions come from the journal and are not sent again."""

from __future__ import annotations

import pytest

from tests.support.agent_env import hello_feature, scripted, start_run  # noqa: F401
from tests.support.verdicts import item, verdict
from validation.journal import verify_chain
from validation.models import JournalEntry, RunStatus
from validation.replay import replay_run
from validation.services.runner import execute_run

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = verdict(item("VAL-1"), item("VAL-2"))
BAD = verdict(item("VAL-1"))


class WorkerDied(BaseException):
    """Stands in for the SIGKILL of the worker process (see tests/validation/test_agent_worker_kill.py)."""


def dies_once(turn):
    state = {"died": False}

    def answer(context):
        if not state["died"]:
            state["died"] = True
            raise WorkerDied("killed after the previous answer was journaled")
        return turn

    return answer


def test_resume_after_crash_serves_answered_calls_from_the_journal(scripted, hello_feature):
    fn = scripted([("tool", "read", {"path": "hello.py"}), ("verdict", BAD), dies_once(("verdict", GOOD))])
    run = start_run(hello_feature([("VAL-1", None), ("VAL-2", None)]))
    with pytest.raises(WorkerDied):
        execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    assert JournalEntry.objects.filter(run=run, kind="model_response").count() == 2
    tokens_before = (run.tokens_in, run.tokens_out)
    assert tokens_before == (200, 40)

    assert execute_run(run.pk) == RunStatus.PASSED  # the redelivered job
    run.refresh_from_db()
    assert [c["index"] for c in fn.calls] == [0, 1, 2, 2]  # calls 1 and 2 were answered: never sent again
    assert JournalEntry.objects.filter(run=run, kind="tool_result").count() == 1
    assert JournalEntry.objects.filter(run=run, kind="decision").exclude(key="final").count() == 2
    assert (run.tokens_in, run.tokens_out) == (300, 60)  # every call paid once
    assert verify_chain(run.pk).ok
    report = replay_run(run.pk)
    assert report.ok, report.problems
    assert len(fn.calls) == 4


def test_resume_rolls_a_journaled_rejection_forward(scripted, hello_feature, monkeypatch):
    """The decision on a candidate is not taken twice: a resumed run reads it back."""
    from validation.validators import repair

    fn = scripted([("verdict", BAD), dies_once(("verdict", GOOD))])
    run = start_run(hello_feature([("VAL-1", None), ("VAL-2", None)]))
    with pytest.raises(WorkerDied):
        execute_run(run.pk)
    calls = []
    real = repair.assess
    monkeypatch.setattr(repair, "assess", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    assert execute_run(run.pk) == RunStatus.PASSED
    assert calls == [GOOD]  # only the new candidate was judged
    assert len(fn.calls) == 3


def test_replay_of_a_crashed_run_stops_at_the_unanswered_call(scripted, hello_feature):
    fn = scripted([("tool", "ls", {}), dies_once(("verdict", GOOD))])
    run = start_run(hello_feature([("VAL-1", None), ("VAL-2", None)]))
    with pytest.raises(WorkerDied):
        execute_run(run.pk)
    report = replay_run(run.pk)
    assert not report.ok
    assert report.problems and report.problems[0].startswith("model call 2 (request sha256")
    assert "a replay never makes a live call" in report.problems[0]
    assert len(fn.calls) == 2
