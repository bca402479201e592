"""Read-only snapshots of a revision: a detached git worktree, always removed afterwards.

Git adapter errors are `SnapshotError` (permanent: a bad workspace or revision will not
fix itself by retrying). A per-repository file lock serializes `worktree add/remove`,
which write shared metadata under `.git/worktrees`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

from django.conf import settings

GIT_TIMEOUT = 120


class SnapshotError(Exception):
    """The workspace or revision cannot be checked out."""


def git(repo: Path, *args: str, timeout: int = GIT_TIMEOUT) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "GIT_TERMINAL_PROMPT": "0", "LANG": "C"}
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapshotError(f"git {' '.join(args[:2])} failed: {exc}") from exc
    if proc.returncode != 0:
        raise SnapshotError(f"git {' '.join(args[:2])} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def repository(workspace: str) -> Path:
    if not workspace:
        raise SnapshotError("the mission has no workspace (a local git repository) to validate in")
    path = Path(workspace).expanduser()
    if not path.is_dir():
        raise SnapshotError(f"workspace {workspace} does not exist")
    try:
        top = git(path, "rev-parse", "--show-toplevel").strip()
    except SnapshotError as exc:
        raise SnapshotError(f"workspace {workspace} is not a git repository") from exc
    return Path(top)


def resolve_revision(repo: Path, revision: str) -> str:
    if not revision or revision.startswith("-"):
        raise SnapshotError("no revision to validate")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}").strip()
    except SnapshotError as exc:
        raise SnapshotError(f"revision {revision} is not a commit of {repo}") from exc


def head_revision(workspace: str) -> str:
    return git(repository(workspace), "rev-parse", "HEAD").strip()


@contextlib.contextmanager
def repo_lock(repo: Path, name: str = "fusion-worktree.lock") -> Iterator[None]:
    """An exclusive lock, across processes, on one repository (a file in its git dir)."""
    lock_path = Path(git(repo, "rev-parse", "--git-common-dir").strip())
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
    for dirpath, _dirs, files in os.walk(path):
        if "/.git" in dirpath:
            continue
        for name in files:
            target = Path(dirpath, name)
            if not target.is_symlink():
                target.chmod(target.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@contextlib.contextmanager
def snapshot(workspace: str, revision: str, *, label: str = "run") -> Iterator[Path]:
    repo = repository(workspace)
    commit = resolve_revision(repo, revision)
    target = snapshot_root() / f"{label}-{uuid.uuid4().hex[:12]}"
    with repo_lock(repo):
        git(repo, "worktree", "add", "--detach", "--force", str(target), commit)
    try:
        _make_read_only(target)
        yield target
    finally:
        remove_snapshot(repo, target)


def remove_snapshot(repo: Path | None, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    if repo is not None:
        with contextlib.suppress(SnapshotError), repo_lock(repo):
            git(repo, "worktree", "prune")


def sweep_snapshots(*, live_labels: set[str]) -> int:
    """Remove snapshot folders whose run is no longer live (left by a killed worker)."""
    removed = 0
    for child in snapshot_root().iterdir():
        label = child.name.rsplit("-", 1)[0]
        if label not in live_labels:
            shutil.rmtree(child, ignore_errors=True)
            removed += 1
    return removed


def bounded_diff(workspace: str, base: str, revision: str, limit: int = 60_000) -> str:
    if not base:
        return ""
    repo = repository(workspace)
    try:
        text = git(repo, "diff", "--no-color", "--stat", "--patch", f"{base}..{revision}")
    except SnapshotError:
        return ""
    return text if len(text) <= limit else text[:limit] + f"\n[… diff truncated at {limit} characters]"
