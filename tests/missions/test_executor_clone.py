"""The `command` executor works in a private clone made from the worker's mirror, never in
the user's checkout, and pushes its result to `fusion/<mission>/<feature>-<task>` on the
source: a local repository (only a branch is added) or a bare one served only by URL (a
real `git daemon`). A refused push fails the task with the reason; a command that rewrites
its clone's config does not redirect the push."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fusion_site.repos import mirrors
from fusion_site.repos.snapshots import snapshot_root
from missions.models import Task
from missions.services.lifecycle import mission_activate
from missions.services.tasks import task_create
from tests.conftest import Repo
from tests.gitserver import GitDaemon
from tests.missions.loop_helpers import add_slice, feature, make_mission, python_command
from validation.models import ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _remote_timeout(settings):
    settings.FUSION_GIT_REMOTE_TIMEOUT = 60


@pytest.fixture
def daemon(tmp_path):
    server = GitDaemon(tmp_path / "served").start()
    try:
        yield server
    finally:
        server.stop()


def command_mission(owner, repository, tmp_path, script_text: str, *args: str, features=("a",), key="clone", **fields):
    script = tmp_path / f"executor-{key}.py"
    script.write_text(script_text)
    mission = make_mission(
        owner, repository, key=key, executor="command", executor_command=python_command(script, *args), **fields
    )
    add_slice(mission, "m1", "s1", list(features))
    mission_activate(mission=mission, user=owner)
    return mission


def run_task(worker, owner, mission, key: str = "a", timeout: float = 90) -> Task:
    task = task_create(user=owner, feature=feature(mission, key))
    worker.drain(timeout=timeout)
    task.refresh_from_db()
    return task


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True).stdout


def ref_of(path: Path, ref: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--verify", "--quiet", ref], capture_output=True, text=True
    )
    return proc.stdout.strip()


def user_state(repo: Repo) -> dict:
    """What a user would notice of their checkout: index (bytes and mtime, read before any
    git command), worktree files, HEAD, the checked-out branch and the status."""
    index = repo.path / ".git" / "index"
    state: dict = {"index": index.read_bytes(), "index_mtime": index.stat().st_mtime_ns}
    state["files"] = {
        str(p.relative_to(repo.path)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(repo.path.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(repo.path).parts
    }
    # --no-optional-locks: `git status` may otherwise refresh (rewrite) the index itself.
    state["status"] = repo.git("--no-optional-locks", "status", "--porcelain", "--untracked-files=all")
    state["head"] = repo.git("rev-parse", "HEAD").strip()
    state["branch"] = repo.git("symbolic-ref", "HEAD").strip()
    return state


def task_folders() -> list[Path]:
    return [p for p in snapshot_root().iterdir() if p.name.startswith("task-")]


WRITES = """
import os, pathlib, subprocess
key = os.environ["FUSION_FEATURE_KEY"]
pathlib.Path(key + ".txt").write_text("done " + key + "\\n")
print("CWD", os.getcwd())
print("TOP", subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip())
print("BRANCH", subprocess.run(["git", "branch", "--show-current"], capture_output=True, text=True).stdout.strip())
alternates = pathlib.Path(".git/objects/info/alternates")
print("ALTERNATES", alternates.read_text().strip() if alternates.exists() else "none")
print("HISTORY", subprocess.run(["git", "log", "-p", "--format=%s"], capture_output=True, text=True).stdout.count("diff --git"))
"""


def line(log: str, name: str) -> str:
    return next(x for x in log.splitlines() if x.startswith(name + " ")).split(" ", 1)[1]


def test_the_command_runs_in_a_clone_and_the_users_checkout_is_untouched(worker, owner, git_repo, tmp_path):
    # A user in the middle of their own work: a staged file, an edit, an untracked file.
    base = git_repo.commit({"app.py": "print('v1')\n"}, "app")
    git_repo.write("staged.txt", "staged\n")
    git_repo.git("add", "staged.txt")
    git_repo.write("README.md", "# project, edited and not committed\n")
    git_repo.write("notes/untracked.md", "mine\n")
    before = user_state(git_repo)
    mission = command_mission(owner, git_repo.path, tmp_path, WRITES)
    task = run_task(worker, owner, mission)

    assert task.status == "done", task.summary
    assert user_state(git_repo) == before  # byte for byte: index, files, HEAD, branch, status
    branch = f"fusion/clone/a-{task.pk}"
    assert line(task.log, "BRANCH") == branch
    # The result is a branch of the user's repository, one commit on top of their HEAD.
    assert ref_of(git_repo.path, f"refs/heads/{branch}") == task.revision
    assert git(git_repo.path, "rev-parse", f"{task.revision}~1").strip() == base
    assert git(git_repo.path, "show", f"{task.revision}:a.txt") == "done a\n"
    assert set(git(git_repo.path, "show", "--name-only", "--format=", task.revision).split()) == {"a.txt"}
    assert f"task {task.pk}" in git(git_repo.path, "log", "-1", "--format=%s", task.revision)
    # It ran in its own clone under the snapshot folder, which is gone now.
    cwd = Path(line(task.log, "CWD"))
    assert cwd.is_relative_to(snapshot_root()) and not cwd.is_relative_to(git_repo.path)
    assert line(task.log, "TOP") == str(cwd)
    assert not cwd.exists() and task_folders() == []
    # Shared with the mirror (alternates): the mirror's objects are read, never written.
    source = mission.source()
    assert line(task.log, "ALTERNATES") == str(mirrors.mirror_dir(source) / "objects")
    git(mirrors.mirror_dir(source), "fsck", "--connectivity-only", "--no-progress")
    run = ValidatorRun.objects.get(feature__key="a")
    assert (run.revision, run.status) == (task.revision, "passed")


def test_a_task_starts_at_the_base_revision_and_the_next_at_what_the_last_one_landed(worker, owner, git_repo, tmp_path):
    release = git_repo.commit({"app.py": "print('release')\n"}, "release")
    git_repo.git("branch", "release")
    git_repo.commit({"app.py": "print('work in progress')\n"}, "wip on main")
    mission = command_mission(owner, git_repo.path, tmp_path, WRITES, features=("a", "b"), base_revision="release")
    first = run_task(worker, owner, mission, "a")
    assert first.status == "done", first.summary
    assert git(git_repo.path, "rev-parse", f"{first.revision}~1").strip() == release
    second = run_task(worker, owner, mission, "b")
    assert second.status == "done", second.summary
    assert git(git_repo.path, "rev-parse", f"{second.revision}~1").strip() == first.revision
    assert git(git_repo.path, "show", f"{second.revision}:a.txt") == "done a\n"  # it built on a
    assert ref_of(git_repo.path, f"refs/heads/fusion/clone/b-{second.pk}") == second.revision


def test_a_first_task_starts_at_the_head_of_the_missions_branch(worker, owner, git_repo, tmp_path):
    # The working copy has `main` checked out; the mission's line of work is `next`.
    git_repo.git("checkout", "-q", "-b", "next")
    ahead = git_repo.commit({"app.py": "print('next')\n"}, "on next")
    git_repo.git("checkout", "-q", "main")
    mission = command_mission(owner, git_repo.path, tmp_path, WRITES, branch="next")
    task = run_task(worker, owner, mission)
    assert task.status == "done", task.summary
    assert git(git_repo.path, "rev-parse", f"{task.revision}~1").strip() == ahead


def test_a_bare_repository_served_only_by_url(worker, owner, git_repo, tmp_path, daemon):
    git_repo.commit({"app.py": "print('v1')\n"}, "app")
    bare = daemon.bare("shop.git", source=git_repo.path)
    main = ref_of(bare, "refs/heads/main")
    mission = command_mission(owner, daemon.url("shop.git"), tmp_path, WRITES)
    task = run_task(worker, owner, mission)

    assert task.status == "done", task.summary
    assert ref_of(bare, f"refs/heads/fusion/clone/a-{task.pk}") == task.revision
    assert ref_of(bare, "refs/heads/main") == main  # only the task's branch was added
    assert git(bare, "rev-parse", f"{task.revision}~1").strip() == main
    # The mirror is partial (no file contents up front): the clone fetched what it read.
    mirror = mirrors.mirror_dir(mission.source())
    assert git(mirror, "config", "--get", "remote.origin.partialclonefilter").strip() == "blob:none"
    assert int(line(task.log, "HISTORY")) == 2  # README.md and app.py, read through the whole history
    run = ValidatorRun.objects.get(feature__key="a")
    assert (run.revision, run.status) == (task.revision, "passed")
    assert task_folders() == []


REFUSING_HOOK = """#!/bin/sh
echo "pushes are closed here (seen: {secret})" >&2
exit 1
"""


@pytest.mark.parametrize("where", ["local", "url"])
def test_a_refused_push_fails_the_task_with_the_scrubbed_reason(
    worker, owner, git_repo, tmp_path, daemon, monkeypatch, where
):
    secret = "tok-9f8e7d6c5b4a-secret"
    monkeypatch.setenv("FUSION_TEST_PUSH_TOKEN", secret)
    if where == "local":
        target, repository = git_repo.path / ".git", str(git_repo.path)
    else:
        target = daemon.bare("shop.git", source=git_repo.path)
        repository = daemon.url("shop.git")
    hook = target / "hooks" / "pre-receive"
    hook.write_text(REFUSING_HOOK.format(secret=secret))
    hook.chmod(0o755)
    mission = command_mission(owner, repository, tmp_path, WRITES, credentials_env="FUSION_TEST_PUSH_TOKEN")
    task = run_task(worker, owner, mission)

    assert task.status == "failed"
    assert "the push of the result to" in task.summary and f"refs/heads/fusion/clone/a-{task.pk}" in task.summary
    assert "pushes are closed here" in task.summary and "pre-receive hook declined" in task.summary
    # The source's secret, echoed by the server, is taken out of the reason.
    assert secret not in task.summary and "(seen: [redacted])" in task.summary, task.summary
    assert task.revision == "" and "CWD" in task.log  # the command ran; its log is kept
    assert ref_of(target, f"refs/heads/fusion/clone/a-{task.pk}") == ""
    assert not ValidatorRun.objects.exists() and feature(mission, "a").loop_state == "implementing"
    assert task_folders() == []


TAMPERS = """
import os, pathlib, subprocess, sys
decoy, marker = sys.argv[1], sys.argv[2]
key = os.environ["FUSION_FEATURE_KEY"]
pathlib.Path(key + ".txt").write_text("done " + key + "\\n")
subprocess.run(["git", "config", "remote.origin.url", decoy], check=True)
subprocess.run(["git", "config", "core.sshCommand", "touch " + marker + " && ssh"], check=True)
hook = pathlib.Path(".git/hooks/pre-push")
hook.write_text("#!/bin/sh\\ntouch " + marker + "\\n")
hook.chmod(0o755)
for name in sorted(os.environ):
    print("ENV", name, "=", os.environ[name])
print(subprocess.run(["git", "config", "--list", "--show-origin"], capture_output=True, text=True).stdout)
"""


def test_the_command_cannot_redirect_the_push_nor_see_the_credentials(worker, owner, git_repo, tmp_path, monkeypatch):
    secret = "tok-0a1b2c3d4e5f-secret"
    monkeypatch.setenv("FUSION_TEST_PUSH_TOKEN", secret)
    decoy, marker = tmp_path / "decoy.git", tmp_path / "ran-with-our-push"
    subprocess.run(["git", "init", "--bare", "-q", str(decoy)], check=True)
    mission = command_mission(
        owner, git_repo.path, tmp_path, TAMPERS, str(decoy), str(marker), credentials_env="FUSION_TEST_PUSH_TOKEN"
    )
    task = run_task(worker, owner, mission)

    assert task.status == "done", task.summary
    assert ref_of(git_repo.path, f"refs/heads/fusion/clone/a-{task.pk}") == task.revision
    assert git(decoy, "for-each-ref") == ""  # nothing went where the clone's config pointed
    assert not marker.exists()  # neither its hook nor its ssh command ran for our push
    assert secret not in task.log and "FUSION_TEST_PUSH_TOKEN" not in task.log
    assert "GIT_CONFIG" not in task.log and "DATABASE_URL" not in task.log
    assert "ENV FUSION_FEATURE_KEY = a" in task.log


def test_tasks_of_two_missions_on_one_repository_keep_their_own_branches(worker, owner, git_repo, tmp_path):
    one = command_mission(owner, git_repo.path, tmp_path, WRITES, key="one")
    two = command_mission(owner, git_repo.path, tmp_path, WRITES, key="two")
    first, second = run_task(worker, owner, one), run_task(worker, owner, two)
    assert first.status == second.status == "done"
    head = git_repo.git("rev-parse", "HEAD").strip()
    # Each mission builds on its own results only.
    assert git(git_repo.path, "rev-parse", f"{first.revision}~1").strip() == head
    assert git(git_repo.path, "rev-parse", f"{second.revision}~1").strip() == head
    assert ref_of(git_repo.path, f"refs/heads/fusion/one/a-{first.pk}") == first.revision
    assert ref_of(git_repo.path, f"refs/heads/fusion/two/a-{second.pk}") == second.revision
