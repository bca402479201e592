"""Crashes never leak a snapshot and never strand a run.

A validator that raises inside the snapshot — a known validator error or a defect of
ours — ends the run as `error` at once, and the snapshot folder is gone. A snapshot is made
from the worker's mirror (docs/REPOSITORIES.md), so the user's repository never gets a
worktree record. A worker killed with SIGKILL inside a snapshot leaves a folder (and its
index file) that the recovery sweep removes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fusion_site.repos import snapshots as snapshots_module
from fusion_site.repos import trees
from fusion_site.repos.snapshots import SMALL_TREE_FILES, snapshot, snapshot_root
from missions.models import MissionEvent, MissionFeature
from validation.context import ValidatorCrashed
from validation.models import RunStatus, ValidatorRun
from validation.services import runner
from validation.services.recovery import recover
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)

GREETING = {"file": "hello.py", "contains": r"def hello\("}
ROOT = Path(__file__).resolve().parents[2]


def hello_feature(build_mission, git_repo) -> MissionFeature:
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    build_mission({"hello": [("VAL-1", GREETING)]})
    return MissionFeature.objects.get(key="hello")


def worktrees(repo) -> list[str]:
    out = repo.git("worktree", "list", "--porcelain")
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


def assert_no_snapshot_left(repo) -> None:
    root = snapshot_root()
    assert sorted(p.name for p in root.iterdir()) == []
    assert worktrees(repo) == [str(repo.path)]  # the user's repository never had a record


class Boom(Exception):
    """Not one of the error types the runner knows."""


def crashing(exc: BaseException, seen: list[Path]):
    def judge(ctx):
        assert ctx.checkout.is_dir() and (ctx.checkout / "hello.py").is_file()
        seen.append(ctx.checkout)
        raise exc

    return judge


@pytest.mark.parametrize(
    "exc, code",
    [
        (Boom("the judge fell over"), "host_defect"),
        (KeyError("assertions"), "host_defect"),
        (ZeroDivisionError("division by zero"), "host_defect"),
        (ValidatorCrashed("model went away", code="validator_error"), "validator_error"),
    ],
)
def test_a_crash_inside_the_snapshot_ends_the_run_and_removes_the_worktree(
    idle_broker, build_mission, git_repo, monkeypatch, exc, code
):
    feature = hello_feature(build_mission, git_repo)
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    seen: list[Path] = []
    monkeypatch.setattr(runner, "judge", crashing(exc, seen))
    assert runner.execute_run(run.pk) == RunStatus.ERROR
    assert len(seen) == 1 and not seen[0].exists()
    assert_no_snapshot_left(git_repo)
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR and run.completed_at is not None
    assert run.error.startswith(f"{code}:"), run.error
    if code == "host_defect":
        assert type(exc).__name__ in run.error
    # Like any validator error: a new run with backoff, the feature stays validating.
    feature.refresh_from_db()
    retry = ValidatorRun.objects.exclude(pk=run.pk).get(feature=feature)
    assert retry.status == RunStatus.RUNNING and feature.last_run_id == retry.pk and feature.loop_state == "validating"
    completed = MissionEvent.objects.filter(type="validator-run:completed")
    assert [(e.payload["run"], e.payload["status"], e.payload["error"]) for e in completed] == [(run.pk, "error", code)]


def test_a_crash_while_building_the_context_also_cleans_up(idle_broker, build_mission, git_repo, monkeypatch):
    feature = hello_feature(build_mission, git_repo)
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    seen: list[Path] = []

    def broken_context(run_, checkout, **kwargs):
        seen.append(checkout)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner, "build_context", broken_context)
    assert runner.execute_run(run.pk) == RunStatus.ERROR
    assert seen and not seen[0].exists()
    assert_no_snapshot_left(git_repo)
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR and run.error.startswith("host_defect:") and "No space left" in run.error


def test_an_unexpected_crash_on_a_real_worker_ends_promptly_and_blocks_after_three(
    worker, build_mission, git_repo, monkeypatch
):
    """Before the fix the exception escaped to Dramatiq: the message was retried with
    backoff on the same still-running run, which then waited for the reaper."""
    feature = hello_feature(build_mission, git_repo)
    seen: list[Path] = []
    monkeypatch.setattr(runner, "judge", crashing(Boom("defect"), seen))
    feature_admit(feature_id=feature.pk, trigger="manual", cause="validate")
    worker.drain(timeout=30)
    runs = list(ValidatorRun.objects.filter(feature=feature).order_by("id"))
    assert [r.status for r in runs] == [RunStatus.ERROR] * 3
    assert all(r.error.startswith("host_defect: unexpected Boom") for r in runs)
    assert len(seen) == 3 and not any(p.exists() for p in seen)
    feature.refresh_from_db()
    assert feature.loop_state == "blocked" and feature.stop_reason == "validator_unavailable"
    assert_no_snapshot_left(git_repo)


def test_the_snapshot_context_removes_the_snapshot_when_the_body_raises(git_repo):
    rev = git_repo.git("rev-parse", "HEAD").strip()
    with pytest.raises(Boom), snapshot(str(git_repo.path), rev, label="run-1") as checkout:
        assert (checkout / "README.md").is_file() and not (checkout / ".git").exists()
        assert len(worktrees(git_repo)) == 1
        raise Boom()
    assert not checkout.exists()
    assert_no_snapshot_left(git_repo)


@pytest.mark.parametrize("files", [3, SMALL_TREE_FILES + 1])
def test_a_snapshot_is_removed_whatever_its_size_and_what_a_check_added(git_repo, monkeypatch, files):
    """A checkout of a few files is removed in this process (starting `rm` cost more than
    the removal); a larger one by `rm -rf`. Either way what a check wrote into it (a
    read-only file in a new folder) goes too."""
    git_repo.commit({f"src/f{i}.txt": "x\n" for i in range(files)})
    rev = git_repo.git("rev-parse", "HEAD").strip()
    removers: list[list[str]] = []
    real_run = trees.run_nicer  # removing a tree (fusion_site/repos/trees.py)

    def recording(argv, *args, **kwargs):
        if argv and argv[0] == "rm":
            removers.append(list(argv))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(trees, "run_nicer", recording)
    with snapshot(str(git_repo.path), rev, label="run-1") as checkout:
        made = checkout / "build" / "out"
        made.mkdir(parents=True)
        (made / "result.txt").write_text("generated")
        os.chmod(made / "result.txt", 0o444)
    assert not checkout.exists()
    assert_no_snapshot_left(git_repo)
    assert len(removers) == (0 if files + 1 <= SMALL_TREE_FILES else 1)  # + README.md


HOLDER = textwrap.dedent("""
    import sys, time
    from django.conf import settings
    settings.configure(
        FUSION_SNAPSHOT_DIR=sys.argv[4],
        FUSION_REPO_CACHE=sys.argv[5],
        FUSION_REPO_CACHE_BYTES=2**40,
        FUSION_GIT_REMOTE_TIMEOUT=60,
        FUSION_COMMAND_NICE=10,
    )
    from fusion_site.repos.snapshots import snapshot
    with snapshot(sys.argv[1], sys.argv[2], label=sys.argv[3]) as checkout:
        print(checkout, flush=True)
        time.sleep(120)
""")


def test_a_snapshot_of_a_killed_worker_is_swept(idle_broker, build_mission, git_repo, settings):
    """A process SIGKILLed inside `snapshot()` never runs its `finally`: the sweep removes
    the folder (read-only files and all); the user's repository has nothing to clean."""
    feature = hello_feature(build_mission, git_repo)
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(git_repo.path),
            run.revision,
            f"run-{run.pk}",
            str(snapshot_root()),
            str(settings.FUSION_REPO_CACHE),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        checkout = Path(child.stdout.readline().strip())
        assert checkout.is_dir() and len(worktrees(git_repo)) == 1
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    assert checkout.is_dir()  # nobody cleaned up: the process died
    # While its run is live, the sweep leaves the folder alone (another worker may own it).
    assert recover()["snapshots_removed"] == 0 and checkout.is_dir()
    ValidatorRun.objects.filter(pk=run.pk).update(status=RunStatus.ERROR)
    assert recover()["snapshots_removed"] == 1
    assert not checkout.exists()
    assert_no_snapshot_left(git_repo)
    assert recover()["snapshots_removed"] == 0


def test_an_index_file_left_by_a_worker_killed_inside_read_tree_is_swept(idle_broker, build_mission, git_repo):
    """A worker killed while `read-tree` fills its snapshot leaves the folder, its private
    index file beside it and git's lock of that index: all go once the run is no longer
    live."""
    feature = hello_feature(build_mission, git_repo)
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    folder = snapshot_root() / f"run-{run.pk}-0123456789ab"
    folder.mkdir()
    (folder / "half.txt").write_text("x")
    index = snapshot_root() / f"{folder.name}.idx"
    index.write_bytes(b"DIRC")
    lock = snapshot_root() / f"{folder.name}.idx.lock"
    lock.write_bytes(b"DIRC")
    lock.chmod(0o444)  # as git writes it for a snapshot (read-only files)
    assert recover()["snapshots_removed"] == 0 and folder.is_dir() and index.is_file() and lock.is_file()  # live
    ValidatorRun.objects.filter(pk=run.pk).update(status=RunStatus.ERROR)
    assert recover()["snapshots_removed"] == 1
    assert not folder.exists() and not index.exists() and not lock.exists()
    assert list(snapshot_root().iterdir()) == []
    assert_no_snapshot_left(git_repo)


def test_the_sweep_never_removes_anything_outside_the_snapshot_root(idle_broker, build_mission, git_repo, tmp_path):
    """Worktree records are the repository's to write (an executor or a check may forge
    them): whatever they point at, only snapshot folders directly under the root go."""
    hello_feature(build_mission, git_repo)
    root = snapshot_root()
    victim = tmp_path / "victim"
    (victim / "run-5-0123456789ab").mkdir(parents=True)
    (victim / "keep.txt").write_text("mine")
    records = Path(git_repo.git("rev-parse", "--path-format=absolute", "--git-common-dir").strip()) / "worktrees"
    forged = {
        "up": f"{root}/../.git",  # the data dir above the root
        "through": f"{root}/run-6-0123456789ab/../../victim/.git",  # climbs out by name
        "elsewhere": f"{victim}/run-5-0123456789ab/.git",  # a snapshot's name, not under the root
        "relative": "../../../../victim/.git",  # relative to the record
    }
    for name, gitdir in forged.items():
        (records / name).mkdir(parents=True)
        (records / name / "gitdir").write_text(gitdir + "\n")
        (records / name / "locked").write_text("initializing")
    link = root / "run-7-0123456789ab"
    link.symlink_to(victim, target_is_directory=True)  # a link under the root is dropped, not followed
    recover()
    assert (victim / "keep.txt").read_text() == "mine" and (victim / "run-5-0123456789ab").is_dir()
    assert root.is_dir() and root.parent.is_dir() and not link.exists() and not link.is_symlink()
    assert sorted(p.name for p in records.iterdir()) == sorted(forged)  # not ours: left alone
