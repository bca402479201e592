"""What a run's judge is given besides the snapshot: the task's summary and the diff from
the mission's base revision reach a model (validators/prompt.py); checks alone never read
them, so a checks run makes no diff (a git call of its own per run)."""

from __future__ import annotations

import pytest

from missions.models import Mission, MissionFeature
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


@pytest.mark.parametrize("parallelism", [1, 4])
def test_a_check_that_cannot_run_leaves_the_others_verdicts_in_the_journal(
    build_mission, git_repo, monkeypatch, settings, parallelism
):
    """A run's check results are journaled together once they are in: one that fails to
    run (a defect of ours) still leaves the verdicts of those that ran."""
    from validation.models import JournalEntry
    from validation.services.verdicts.admit import feature_admit
    from validation.validators import checks

    settings.FUSION_CHECK_PARALLELISM = parallelism
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    run_check = {"run": "python -c \"print('ok')\"", "expect_output": "ok"}
    build_mission(
        {
            "hello": [
                ("VAL-1", {"file": "hello.py", "contains": "def hello"}),
                ("VAL-2", run_check),
                ("VAL-3", run_check),
            ]
        },
        validator="checks",
    )
    feature = MissionFeature.objects.get(key="hello")
    real = checks.judge_isolated

    def broken(ctx, assertion, **kwargs):
        if assertion.key == "VAL-3":
            raise RuntimeError("the check could not be started")
        return real(ctx, assertion, **kwargs)

    monkeypatch.setattr(checks, "judge_isolated", broken)
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    assert execute_run(run.pk) == RunStatus.ERROR
    journaled = set(JournalEntry.objects.filter(run=run, kind="check").values_list("key", flat=True))
    assert journaled == {"VAL-1", "VAL-2"}
