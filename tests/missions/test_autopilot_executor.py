"""A mission that runs itself: autopilot + the `command` executor + milestone validation."""

from __future__ import annotations

import sys

import pytest

from missions.errors import Conflict
from missions.models import Milestone, Mission, MissionFeature, Slice, Task
from missions.services.lifecycle import mission_activate, mission_pause, mission_resume
from validation.models import RunScope, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)

IMPLEMENTER = """
import os, sys, pathlib
key = os.environ["FUSION_FEATURE_KEY"]
prompt = pathlib.Path(os.environ["FUSION_TASK_PROMPT_FILE"]).read_text()
assert prompt.strip(), "empty prompt"
pathlib.Path(key + ".txt").write_text("done " + key + "\\n")
print("implemented", key)
"""


def _add(mission, milestone_key, slice_key, feature_keys):
    from missions.models import ContractAssertion

    milestone, _ = Milestone.objects.get_or_create(
        mission=mission, key=milestone_key, defaults={"title": milestone_key}
    )
    slice_ = Slice(milestone=milestone, key=slice_key, title=slice_key)
    slice_.save()
    for key in feature_keys:
        feature = MissionFeature(slice=slice_, key=key, title=key)
        feature.save()
        assertion = ContractAssertion(
            milestone=milestone,
            key=f"VAL-{key}",
            title=key,
            statement=f"{key}.txt exists",
            check_spec={"file": f"{key}.txt", "contains": f"done {key}"},
        )
        assertion.save()
        feature.assertions.add(assertion)


def test_autopilot_runs_mission_to_complete_with_command_executor(worker, git_repo, alice, tmp_path):
    user_head = git_repo.git("rev-parse", "HEAD").strip()
    script = tmp_path / "implementer.py"
    script.write_text(IMPLEMENTER)
    mission = Mission.objects.create(
        key="auto",
        title="Auto",
        owner=alice,
        repository=str(git_repo.path),
        autopilot=True,
        executor="command",
        executor_command=f"{sys.executable} {script}",
    )
    _add(mission, "m1", "s1", ["a", "b"])
    _add(mission, "m1", "s2", ["c"])
    _add(mission, "m2", "s3", ["d"])
    mission_activate(mission=mission, user=alice)
    worker.drain(timeout=120)
    mission.refresh_from_db()
    assert mission.status == "complete", (mission.status, mission.status_reason)
    assert set(MissionFeature.objects.filter(mission=mission).values_list("loop_state", flat=True)) == {"passed"}
    assert set(Task.objects.filter(mission=mission).values_list("status", flat=True)) == {"done"}
    assert set(Milestone.objects.filter(mission=mission).values_list("status", flat=True)) == {"complete"}
    assert ValidatorRun.objects.filter(mission=mission, scope=RunScope.MILESTONE, status="passed").count() == 2
    # strictly serial: slices were activated in plan order
    order = list(Slice.objects.filter(mission=mission).order_by("activated_at").values_list("key", flat=True))
    assert order == ["s1", "s2", "s3"]
    # The tasks ran in clones: the user's checkout never moved; each result is its own
    # branch, and each task started from the one before it (one line of history).
    assert git_repo.git("rev-parse", "HEAD").strip() == user_head
    assert git_repo.git("status", "--porcelain") == ""
    tasks = list(Task.objects.filter(mission=mission).order_by("finished_at"))
    parent = user_head
    for task in tasks:
        branch = f"refs/heads/fusion/auto/{task.feature.key}-{task.pk}"
        assert git_repo.git("rev-parse", branch).strip() == task.revision
        assert git_repo.git("rev-parse", f"{task.revision}~1").strip() == parent  # one commit per task
        parent = task.revision
    assert git_repo.git("log", "--oneline", tasks[-1].revision).count("\n") == 1 + 4


def test_failing_executor_fails_task_with_log(worker, git_repo, alice):
    mission = Mission.objects.create(
        key="failing",
        title="F",
        owner=alice,
        repository=str(git_repo.path),
        autopilot=True,
        executor="command",
        executor_command=f"{sys.executable} -c \"import sys; print('boom'); sys.exit(3)\"",
    )
    _add(mission, "m1", "s1", ["a"])
    mission_activate(mission=mission, user=alice)
    worker.drain(timeout=60)
    task = Task.objects.get(mission=mission)
    assert task.status == "failed" and "exit 3" in task.summary and "boom" in task.log


def test_pause_and_resume_conflict(git_repo, alice):
    mission = Mission.objects.create(key="life", title="L", owner=alice, repository=str(git_repo.path))
    _add(mission, "m1", "s1", ["a"])
    mission_activate(mission=mission, user=alice)
    mission_pause(mission=mission, user=alice)
    MissionFeature.objects.filter(key="a").update(loop_state="blocked", stop_reason="budget_exhausted")
    with pytest.raises(Conflict) as err:
        mission_resume(mission=mission, user=alice)
    assert err.value.code == "resume_conflict"
    assert err.value.extra["blockers"][0]["reason"] == "budget_exhausted"
    mission.refresh_from_db()
    assert mission.status == "paused"
