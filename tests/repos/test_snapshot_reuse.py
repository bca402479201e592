"""A worker's next snapshot made from one it kept (fusion_site/repos/snapshot_reuse.py):
the tree a run judges is the one a snapshot from scratch would be (files, modes,
symlinks, contents; nothing deleted, renamed or left behind survives), a kept snapshot
is never shared by two runs, anything written into it sends the next run back to a
snapshot from scratch, and kept snapshots stay bounded and are swept with their process."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest

from fusion_site.repos import snapshot_reuse
from fusion_site.repos.snapshots import snapshot, snapshot_root, sweep_snapshots
from fusion_site.runtime import sandbox
from fusion_site.runtime.proc import run_command, scrubbed_env
from fusion_site.runtime.sandbox import Confinement
from tests.conftest import Repo


@pytest.fixture(autouse=True)
def _kept(settings, monkeypatch):
    monkeypatch.setattr(snapshot_reuse, "KEEP_MIN_FILES", 1)  # the tests' repositories are small
    settings.FUSION_SNAPSHOTS_KEPT = 2
    settings.FUSION_SNAPSHOTS_KEPT_TOTAL = 6
    snapshot_reuse.forget()
    if not sandbox.layers_work():
        pytest.fail(
            "bubblewrap with overlays is required for this test (docs/SANDBOX.md): snapshots are kept only where "
            f"checks run over an overlay; here: {sandbox.status().record}"
        )
    yield
    snapshot_reuse.forget()


def tree_state(top: Path) -> dict[str, tuple]:
    """Every entry under `top`: its kind, permission bits and contents (a link's target)."""
    state: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            path = Path(dirpath, name)
            st = os.lstat(path)
            rel = path.relative_to(top).as_posix()
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                state[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                state[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return state


def kept_folders() -> list[Path]:
    return sorted(p for p in snapshot_root().iterdir() if p.is_dir() and p.name.startswith("keep-"))


def inode(path: Path) -> int:
    return os.lstat(path).st_ino


@pytest.fixture
def two_commits(git_repo: Repo) -> tuple[Repo, str, str]:
    """Two commits between which files are changed, deleted, renamed, made executable and
    back, a symlink retargeted, a file turned into a folder and new folders added."""
    repo = git_repo
    files = {
        "keep/same.txt": "unchanged\n",
        "change.txt": "before\n",
        "gone/only.txt": "deleted with its folder\n",
        "old_name.txt": "renamed\n",
        "tool.sh": "#!/bin/sh\necho tool\n",
        "plain.sh": "#!/bin/sh\necho plain\n",
        "becomes_dir": "a file first\n",
    }
    repo.commit(files, "first")
    (repo.path / "tool.sh").chmod(0o755)
    (repo.path / "link").symlink_to("change.txt")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "modes and a link")
    first = repo.git("rev-parse", "HEAD").strip()
    repo.git("rm", "-q", "-r", "gone", "becomes_dir")
    (repo.path / "new" / "deep").mkdir(parents=True)
    repo.git("mv", "old_name.txt", "new/deep/name.txt")
    (repo.path / "tool.sh").chmod(0o644)
    (repo.path / "plain.sh").chmod(0o755)
    (repo.path / "link").unlink()
    (repo.path / "link").symlink_to("keep/same.txt")
    second = repo.commit({"change.txt": "after\n", "becomes_dir/inner.txt": "a folder now\n"}, "second")
    return repo, first, second


def from_scratch(repo: Repo, commit: str) -> dict[str, tuple]:
    with snapshot(str(repo.path), commit, label="run-9", reuse=False) as tree:
        return tree_state(tree)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_snapshot_made_from_a_kept_one_is_the_one_made_from_scratch(two_commits, direction):
    repo, first, second = two_commits
    older, newer = (first, second) if direction == "forward" else (second, first)
    with snapshot(str(repo.path), older, label="run-1", reuse=True) as tree:
        same = inode(tree / "keep" / "same.txt")
    assert len(kept_folders()) == 1

    with snapshot(str(repo.path), newer, label="run-2", reuse=True) as tree:
        assert inode(tree / "keep" / "same.txt") == same  # taken, not made again
        assert kept_folders() == []  # this run's alone while it runs
        reused = tree_state(tree)

    assert reused == from_scratch(repo, newer)
    assert (reused["tool.sh"][1], reused["plain.sh"][1]) == ((0o444, 0o555) if newer == second else (0o555, 0o444))
    assert reused["link"] == ("link", "keep/same.txt" if newer == second else "change.txt")


def test_what_a_check_wrote_over_its_layer_is_not_in_the_next_snapshot(two_commits):
    repo, first, second = two_commits
    with snapshot(str(repo.path), first, label="run-1", reuse=True) as tree:
        same = inode(tree / "keep" / "same.txt")
        write = "echo left > left.txt && rm change.txt && mkdir -p cache && echo x > cache/x"
        done = run_command(
            ["sh", "-c", write],
            cwd=tree,
            timeout=60,
            max_output=4096,
            env=scrubbed_env(),
            confine=Confinement(tree=tree, layered=True),
        )
        assert done.ok, done.output
    with snapshot(str(repo.path), second, label="run-2", reuse=True) as tree:
        assert inode(tree / "keep" / "same.txt") == same
        reused = tree_state(tree)
    assert reused == from_scratch(repo, second)
    assert "left.txt" not in reused and "cache" not in reused


@pytest.mark.parametrize(
    "leave",
    ["untracked file", "untracked folder", "changed file", "removed file", "executable bit"],
)
def test_a_kept_snapshot_something_wrote_into_is_never_used(two_commits, leave):
    repo, first, second = two_commits
    with snapshot(str(repo.path), first, label="run-1", reuse=True):
        pass
    (kept,) = kept_folders()
    target = kept / "keep" / "same.txt"
    if leave == "untracked file":
        (kept / "keep" / "left.txt").write_text("a previous user's\n")
    elif leave == "untracked folder":
        (kept / "left" / "deeper").mkdir(parents=True)
    elif leave == "changed file":
        target.chmod(0o644)
        target.write_text("unchanged?\n")  # the same size
        target.chmod(0o444)
    elif leave == "removed file":
        target.unlink()
    else:
        target.chmod(0o555)

    with snapshot(str(repo.path), second, label="run-2", reuse=True) as tree:
        reused = tree_state(tree)
    # Made from scratch: the kept one is gone, and nothing of what was left shows.
    assert reused == from_scratch(repo, second)
    assert not kept.exists()


def test_a_snapshot_the_service_wrote_into_is_not_kept(two_commits):
    repo, first, _second = two_commits
    with snapshot(str(repo.path), first, label="run-1", reuse=True) as tree:
        snapshot_reuse.mark_written(tree / "keep")  # e.g. protected files restored into it
    assert kept_folders() == []


def test_a_run_that_ended_with_an_error_keeps_nothing(two_commits):
    repo, first, _second = two_commits
    with pytest.raises(RuntimeError), snapshot(str(repo.path), first, label="run-1", reuse=True):
        raise RuntimeError("the run failed")
    assert kept_folders() == []


def test_two_runs_at_once_never_share_a_kept_snapshot(two_commits):
    repo, first, second = two_commits
    with snapshot(str(repo.path), first, label="run-1", reuse=True):
        pass
    with (
        snapshot(str(repo.path), second, label="run-2", reuse=True) as one,
        snapshot(str(repo.path), second, label="run-3", reuse=True) as other,
    ):
        assert one != other
        assert inode(one / "keep" / "same.txt") != inode(other / "keep" / "same.txt")
        assert tree_state(one) == tree_state(other)
    assert len(kept_folders()) == 2


def test_kept_snapshots_are_bounded_per_repository_and_in_all(settings, tmp_path):
    settings.FUSION_SNAPSHOTS_KEPT = 1
    settings.FUSION_SNAPSHOTS_KEPT_TOTAL = 2
    repos = []
    for name in ("a", "b", "c"):
        path = tmp_path / name
        path.mkdir()
        repo = Repo(path)
        repo.git("init", "-q", "-b", "main")
        repos.append((repo, repo.commit({"f.txt": name}, "only")))
    repo, commit = repos[0]
    with (
        snapshot(str(repo.path), commit, label="run-1", reuse=True),
        snapshot(str(repo.path), commit, label="run-2", reuse=True),
    ):
        pass
    assert len(kept_folders()) == 1  # one per repository
    for repo, commit in repos[1:]:
        with snapshot(str(repo.path), commit, label="run-3", reuse=True):
            pass
    assert len(kept_folders()) == 2  # the least recently used one went


def test_the_mission_folder_of_a_repository_is_judged_from_a_kept_snapshot(git_repo):
    first = git_repo.commit({"app/f.txt": "one\n", "other/g.txt": "g\n"}, "app")
    second = git_repo.commit({"app/f.txt": "two\n", "app/new/h.txt": "h\n"}, "app again")
    source = str(git_repo.path / "app")
    with snapshot(source, first, label="run-1", reuse=True) as folder:
        assert folder.name == "app"
    with snapshot(source, second, label="run-2", reuse=True) as folder:
        assert folder.name == "app"
        assert (folder / "f.txt").read_text() == "two\n"
        assert (folder / "new" / "h.txt").read_text() == "h\n"
        reused = tree_state(folder.parent)
    assert reused == from_scratch(git_repo, second)


def test_nothing_is_kept_with_submodules_without_an_overlay_or_below_its_size(two_commits, settings, monkeypatch):
    repo, first, _second = two_commits
    monkeypatch.setattr(snapshot_reuse, "KEEP_MIN_FILES", 10)  # the commit has 9
    with snapshot(str(repo.path), first, label="run-1", reuse=True):
        pass
    assert kept_folders() == []
    monkeypatch.setattr(snapshot_reuse, "KEEP_MIN_FILES", 1)
    with snapshot(str(repo.path), first, label="run-1", reuse=True, submodules=True):
        pass
    assert kept_folders() == []
    settings.FUSION_SANDBOX = "off"
    with snapshot(str(repo.path), first, label="run-1", reuse=True):
        pass
    assert kept_folders() == []


def test_the_sweep_removes_a_gone_process_kept_snapshots_and_spares_this_ones(two_commits):
    repo, first, second = two_commits
    with snapshot(str(repo.path), first, label="run-1", reuse=True) as tree:
        same = inode(tree / "keep" / "same.txt")
    dead = snapshot_root() / f"keep-{2**22 + 17}-{uuid.uuid4().hex[:12]}"  # above Linux's highest pid
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "f").write_text("x")
    (dead / "sub" / "f").chmod(0o444)
    Path(f"{dead}.idx").write_bytes(b"DIRC")

    sweep_snapshots(live_labels=set)

    assert not dead.exists() and not Path(f"{dead}.idx").exists()
    with snapshot(str(repo.path), second, label="run-2", reuse=True) as tree:
        assert inode(tree / "keep" / "same.txt") == same
