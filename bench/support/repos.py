"""The generated repository the benchmarks judge: one file per feature, one commit."""

from __future__ import annotations

import os
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
