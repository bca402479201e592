"""Benchmark: three ways to make (and remove) a read-only snapshot of a commit from a bare mirror.

Run:  .venv/bin/python bench/snapshot_modes.py [--files 2000] [--commits 30] [--rounds 25]

Builds a git repository of about 2,000 files in nested folders with 30 commits, a bare
mirror of it (`git clone --bare`, as a worker's repository cache holds), and times, per
snapshot of one of its commits (the rounds walk the 30 commits), making it and removing it:

  (a) read-tree   `git read-tree -u --reset <commit>` into a new folder with a private
                  GIT_INDEX_FILE outside it (what fusion_site/repos/snapshots.py does; no
                  `.git` in the snapshot, no record in the mirror), then the folder and the
                  index are removed;
  (b) worktree    `git worktree add --no-checkout --detach` + `git reset --hard` in it, then
                  the folder and its record (`<mirror>/worktrees/<name>`) are removed;
  (c) archive     `git archive <commit> | tar -x` into a new folder, then it is removed.

The modes take turns, round after round, so that a slow moment of the machine weighs on
all of them alike. Prints the median ms (make, remove, total) of each and its ratio to (a),
and, for reference, the service's own `snapshot()` (read-tree plus its read-only pass).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TMP = Path(tempfile.mkdtemp(prefix="fusion-bench-snap-"))
os.environ["FUSION_DATA_DIR"] = str(TMP / "data")  # before settings are read
os.environ["FUSION_SNAPSHOT_DIR"] = str(TMP / "snapshots")
os.environ["FUSION_REPO_CACHE"] = str(TMP / "repos")
os.environ["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from fusion_site.repos.snapshots import remove_tree, snapshot  # noqa: E402

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


def git(*args: str, cwd: Path, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env or GIT_ENV, **kw)


def make_repository(path: Path, n_files: int, n_commits: int) -> list[str]:
    """Python-like sources of 0.1-8 KiB in 3 levels of folders (200 leaves); each commit
    changes ~2 % of them and adds a few. Returns the commit ids, oldest first."""
    rng = random.Random(7)
    path.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=path)

    def source(i: int, version: int) -> Path:
        target = path / f"pkg{i % 20:02d}" / f"sub{i % 5}" / f"leaf{i % 2}" / f"mod{i}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# v{version}\n" + f"VALUE_{i} = {i}\n" * rng.randint(8, 500))
        return target

    first = max(n_files - 5 * (n_commits - 1), 1)
    for i in range(first):
        source(i, 0)
    commits = []
    next_file = first
    for c in range(n_commits):
        if c:
            for i in rng.sample(range(next_file), max(next_file // 50, 1)):
                source(i, c)
            for _ in range(5):
                source(next_file, c)
                next_file += 1
        git("add", "-A", cwd=path)
        git("commit", "-q", "-m", f"commit {c}", cwd=path)
        commits.append(git("rev-parse", "HEAD", cwd=path, text=True).stdout.strip())
    return commits


def read_tree(mirror: Path, commit: str, target: Path) -> Callable[[], None]:
    index = target.with_name(target.name + ".idx")
    target.mkdir()
    git(
        "--git-dir",
        str(mirror),
        "--work-tree",
        str(target),
        "read-tree",
        "-u",
        "--reset",
        commit,
        cwd=target,
        env={**GIT_ENV, "GIT_INDEX_FILE": str(index)},
    )
    index.unlink()

    def remove() -> None:
        shutil.rmtree(target)

    return remove


def worktree(mirror: Path, commit: str, target: Path) -> Callable[[], None]:
    git("--git-dir", str(mirror), "worktree", "add", "-q", "--no-checkout", "--detach", str(target), commit, cwd=TMP)
    git("reset", "-q", "--hard", cwd=target)

    def remove() -> None:
        shutil.rmtree(target)
        shutil.rmtree(mirror / "worktrees" / target.name)

    return remove


def archive(mirror: Path, commit: str, target: Path) -> Callable[[], None]:
    target.mkdir()
    with subprocess.Popen(["git", "--git-dir", str(mirror), "archive", commit], stdout=subprocess.PIPE) as producer:
        subprocess.run(["tar", "-x", "-C", str(target)], stdin=producer.stdout, check=True)
        assert producer.stdout is not None
        producer.stdout.close()
        if producer.wait() != 0:
            raise RuntimeError("git archive failed")

    def remove() -> None:
        shutil.rmtree(target)

    return remove


def service(mirror_source: str, commit: str, target: Path) -> Callable[[], None]:
    cm = snapshot(mirror_source, commit, label="run-1")
    cm.__enter__()

    def remove() -> None:
        cm.__exit__(None, None, None)

    return remove


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--commits", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        repo = TMP / "repo"
        commits = make_repository(repo, args.files, args.commits)
        mirror = TMP / "mirror.git"
        git("clone", "--bare", "-q", str(repo), str(mirror), cwd=TMP)
        git("config", "gc.auto", "0", cwd=mirror)
        work = TMP / "work"
        work.mkdir()
        modes: list[tuple[str, Callable[[Path, str, Path], Callable[[], None]]]] = [
            ("(a) read-tree -u, private index", read_tree),
            ("(b) worktree add + reset --hard", worktree),
            ("(c) git archive | tar -x", archive),
            ("    snapshot() of the service", lambda _m, c, t: service(str(repo), c, t)),
        ]
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in modes}
        counter = 0
        for r in range(args.rounds + 1):  # round 0 warms the page cache and the service's mirror
            commit = commits[r % len(commits)]
            for name, make in modes:
                counter += 1
                target = work / f"s{counter}"
                started = time.perf_counter()
                remove = make(mirror, commit, target)
                made = time.perf_counter()
                remove()
                removed = time.perf_counter()
                if r:
                    samples[name].append(((made - started) * 1000, (removed - made) * 1000))
        files = int(git("ls-tree", "-r", "--name-only", commits[-1], cwd=mirror, text=True).stdout.count("\n"))
    finally:
        remove_tree(TMP)

    print(
        f"one snapshot of a commit from a bare mirror: {files} files at the last of {args.commits} commits, "
        f"median of {args.rounds} rounds (the modes take turns)"
    )
    print(f"{'mode':<36} {'make ms':>8} {'remove ms':>10} {'total ms':>9} {'ratio':>6}")
    totals = {}
    for name, got in samples.items():
        made = statistics.median(m for m, _ in got)
        removed = statistics.median(r for _, r in got)
        totals[name] = statistics.median(m + r for m, r in got)
        base = totals.get(modes[0][0], totals[name])
        print(f"{name:<36} {made:>8.1f} {removed:>10.1f} {totals[name]:>9.1f} {totals[name] / base:>6.2f}")
    a, b, c = (totals[name] for name, _ in modes[:3])
    print(f"ratio_worktree_over_read_tree={b / a:.2f}")
    print(f"ratio_archive_over_read_tree={c / a:.2f}")
    print(f"faster_of_a_b={'a (read-tree)' if a <= b else 'b (worktree)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
