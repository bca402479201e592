"""Read-only snapshots of a revision: a detached git worktree, always removed afterwards.

Git adapter errors are `SnapshotError` (permanent: a bad workspace or revision will not
fix itself by retrying). A per-repository file lock serializes the changes to the shared
records under `.git/worktrees` (`worktree add` without checkout, dropping a record); the
checkout of the files, private to the new worktree, happens outside it, so that the
snapshots of many runs are made in parallel.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from django.conf import settings

GIT_TIMEOUT = 120


class SnapshotError(Exception):
    """The workspace or revision cannot be checked out."""


def _git_run(repo: Path, args: tuple[str, ...], timeout: int) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "GIT_TERMINAL_PROMPT": "0",
        "LANG": "C",
    }
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapshotError(f"git {' '.join(args[:2])} failed: {exc}") from exc


def git(repo: Path, *args: str, timeout: int = GIT_TIMEOUT) -> str:
    proc = _git_run(repo, args, timeout)
    if proc.returncode != 0:
        raise SnapshotError(f"git {' '.join(args[:2])} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def repository(workspace: str) -> Path:
    return repository_dirs(workspace)[0]


def repository_dirs(workspace: str) -> tuple[Path, Path]:
    """(top-level folder, common git dir) of the repository at `workspace`, in one git call."""
    top, git_dir, _prefix = repository_info(workspace)
    return top, git_dir


def repository_info(workspace: str) -> tuple[Path, Path, str]:
    """(top-level folder, common git dir, the workspace's folder inside the repository
    such as `app/` or ''), in one git call."""
    if not workspace:
        raise SnapshotError("the mission has no workspace (a local git repository) to validate in")
    path = Path(workspace).expanduser()
    if not path.is_dir():
        raise SnapshotError(f"workspace {workspace} does not exist")
    try:
        out = git(
            path, "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir", "--show-prefix"
        ).splitlines()
    except SnapshotError as exc:
        raise SnapshotError(f"workspace {workspace} is not a git repository") from exc
    if len(out) not in (2, 3):
        raise SnapshotError(f"workspace {workspace} is not a git repository with a working tree")
    return Path(out[0]), Path(out[1]), (out[2] if len(out) == 3 else "")


def resolve_revision(repo: Path, revision: str) -> str:
    if not revision or revision.startswith("-"):
        raise SnapshotError("no revision to validate")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}").strip()
    except SnapshotError as exc:
        raise SnapshotError(f"revision {revision} is not a commit of {repo}") from exc


def head_revision(workspace: str) -> str:
    return git(repository(workspace), "rev-parse", "HEAD").strip()


FULL_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def pin_revision(workspace: str, name: str) -> str:
    """The full commit id `name` (a branch, a tag, `HEAD`, a short id) names in the
    workspace's repository now. Judgements are pinned to this id: a ref that moves later
    never changes what was judged (docs/TRUTH.md)."""
    return resolve_revision(repository(workspace), name)


def is_ancestor(workspace: str, older: str, newer: str) -> bool:
    """Whether commit `older` is contained in the history of `newer`."""
    proc = _git_run(repository(workspace), ("merge-base", "--is-ancestor", older, newer), GIT_TIMEOUT)
    if proc.returncode not in (0, 1):
        raise SnapshotError(f"git merge-base failed: {proc.stderr.strip()[:500]}")
    return proc.returncode == 0


@contextlib.contextmanager
def repo_lock(repo: Path, name: str = "fusion-worktree.lock", *, git_dir: Path | None = None) -> Iterator[None]:
    """An exclusive lock, across processes, on one repository (a file in its git dir;
    pass `git_dir` when it is known to save a git call)."""
    lock_path = git_dir or Path(git(repo, "rev-parse", "--git-common-dir").strip())
    if not lock_path.is_absolute():
        lock_path = repo / lock_path
    with open(lock_path / name, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def snapshot_root() -> Path:
    root = Path(settings.FUSION_SNAPSHOT_DIR)
    root.mkdir(parents=True, exist_ok=True)
    return root


def _make_read_only(path: Path) -> None:
    # Tracked files become read-only; directories stay writable so that tools can
    # keep caches (the snapshot is thrown away anyway).
    for dirpath, dirs, files in os.walk(path):
        # Only a `.git` entry itself is git's: `.github/`, `.gitlab/` are the revision's.
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            target = Path(dirpath, name)
            if not target.is_symlink():
                target.chmod(target.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@contextlib.contextmanager
def snapshot(workspace: str, revision: str, *, label: str = "run") -> Iterator[Path]:
    """The revision's files, read-only. What is yielded is the workspace's own folder in
    the snapshot: a workspace that is a sub-folder of its repository is judged there."""
    repo, git_dir, prefix = repository_info(workspace)
    commit = resolve_revision(repo, revision)
    target = snapshot_root() / f"{label}-{uuid.uuid4().hex[:12]}"
    try:
        # Only the record under .git/worktrees is shared: made under the lock, without the
        # checkout, which then fills this worktree's own index and files outside the lock.
        with repo_lock(repo, git_dir=git_dir):
            git(repo, "worktree", "add", "--no-checkout", "--detach", "--force", str(target), commit)
        git(target, "reset", "--hard", "--quiet")
        _make_read_only(target)
        folder = target / prefix if prefix else target
        if not folder.is_dir():
            raise SnapshotError(
                f"revision {commit[:12]} has no folder {prefix} (the workspace's folder in its repository)"
            )
        yield folder
    finally:
        remove_snapshot(repo, target)


@contextlib.contextmanager
def private_copy(source: Path) -> Iterator[Path]:
    """A copy of the snapshot `source` for one check, removed afterwards: what the check
    deletes or generates stays in its copy, and no other check sees it. A real copy: a
    hard link of a read-only file can be made writable and changed in place, which would
    change the snapshot too. Named like its snapshot (`run-<pk>-<hex>`), so that the sweep
    removes a copy a killed worker left."""
    # `source` may be the workspace's sub-folder of the snapshot: the label is the snapshot's.
    match = next((m for m in map(SNAPSHOT_NAME.match, (p.name for p in (source, *source.parents))) if m), None)
    target = snapshot_root() / f"{match.group(1) if match else 'copy'}-{uuid.uuid4().hex[:12]}"
    try:
        _copy_tree(source, target)
        yield target
    finally:
        _remove_tree(target)


def _copy_tree(source: Path, target: Path) -> None:
    # `cp -a` keeps modes (read-only files), symlinks and times, and is faster than copytree
    # or a checkout (bench/check_copies.py); `--reflink=auto` shares the blocks where the
    # file system can (btrfs, XFS). Without GNU cp, copytree does the same, slower.
    try:
        done = (
            subprocess.run(
                ["cp", "-a", "--reflink=auto", "--", str(source), str(target)], capture_output=True
            ).returncode
            == 0
        )
    except OSError:
        done = False
    if not done:
        _remove_tree(target)
        shutil.copytree(source, target, symlinks=True)


def _remove_tree(path: Path) -> None:
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return

    def retry(func: Callable[..., object], name: str, _exc_info: object) -> None:
        # A check may have taken the permissions off a folder of its copy.
        if func is os.rmdir and os.path.abspath(name) == os.path.abspath(path):
            return  # its parent is the snapshot root, never ours to change
        with contextlib.suppress(OSError):
            if func in (os.open, os.scandir, os.listdir):
                os.chmod(name, stat.S_IRWXU)
                shutil.rmtree(name, onerror=retry)
            else:
                os.chmod(os.path.dirname(name), stat.S_IRWXU)
                func(name)

    shutil.rmtree(path, onerror=retry)


def remove_snapshot(repo: Path | None, target: Path) -> None:
    record = _worktree_record(target)
    shutil.rmtree(target, ignore_errors=True)
    if record is not None:
        # What `git worktree remove` does for one worktree: drop its own record (under the
        # lock: a concurrent `worktree add` lists the records). No git process is needed.
        with contextlib.suppress(OSError), repo_lock(repo or record, git_dir=record.parent.parent):
            shutil.rmtree(record, ignore_errors=True)
    elif repo is not None:
        prune_worktrees(repo)


def prune_worktrees(repo: Path) -> None:
    """Drop the repository's records of worktrees whose folders are gone."""
    with contextlib.suppress(SnapshotError), repo_lock(repo):
        git(repo, "worktree", "prune")


def _worktree_record(folder: Path) -> Path | None:
    """`<git dir>/worktrees/<id>`, the repository's record of the worktree at `folder`, when
    the two point at each other (the worktree's `.git` file and the record's `gitdir`)."""
    try:
        text = (folder / ".git").read_text()
        if not text.startswith("gitdir:"):
            return None
        record = Path(text.split(":", 1)[1].strip())
        if record.parent.name != "worktrees" or not record.is_absolute():
            return None
        points_back = Path((record / "gitdir").read_text().strip())
    except OSError:
        return None
    return record if os.path.realpath(points_back) == os.path.realpath(folder / ".git") else None


def _worktree_git_dir(folder: Path) -> Path | None:
    """The git dir of the repository whose worktree `folder` is."""
    record = _worktree_record(folder)
    return record.parent.parent if record is not None else None


# What `snapshot()` names its folders: `<label>-<12 hex>`, the label `run-<pk>`,
# `review-<pk>` or `replay-<pk>`. The sweep touches nothing else.
SNAPSHOT_NAME = re.compile(r"^((?:run|review|replay)-\d+)-[0-9a-f]{12}$")
# A replay has no row that says it is running: its snapshot is spared for this long.
REPLAY_GRACE_SECONDS = 600


def sweep_snapshots(*, live_labels: Callable[[], set[str]], workspaces: Iterable[str] = ()) -> int:
    """Remove snapshot folders whose run is no longer live (left by a killed worker), and
    the repositories' records of those worktrees. Returns how many folders were removed.

    The candidates are listed first and `live_labels()` is asked after: a run is live
    before its snapshot exists, so a snapshot made meanwhile is never a candidate."""
    folders = [child for child in snapshot_root().iterdir() if SNAPSHOT_NAME.match(child.name)]
    records = {git_dir: _snapshot_records(git_dir) for git_dir in _git_dirs(workspaces)}
    live = live_labels()
    removed, touched = 0, set()
    for folder in folders:
        if not _is_live(folder, live):
            git_dir = _worktree_git_dir(folder)
            if git_dir is not None:
                touched.add(git_dir)
            if folder.is_symlink():  # never ours: drop the link, never what it points at
                folder.unlink(missing_ok=True)
            else:
                shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    for git_dir, found in records.items():
        dead = [(record, folder) for record, folder in found if not _is_live(folder, live)]
        if dead and _drop_records(git_dir, dead):
            touched.add(git_dir)
    for git_dir in touched:
        with contextlib.suppress(OSError):  # a repository we may not write to: left as it is
            prune_worktrees(git_dir)
    return removed


def _is_live(folder: Path, live_labels: set[str]) -> bool:
    named = SNAPSHOT_NAME.match(folder.name)
    if named is None:  # the callers pass only snapshot names; anything else is never ours to remove
        return True
    label = named.group(1)
    if label in live_labels:
        return True
    if label.startswith("replay-"):
        with contextlib.suppress(OSError):
            return time.time() - folder.stat().st_mtime < REPLAY_GRACE_SECONDS
    return False


def _git_dirs(workspaces: Iterable[str]) -> set[Path]:
    """The git dirs of the workspaces that are readable git repositories (any other is
    left alone: a mission may name a path that is gone or not ours to read)."""
    found = set()
    for workspace in set(workspaces):
        with contextlib.suppress(OSError, SnapshotError):
            dot_git = Path(workspace).expanduser() / ".git"
            git_dir = dot_git if dot_git.is_dir() else repository_dirs(workspace)[1]
            if (git_dir / "worktrees").is_dir():
                found.add(git_dir)
    return found


def _snapshot_records(git_dir: Path) -> list[tuple[Path, Path]]:
    """(record, snapshot folder) for each worktree record of `git_dir` that points at a
    folder directly under the snapshot root with a snapshot's name."""
    root = os.path.realpath(snapshot_root())
    found = []
    with contextlib.suppress(OSError):
        for record in (git_dir / "worktrees").iterdir():
            try:
                pointer = Path((record / "gitdir").read_text().strip())
            except OSError:
                continue
            folder = Path(os.path.normpath(record / pointer)).parent  # a relative gitdir is relative to the record
            if SNAPSHOT_NAME.match(folder.name) and os.path.realpath(folder.parent) == root and not folder.is_symlink():
                found.append((record, folder))
    return found


def _drop_records(git_dir: Path, dead: list[tuple[Path, Path]]) -> bool:
    """Drop the records of snapshots that are not live, and their folders. `git worktree
    prune` is not enough: a worker killed inside `git worktree add` leaves its record
    locked ("initializing"), and prune never touches a locked worktree. `worktree add`
    runs under the same lock, so no record is half-made while this holds it."""
    try:
        with repo_lock(git_dir, git_dir=git_dir):
            for record, folder in dead:
                shutil.rmtree(folder, ignore_errors=True)
                shutil.rmtree(record, ignore_errors=True)
    except OSError:
        return False
    return True


def bounded_diff(workspace: str, base: str, revision: str, limit: int = 60_000) -> str:
    if not base:
        return ""
    repo = repository(workspace)
    try:
        text = git(repo, "diff", "--no-color", "--stat", "--patch", f"{base}..{revision}")
    except SnapshotError:
        return ""
    return text if len(text) <= limit else text[:limit] + f"\n[… diff truncated at {limit} characters]"
