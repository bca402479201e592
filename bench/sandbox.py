"""Benchmark: what the sandbox costs a check, and snapshots made from a kept one.

Run:  .venv/bin/python bench/sandbox.py [--files 20000] [--rounds 50] [--snapshot-rounds 7] [--snapshot-root /dev/shm]

Builds two git repositories in a temporary folder: the demo's (missions/demo/, a dozen
files) and a generated one of --files sources in nested packages (bench/support/repos.py,
about 160 MB checked out at 20,000), with a second commit that changes one file. Then:

1. Per check, on a snapshot of each (`fusion_site.repos.snapshots.snapshot`), a trivial
   command (`true`, and `python -c pass` with the checks' base interpreter) through
   `run_command`: bare (no confinement, the baseline), in bubblewrap with the snapshot
   bound read-write (`Confinement(layered=False)`), and over the pristine snapshot with a
   private overlay (`Confinement(layered=True)`, the service's default). The three take
   turns, round after round; the median of --rounds each, and the sandbox's cost over
   bare. On the large repository, for comparison, the same check in a private copy of
   the snapshot (`snapshots.private_copy`, `cp -a --reflink=auto`: the per-check copy the
   overlay replaces), made and removed each time (fewer rounds: --snapshot-rounds).
2. A run's snapshot of the second commit of the large repository: from scratch (the
   service's `snapshot`, made and removed) against one made from a snapshot of the first
   commit the worker kept (`snapshot(..., reuse=True)`: taken, checked against its index,
   brought over by `git read-tree -m -u`, kept again). The two alternate; each reuse comes
   more than a second after the last write of its snapshot, as a run does after its
   checks, out of git's same-second window in which it reads a file whose time equals its
   index's instead of trusting its times (the first reuse of a snapshot just made, which
   pays that, is printed too).

3. A declared environment (docs/ENVIRONMENTS.md) for a Python project with three
   dependencies, from a folder of wheels in the repository (`--no-index --find-links`: no
   network): its first build (a virtualenv from the base interpreter, then pip, in the
   sandbox) against its reuse from the cache by a later run with the same key
   (`envcache.held`, the service's own path). Median of --env-rounds, each round with a
   cache of its own.

Goals (the sandbox issue): under 30 ms per check and flat in the repository's size; a
snapshot from a kept one under 10% of one from scratch. Prints ratios to the baselines
measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--snapshot-rounds", type=int, default=7)
    parser.add_argument("--env-rounds", type=int, default=3)
    parser.add_argument(
        "--snapshot-root",
        type=Path,
        help="where the snapshots and copies go (default: the temporary folder; e.g. /dev/shm to leave the "
        "disk's file-creation cost out)",
    )
    return parser.parse_args()


ARGS = _arguments()
TMP = Path(tempfile.mkdtemp(prefix="fusion-bench-sandbox-"))
SNAPSHOTS = (
    Path(tempfile.mkdtemp(prefix="fusion-bench-sandbox-", dir=ARGS.snapshot_root)) if ARGS.snapshot_root else TMP
)
os.environ["FUSION_DATA_DIR"] = str(TMP / "data")  # before settings are read
os.environ["FUSION_SNAPSHOT_DIR"] = str(SNAPSHOTS / "snapshots")
os.environ["FUSION_REPO_CACHE"] = str(TMP / "repos")
os.environ["FUSION_ENV_CACHE"] = str(TMP / "environments")
os.environ["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.test import override_settings  # noqa: E402

from bench.support.repos import commit_all, make_source_tree  # noqa: E402
from fusion_site.repos import snapshot_reuse  # noqa: E402
from fusion_site.repos.snapshots import private_copy, remove_tree, snapshot  # noqa: E402
from fusion_site.runtime import envcache, sandbox  # noqa: E402
from fusion_site.runtime.proc import run_command, scrubbed_env  # noqa: E402
from fusion_site.runtime.sandbox import Confinement  # noqa: E402
from missions.demo.wheel import wheel, wheel_name  # noqa: E402
from missions.environment_spec import effective  # noqa: E402
from missions.management.commands.demo import make_repository as make_demo_repository  # noqa: E402
from validation import environments  # noqa: E402

COMMANDS = {"true": ["true"], "python -c pass": [str(sandbox.check_interpreter()), "-c", "pass"]}


def check(tree: Path, argv: list[str], confine: Confinement | None) -> float:
    """ms of one check through `run_command`."""
    started = time.perf_counter()
    result = run_command(argv, cwd=tree, timeout=60, max_output=4096, env=scrubbed_env(), confine=confine)
    elapsed = (time.perf_counter() - started) * 1000
    if not result.ok:
        sys.exit(f"{argv} failed in {tree}: {result.output[-2000:]}")
    return elapsed


def in_copy(tree: Path, argv: list[str]) -> float:
    """ms of one check in a private copy of the snapshot, the copy made and removed."""
    started = time.perf_counter()
    with private_copy(tree) as copy:
        check(copy, argv, None)
    return (time.perf_counter() - started) * 1000


def medians(ways: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """The median ms of each way; they take turns, round after round, so that a slow
    moment of the machine weighs on all of them alike (round 0 warms up, not counted)."""
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(rounds + 1):
        for name, way in ways.items():
            took = way()
            if r:
                samples[name].append(took)
    return {name: statistics.median(got) for name, got in samples.items()}


def per_check(name: str, repo: Path, commit: str, args: argparse.Namespace) -> None:
    with snapshot(str(repo), commit, label="run-1") as tree:
        files = sum(len(names) for _dirpath, _dirs, names in os.walk(tree))
        for command, argv in COMMANDS.items():
            ways = {
                "bare": lambda a=argv: check(tree, a, None),
                "bubblewrap, rw bind": lambda a=argv: check(tree, a, Confinement(tree=tree, layered=False)),
                "bubblewrap, overlay": lambda a=argv: check(tree, a, Confinement(tree=tree, layered=True)),
            }
            got = medians(ways, args.rounds)
            if name == "large" and command == "python -c pass":
                got |= medians({"private copy, bare": lambda a=argv: in_copy(tree, a)}, args.snapshot_rounds)
            bare = got["bare"]
            for way, ms in got.items():
                print(
                    f"{name:<6} {files:>6} files  {command:<15} {way:<22} {ms:>8.1f} ms  "
                    f"x{ms / bare:>5.2f}  +{ms - bare:>7.1f} ms"
                )
            print(
                f"sandbox_{name}_{command.split()[0]}: overlay_adds_ms={got['bubblewrap, overlay'] - bare:.1f} "
                f"ratio_overlay_over_bare={got['bubblewrap, overlay'] / bare:.2f}"
            )


def timed_snapshot(repo: Path, commit: str, *, reuse: bool) -> tuple[float, float]:
    """ms to make a run's snapshot, and to let it go (removed, or kept)."""
    started = time.perf_counter()
    with snapshot(str(repo), commit, label="run-2", reuse=reuse):
        made = time.perf_counter()
    return (made - started) * 1000, (time.perf_counter() - made) * 1000


def incremental(repo: Path, commits: tuple[str, str], rounds: int) -> None:
    older, newer = commits
    timed_snapshot(repo, older, reuse=False)  # warms the mirror and the page cache
    timed_snapshot(repo, older, reuse=True)  # kept
    first = timed_snapshot(repo, newer, reuse=True)  # right after the write: git reads the same-second files
    scratch: list[tuple[float, float]] = []
    reused: list[tuple[float, float]] = []
    for r in range(rounds):
        time.sleep(1.1)  # a run's checks take longer than git's one-second window
        reused.append(timed_snapshot(repo, commits[r % 2], reuse=True))
        scratch.append(timed_snapshot(repo, commits[r % 2], reuse=False))
    s_make, s_free = (statistics.median(x[i] for x in scratch) for i in (0, 1))
    r_make, r_free = (statistics.median(x[i] for x in reused) for i in (0, 1))
    print(f"snapshot of a one-file change, large repository, median of {rounds}:")
    print(f"  from scratch (made + removed)        {s_make:>8.1f} + {s_free:>6.1f} ms")
    print(f"  from a kept snapshot (made + kept)   {r_make:>8.1f} + {r_free:>6.1f} ms")
    print(f"  first reuse right after its checkout {first[0]:>8.1f} + {first[1]:>6.1f} ms")
    print(f"ratio_reused_over_scratch={(r_make + r_free) / (s_make + s_free):.3f}")
    print(f"ratio_reused_over_scratch_made={r_make / s_make:.3f}")


DEPENDENCIES = ("alpha", "beta", "gamma")


def make_python_project(repo: Path) -> str:
    """A project needing three packages, carried as wheels in its `wheels/` folder."""
    (repo / "wheels").mkdir(parents=True)
    for name in DEPENDENCIES:
        module = {f"{name}/__init__.py": f"NAME = {name!r}\n"}
        (repo / "wheels" / wheel_name(name, "1.0")).write_bytes(wheel(name, "1.0", module))
    (repo / "requirements.txt").write_text("".join(f"{name}==1.0\n" for name in DEPENDENCIES))
    (repo / "test_deps.py").write_text("import alpha, beta, gamma\n")
    return commit_all(repo, "a project with three dependencies", init=True)


def environment(repo: Path, commit: str, rounds: int) -> None:
    spec = effective(
        {"preset": "python", "setup": ["pip install --no-index --find-links wheels -r requirements.txt"],
         "key_files": ["requirements.txt", "wheels/*"]}
    )  # fmt: skip
    assert spec is not None
    builds: list[float] = []
    reuses: list[float] = []
    with snapshot(str(repo), commit, label="run-3") as tree:
        key = environments.environment_key(spec, repository="bench", checkout=tree)
        for r in range(rounds):
            with override_settings(FUSION_ENV_CACHE=str(TMP / f"environments-{r}")):
                for times in (builds, reuses):
                    started = time.perf_counter()
                    with envcache.held(key, lambda folder: environments._build(spec, folder, tree).ok) as entry:
                        times.append((time.perf_counter() - started) * 1000)
                    if not entry.ready or entry.reused != (times is reuses):
                        sys.exit(f"the environment did not build as expected: {entry}")
    build, reuse = statistics.median(builds), statistics.median(reuses)
    print(f"environment, python, {len(DEPENDENCIES)} dependencies from wheels, median of {rounds}:")
    print(f"  first build (venv + pip, sandboxed)  {build:>8.1f} ms")
    print(f"  reuse from the cache                 {reuse:>8.1f} ms")
    print(f"ratio_env_reuse_over_build={reuse / build:.4f}")


def main() -> int:
    args = ARGS
    if not sandbox.layers_work():
        sys.exit(f"no sandbox with a private overlay here ({sandbox.status().record}): nothing to measure")
    try:
        demo = TMP / "demo"
        demo_commit = make_demo_repository(demo)
        large = TMP / "large"
        first = make_source_tree(large, args.files)
        (large / "pkg000" / "sub0" / "mod0.py").write_text("VALUE = 'changed'\n")
        second = commit_all(large, "one file changed")
        print(f"sandbox: {sandbox.status().record}; python: {COMMANDS['python -c pass'][0]}")
        per_check("demo", demo, demo_commit, args)
        per_check("large", large, first, args)
        incremental(large, (first, second), args.snapshot_rounds)
        project = TMP / "project"
        environment(project, make_python_project(project), args.env_rounds)
    finally:
        snapshot_reuse.forget()
        for folder in {TMP, SNAPSHOTS}:
            remove_tree(folder)
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
