"""The benchmarks' baseline work for one feature, without the service: a snapshot of the
commit from a bare mirror (`git read-tree -u --reset` into a folder with a private index,
as the service makes one), the feature's two checks in it, and its removal."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.support.mission import CHECK_RUN

# As the checks validator does: `python` is the interpreter this service runs with.
PLAIN_ENV = {
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
    "HOME": tempfile.gettempdir(),
}


def plain_mirror(source: str, home: Path) -> Path:
    """A bare mirror of the source, as a worker's cache holds one (partial for a URL)."""
    mirror = home / "mirror.git"
    shutil.rmtree(mirror, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["git", "clone", "--bare", "--quiet", "--filter=blob:none", "--", source, str(mirror)],
        check=True,
        capture_output=True,
    )
    return mirror


def snapshot_and_check(i: int, mirror: Path, rev: str, snap: Path, copy: bool = False) -> None:
    """Feature `i`'s checks in a snapshot of `rev` made at `snap` (a new folder), then
    removed. `copy`: the `run` check in a copy of the snapshot (`cp -a`), as the service's
    isolation rule has it for a feature with several `run` checks."""
    snap.parent.mkdir(parents=True, exist_ok=True)
    index = snap.with_name(snap.name + ".idx")
    snap.mkdir()
    try:
        subprocess.run(
            ["git", "--git-dir", str(mirror), "--work-tree", str(snap), "read-tree", "-u", "--reset", rev],
            check=True,
            capture_output=True,
            env={**os.environ, "GIT_INDEX_FILE": str(index)},
        )
        assert re.search(f"feature {i}", (snap / f"f{i}.txt").read_text())
        where = snap.with_name(snap.name + "-copy") if copy else snap
        if copy:
            subprocess.run(["cp", "-a", "--", str(snap), str(where)], check=True)
        out = subprocess.run(
            shlex.split(CHECK_RUN["run"]), cwd=where, capture_output=True, text=True, timeout=120, env=PLAIN_ENV
        )
        if copy:
            shutil.rmtree(where)
        assert out.returncode == 0 and re.search(CHECK_RUN["expect_output"], out.stdout)
    finally:
        index.unlink(missing_ok=True)
        shutil.rmtree(snap)
