"""The generated repositories the benchmarks judge: one file per feature, one commit
(`make_repo`); a source tree of many files in nested packages (`make_source_tree`)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}


def make_repo(repo: Path, n: int) -> tuple[Path, str]:
    """`repo` (made here) with `f<i>.txt` saying "feature <i> done" for i < n; its commit id."""
    repo.mkdir()
    for i in range(n):
        (repo / f"f{i}.txt").write_text(f"feature {i} done\n")
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "all"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    rev = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return repo, rev


def make_source_tree(path: Path, n_files: int) -> str:
    """`path` (made here): Python-like sources of 0.1-8 KiB in 100 packages, a few
    executables and symlinks, in one commit, the same for the same `n_files`; its commit id."""
    path.mkdir(parents=True)
    rng = random.Random(7)
    for i in range(n_files):
        target = path / f"pkg{i % 100:03d}" / f"sub{i % 7}" / f"mod{i}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"VALUE = {i}\n" * rng.randint(8, 700))
        if i % 97 == 0:
            target.chmod(0o755)
    for i in range(0, n_files, 250):
        (path / f"link{i}.py").symlink_to(f"pkg{i % 100:03d}/sub{i % 7}/mod{i}.py")
    return commit_all(path, "bench", init=True)


def commit_all(path: Path, message: str, *, init: bool = False) -> str:
    """Commit everything in the work tree at `path` (`git init` first when `init`); the commit id."""
    env = {**os.environ, **GIT_ENV}
    steps = [["init", "-q", "-b", "main"]] if init else []
    for args in (*steps, ["add", "-A"], ["commit", "-q", "-m", message]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, env=env)
    return subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
