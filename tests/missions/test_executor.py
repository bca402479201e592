"""The `command` task executor  on a real worker and a real repository: the
revision it records, failures with their log tail, timeouts, the scrubbed environment,
the bounded log, and one task at a time per mission."""

from __future__ import annotations

import time

import pytest

from missions.models import Task
from missions.services.lifecycle import mission_activate
from missions.services.tasks import task_create
from tests.missions.loop_helpers import add_slice, feature, make_mission, python_command
from validation.models import ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)


def command_mission(owner, repo, tmp_path, script_text: str, *args: str, features=("a",), **fields):
    script = tmp_path / "executor.py"
    script.write_text(script_text)
    mission = make_mission(
        owner, repo.path, executor="command", executor_command=python_command(script, *args), **fields
    )
    add_slice(mission, "m1", "s1", list(features))
    mission_activate(mission=mission, user=owner)
    return mission


def run_task(worker, owner, mission, key: str = "a", timeout: float = 60) -> Task:
    task = task_create(user=owner, feature=feature(mission, key))
    worker.drain(timeout=timeout)
    task.refresh_from_db()
    return task


LEAVES_CHANGES = """
import os, pathlib
key = os.environ["FUSION_FEATURE_KEY"]
pathlib.Path(key + ".txt").write_text("done " + key + "\\n")
pathlib.Path("notes").mkdir(exist_ok=True)
pathlib.Path("notes/new-file.md").write_text("untracked too\\n")
print("wrote", key)
"""


def test_uncommitted_changes_are_committed_and_pushed_to_the_task_branch(worker, owner, git_repo, tmp_path, api):
    base = git_repo.git("rev-parse", "HEAD").strip()
    mission = command_mission(owner, git_repo, tmp_path, LEAVES_CHANGES)
    task = run_task(worker, owner, mission)
    assert task.status == "done", task.summary
    # The user's checkout never moved; the result is a branch of the repository.
    assert git_repo.git("rev-parse", "HEAD").strip() == base
    assert git_repo.git("status", "--porcelain").strip() == ""
    branch = f"refs/heads/fusion/{mission.key}/a-{task.pk}"
    assert task.revision == git_repo.git("rev-parse", branch).strip() != base
    assert git_repo.git("rev-parse", f"{task.revision}~1").strip() == base  # exactly one new commit
    changed = git_repo.git("show", "--name-only", "--format=", task.revision).split()
    assert set(changed) == {"a.txt", "notes/new-file.md"}
    assert f"task {task.pk}" in git_repo.git("log", "-1", "--format=%s", task.revision)
    assert "wrote a" in task.log and task.started_at and task.finished_at
    # the log is visible in the API, and the feature was judged at that revision
    assert "wrote a" in api(owner).get(f"/api/tasks/{task.pk}/").json()["log"]
    run = ValidatorRun.objects.get(feature__key="a")
    assert (run.revision, run.status) == (task.revision, "passed")
    assert feature(mission, "a").loop_state == "passed"


COMMITS_ITSELF = """
import os, pathlib, subprocess
key = os.environ["FUSION_FEATURE_KEY"]
pathlib.Path(key + ".txt").write_text("done " + key + "\\n")
env = {**os.environ, "GIT_AUTHOR_NAME": "Agent", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "Agent",
       "GIT_COMMITTER_EMAIL": "a@x"}
subprocess.run(["git", "add", "-A"], check=True, env=env)
subprocess.run(["git", "commit", "-q", "-m", "agent: " + key], check=True, env=env)
"""


def test_a_command_that_commits_itself_keeps_its_commit(worker, owner, git_repo, tmp_path):
    base = git_repo.git("rev-parse", "HEAD").strip()
    mission = command_mission(owner, git_repo, tmp_path, COMMITS_ITSELF)
    task = run_task(worker, owner, mission)
    assert task.status == "done", task.summary
    assert task.revision == git_repo.git("rev-parse", f"refs/heads/fusion/{mission.key}/a-{task.pk}").strip()
    assert git_repo.git("rev-parse", f"{task.revision}~1").strip() == base
    assert git_repo.git("log", "-1", "--format=%s", task.revision).strip() == "agent: a"
    assert git_repo.git("rev-parse", "HEAD").strip() == base


FAILS = """
import sys
for i in range(2000):
    print("noise line", i)
print("the real reason: the build broke")
sys.exit(3)
"""


def test_a_failing_command_fails_the_task_with_the_log_tail(worker, owner, git_repo, tmp_path):
    base = git_repo.git("rev-parse", "HEAD").strip()
    mission = command_mission(owner, git_repo, tmp_path, FAILS)
    task = run_task(worker, owner, mission)
    assert task.status == "failed"
    assert "exit 3" in task.summary and "the real reason: the build broke" in task.summary
    assert "noise line 0\n" not in task.summary  # the tail, not the whole log
    assert task.log.rstrip().endswith("the real reason: the build broke")
    assert task.revision == "" and task.finished_at is not None
    assert git_repo.git("rev-parse", "HEAD").strip() == base
    assert not ValidatorRun.objects.exists()
    assert feature(mission, "a").loop_state == "implementing"


HANGS = """
import time
print("starting", flush=True)
time.sleep(120)
"""


def test_a_hanging_command_times_out(worker, owner, git_repo, tmp_path, settings):
    settings.FUSION_EXECUTOR_TIMEOUT = 2
    mission = command_mission(owner, git_repo, tmp_path, HANGS)
    started = time.monotonic()
    task = run_task(worker, owner, mission)
    assert time.monotonic() - started < 60
    assert task.status == "failed"
    assert "timed out" in task.summary and "starting" in task.log
    assert not ValidatorRun.objects.exists()


SHOWS_ENV = """
import os, pathlib, sys
prompt = pathlib.Path(os.environ["FUSION_TASK_PROMPT_FILE"]).read_text()
stdin = sys.stdin.read()
print("PROMPT-SAME", prompt == stdin)
print("PROMPT-HAS-ASSERTION", "VAL-a" in prompt)
for name in sorted(os.environ):
    print("ENV", name, "=", os.environ[name])
"""


def test_the_command_gets_the_prompt_and_a_scrubbed_environment(worker, owner, git_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSION_TEST_SECRET", "s3cret-value")
    mission = command_mission(owner, git_repo, tmp_path, SHOWS_ENV)
    task = run_task(worker, owner, mission)
    assert task.status == "done", task.summary
    assert "PROMPT-SAME True" in task.log and "PROMPT-HAS-ASSERTION True" in task.log
    assert "s3cret-value" not in task.log and "FUSION_TEST_SECRET" not in task.log
    assert "DATABASE" not in task.log and "SECRET_KEY" not in task.log
    assert "ENV FUSION_TASK_PROMPT_FILE" in task.log and "ENV FUSION_FEATURE_KEY = a" in task.log


LOUD = """
import sys
for i in range(20000):
    print("line", i, "x" * 40)
print("LAST LINE")
"""


def test_the_task_log_is_bounded(worker, owner, git_repo, tmp_path, settings):
    settings.FUSION_TASK_LOG_BYTES = 2000
    mission = command_mission(owner, git_repo, tmp_path, LOUD)
    task = run_task(worker, owner, mission)
    assert len(task.log.encode()) < 2200
    assert task.log.rstrip().endswith("LAST LINE") and "truncated" in task.log


TIMED = """
import os, pathlib, sys, time
key = os.environ["FUSION_FEATURE_KEY"]
stamps = pathlib.Path(sys.argv[1])
start = time.time()
time.sleep(0.8)
pathlib.Path(key + ".txt").write_text("done " + key + "\\n")
with stamps.open("a") as fh:
    fh.write(f"{key} {start} {time.time()}\\n")
"""


def test_tasks_of_one_mission_run_one_at_a_time(worker, owner, git_repo, tmp_path):
    stamps = tmp_path / "stamps.txt"
    mission = command_mission(owner, git_repo, tmp_path, TIMED, str(stamps), features=("a", "b", "c"))
    tasks = [task_create(user=owner, feature=feature(mission, key)) for key in ("a", "b", "c")]  # all start together
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {"in_progress"}
    worker.drain(timeout=120)
    intervals = sorted(
        (float(s), float(e), k) for k, s, e in (line.split() for line in stamps.read_text().splitlines())
    )
    assert [k for _, _, k in intervals] and len(intervals) == 3
    for (s1, e1, k1), (s2, e2, k2) in zip(intervals, intervals[1:], strict=False):
        assert e1 <= s2, f"{k1} ran {s1}..{e1} and {k2} ran {s2}..{e2}: they overlap"
    revisions = [Task.objects.get(pk=t.pk).revision for t in tasks]
    assert len(set(revisions)) == 3 and all(revisions)
    assert {feature(mission, k).loop_state for k in ("a", "b", "c")} == {"passed"}


def test_a_mission_without_a_command_fails_the_task_plainly(worker, owner, git_repo):
    mission = make_mission(owner, git_repo.path, executor="command", executor_command="")
    add_slice(mission, "m1", "s1", ["a"])
    mission_activate(mission=mission, user=owner)
    task = run_task(worker, owner, mission)
    assert task.status == "failed" and "no executor_command" in task.summary


def test_a_later_task_waits_for_an_older_started_one_whose_executor_has_not_claimed_it(owner, git_repo, settings):
    """Tasks land in the order they were made: an older started task goes first whether its
    executor holds its claim or its message has not reached a worker yet (for one lease at
    most: a message that never comes is the recovery sweep's)."""
    from datetime import timedelta

    from django.utils import timezone

    from missions.services.executor import _older_claimed
    from missions.services.executor_lease import claim

    mission = make_mission(owner, git_repo.path, executor="command", executor_command="true")
    add_slice(mission, "m1", "s1", ["a", "b"])
    started = {"status": "in_progress", "executor": "command", "started_at": timezone.now()}
    older = Task.objects.create(mission=mission, feature=feature(mission, "a"), title="a", **started)
    later = Task.objects.create(mission=mission, feature=feature(mission, "b"), title="b", **started)
    assert _older_claimed(later)  # started, its message on its way
    assert not _older_claimed(older)
    assert claim(older.pk)[0] is not None
    assert _older_claimed(later)  # claimed, its lease alive
    Task.objects.filter(pk=older.pk).update(
        claim_token="",
        lease_until=None,
        started_at=timezone.now() - timedelta(seconds=settings.FUSION_EXECUTOR_LEASE_SECONDS + 1),
    )
    assert not _older_claimed(later)  # unclaimed for longer than a lease: not waited for
    Task.objects.filter(pk=older.pk).update(status="done")
    Task.objects.filter(pk=later.pk).update(started_at=timezone.now())
    assert not _older_claimed(later)
