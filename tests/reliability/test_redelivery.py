"""A redelivered `run_validator` message after a worker lost its database between the
host's accepted decision and the run's completion (what `test_faults.py`'s database
outage does with real workers, staged here in-process so every pass runs it).

Invariant: every (feature, implementation attempt) has exactly one accepted
verdict — the journal of the run holds one `decision final accepted`, however often its
message is delivered.
"""

from __future__ import annotations

import pytest
from django.db import OperationalError

from missions.models import MissionFeature
from validation.models import JournalEntry, RunStatus, ValidatorRun
from validation.services import runner
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_redelivered_run_does_not_accept_a_second_verdict(build_mission, git_repo, monkeypatch):
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    build_mission({"hello": [("VAL-1", {"file": "hello.py", "contains": r"def hello\("})]})
    feature = MissionFeature.objects.get(key="hello")
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    real_complete = runner.run_complete
    calls = {"n": 0}

    def connection_lost_once(**kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real_complete(**kwargs)

    monkeypatch.setattr(runner, "run_complete", connection_lost_once)
    with pytest.raises(OperationalError):
        runner.execute_run(run.pk)  # the actor fails; Dramatiq's Retries delivers the message again
    assert ValidatorRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
    assert runner.execute_run(run.pk) == RunStatus.PASSED
    decisions = list(JournalEntry.objects.filter(run=run, kind="decision", payload__verdict="accepted"))
    assert len(decisions) == 1, [(e.seq, e.key) for e in JournalEntry.objects.filter(run=run).order_by("seq")]
