"""What a run's judge is given besides the snapshot: the task's summary and the diff from
the mission's base revision reach a model (validators/prompt.py); checks alone never read
them, so a checks run makes no diff (a git call of its own per run)."""

from __future__ import annotations

import pytest

from missions.models import Mission
from tests.support.agent_env import hello_feature, scripted, start_run  # noqa: F401
from tests.support.verdicts import item, verdict
from validation.models import RunStatus
from validation.services import runner
from validation.services.runner import execute_run

pytestmark = pytest.mark.django_db(transaction=True)


def _based_feature(hello_feature, git_repo, *, validator: str):
    base = git_repo.commit({"README": "base\n"}, "base")
    feature = hello_feature([("VAL-1", {"file": "hello.py", "contains": "def hello"})], validator=validator)
    Mission.objects.filter(pk=feature.mission_id).update(base_revision=base)
    return feature


def test_a_model_is_shown_the_diff_from_the_base_revision(scripted, hello_feature, git_repo):
    fn = scripted([("verdict", verdict(item("VAL-1")))])
    run = start_run(_based_feature(hello_feature, git_repo, validator="scripted"))
    assert execute_run(run.pk) == RunStatus.PASSED
    prompt = fn.calls[0]["text"]
    assert "Diff against the base revision" in prompt
    assert "+def hello():" in prompt  # the line the task added since the base


def test_checks_alone_make_no_diff(hello_feature, git_repo, monkeypatch):
    def no_diff(*args, **kwargs):
        raise AssertionError("a checks run asked for the diff")

    monkeypatch.setattr(runner, "bounded_diff", no_diff)
    run = start_run(_based_feature(hello_feature, git_repo, validator="checks"))
    assert execute_run(run.pk) == RunStatus.PASSED
