"""Benchmark: the private copy each `run` check gets of its run's snapshot.

Run:  .venv/bin/python bench/check_copies.py [--files 2000] [--rounds 10]

Builds a git repository of about 2,000 files in a temporary folder, makes one snapshot
of it (`fusion_site.repos.snapshots.snapshot`), and times, per copy of that snapshot, making it
and removing it, for each way of copying. The baseline, measured in the same run, is a
plain `git worktree add` snapshot of the same revision (add, checkout, read-only, remove):
what a check would cost if each one had its own snapshot. `private_copy` is what the
service uses. Hard links are timed for comparison only: they are not safe (the script
shows that a check can change the snapshot through one).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA_DIR = tempfile.mkdtemp(prefix="fusion-bench-")
os.environ["FUSION_DATA_DIR"] = DATA_DIR  # before settings are read
os.environ["FUSION_SNAPSHOT_DIR"] = str(Path(DATA_DIR) / "snapshots")
os.environ["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from bench.support.repos import GIT_ENV, make_source_tree  # noqa: E402
from fusion_site.repos.snapshots import (  # noqa: E402
    READ_ONLY_UMASK,
    _writable_folders,
    private_copy,
    remove_tree,
    snapshot,
    snapshot_root,
)


@contextlib.contextmanager
def cp(source: Path, *flags: str):
    target = snapshot_root() / f"bench-cp-{time.perf_counter_ns()}"
    subprocess.run(["cp", *flags, "--", str(source), str(target)], check=True, capture_output=True)
    try:
        yield target
    finally:
        remove_tree(target)


@contextlib.contextmanager
def copytree(source: Path):
    target = snapshot_root() / f"bench-tree-{time.perf_counter_ns()}"
    shutil.copytree(source, target, symlinks=True)
    try:
        yield target
    finally:
        remove_tree(target)


@contextlib.contextmanager
def checkout_index(repo: Path, commit: str):
    """A tree of the revision from git's objects: a private index, `checkout-index` into a
    folder, made read-only (restored protected files would have to be written again)."""
    target = snapshot_root() / f"bench-index-{time.perf_counter_ns()}"
    index = Path(f"{target}.index")
    env = {**os.environ, **GIT_ENV, "GIT_INDEX_FILE": str(index)}
    subprocess.run(["git", "-C", str(repo), "read-tree", commit], check=True, capture_output=True, env=env)
    subprocess.run(
        ["git", "-C", str(repo), "checkout-index", "-a", f"--prefix={target}/"],
        check=True,
        capture_output=True,
        env=env,
        umask=READ_ONLY_UMASK,  # read-only files, as a snapshot's
    )
    index.unlink()
    _writable_folders(target)
    try:
        yield target
    finally:
        remove_tree(target)


def once(make) -> tuple[float, float]:
    """ms to make one copy, and to remove it."""
    started = time.perf_counter()
    with make():
        middle = time.perf_counter()
    return (middle - started) * 1000, (time.perf_counter() - middle) * 1000


def timed(rows, rounds: int) -> list[tuple[str, float, float]]:
    """Median make and remove ms per strategy; the strategies take turns, round after
    round, so that a slow moment of the machine weighs on all of them alike."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name, _make in rows}
    for _ in range(rounds):
        for name, make in rows:
            samples[name].append(once(make))
    return [
        (name, statistics.median(m for m, _r in got), statistics.median(r for _m, r in got))
        for name, got in samples.items()
    ]


def hard_links_leak(source: Path) -> bool:
    """Whether a check in a hard-linked copy can change the snapshot: chmod, write in place."""
    victim = next(p for p in sorted(source.rglob("*.py")) if p.is_file() and not p.is_symlink())
    before = victim.read_bytes()
    with cp(source, "-al") as copy:
        inside = copy / victim.relative_to(source)
        inside.chmod(0o644)
        inside.write_text("changed by a check\n")
        leaked = victim.read_bytes() != before
    victim.chmod(0o644)
    victim.write_bytes(before)
    victim.chmod(0o444)
    return leaked


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    repo = Path(DATA_DIR) / "repo"
    try:
        commit = make_source_tree(repo, args.files)
        with snapshot(str(repo), commit, label="run-1") as source:
            files = sum(len(names) for _dirpath, _dirs, names in os.walk(source))
            rows = [
                ("git worktree add (baseline)", lambda: snapshot(str(repo), commit, label="run-1")),
                ("private_copy (cp -a --reflink=auto)", lambda: private_copy(source)),
                ("cp -a", lambda: cp(source, "-a")),
                ("shutil.copytree", lambda: copytree(source)),
                ("read-tree + checkout-index", lambda: checkout_index(repo, commit)),
                ("cp -al (hard links, NOT safe)", lambda: cp(source, "-al")),
            ]
            timed(rows[:2], 1)  # warm the page cache
            results = timed(rows, args.rounds)
            leaked = hard_links_leak(source)
    finally:
        shutil.rmtree(DATA_DIR, ignore_errors=True)

    print(f"one copy of a snapshot of {files} files ({args.files} sources), median of {args.rounds}")
    print(f"{'strategy':<38} {'make ms':>8} {'remove ms':>10} {'total ms':>9} {'ratio':>6}")
    baseline = results[0][1] + results[0][2]
    for name, made, removed in results:
        print(f"{name:<38} {made:>8.1f} {removed:>10.1f} {made + removed:>9.1f} {(made + removed) / baseline:>6.2f}")
    print(f"ratio_private_copy_over_worktree={(results[1][1] + results[1][2]) / baseline:.2f}")
    print(f"hard_links_change_the_snapshot={'yes' if leaked else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
