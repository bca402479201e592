"""Loop throughput: 200 features, two cheap checks each, all tasks completed at once.

Measures the time until every feature has passed and the latency from task completion
to `passed` (p50, p99), against a baseline measured in the same run: the same checks run
by a plain script in one worktree per feature plus one bare Dramatiq round trip per
feature. Prints features/second for both and the ratio, and the peak RSS of this process
(embedded: web + workers live in one process).

    .venv/bin/python bench/loop_throughput.py [--features 200]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TMP = Path(tempfile.mkdtemp(prefix="fusion-bench-"))
os.environ.setdefault("FUSION_DATA_DIR", str(TMP / "data"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fusion_site.settings")
os.environ.setdefault("FUSION_RETRY_BACKOFF_MS", "0")

import django  # noqa: E402

django.setup()

import dramatiq  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

CHECK_RUN = {"run": "python -c \"print('ok')\"", "expect_output": "ok"}


def make_repo(n: int) -> tuple[Path, str]:
    repo = TMP / "repo"
    repo.mkdir()
    for i in range(n):
        (repo / f"f{i}.txt").write_text(f"feature {i} done\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "all"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return repo, rev


def build_mission(repo: Path, n: int):
    from missions.models import ContractAssertion, Feature, Milestone, Mission, Slice
    from missions.services.tasks import task_create

    mission = Mission.objects.create(key=f"bench-{int(time.time())}", title="bench", status="active", workspace=str(repo))
    milestone = Milestone.objects.create(mission=mission, key="m", title="m")
    slice_ = Slice(milestone=milestone, key="s", title="s")
    slice_.save()
    tasks = []
    for i in range(n):
        feature = Feature(slice=slice_, key=f"f{i}", title=f"f{i}")
        feature.save()
        a1 = ContractAssertion(milestone=milestone, key=f"F{i}-FILE", title="file", statement="s",
                               check_spec={"file": f"f{i}.txt", "contains": f"feature {i}"})
        a2 = ContractAssertion(milestone=milestone, key=f"F{i}-RUN", title="run", statement="s", check_spec=CHECK_RUN)
        a1.save()
        a2.save()
        feature.assertions.add(a1, a2)
        tasks.append(task_create(user=None, feature=feature))
    return mission, tasks


def run_loop(n: int, threads: int) -> dict:
    from missions.models import Feature
    from missions.services.tasks import task_complete
    from validation.models import ValidatorRun

    repo, rev = make_repo(n)
    mission, tasks = build_mission(repo, n)
    broker = dramatiq.get_broker()
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=50)
    worker.start()
    started = time.monotonic()
    completed_at = {}
    for task in tasks:
        task_complete(user=None, task=task, revision=rev)
        completed_at[task.feature_id] = timezone.now()
    while Feature.objects.filter(mission=mission).exclude(loop_state="passed").exists():
        bad = Feature.objects.filter(mission=mission, loop_state__in=["blocked", "needs_fix"]).count()
        if bad:
            raise SystemExit(f"{bad} features did not pass")
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    worker.stop()
    latencies = sorted((r.completed_at - completed_at[r.feature_id]).total_seconds()
                       for r in ValidatorRun.objects.filter(mission=mission))
    return {"elapsed": elapsed, "p50": statistics.median(latencies), "p99": latencies[int(len(latencies) * 0.99) - 1],
            "repo": repo, "rev": rev}


@dramatiq.actor(max_retries=0, queue_name="bench")
def _noop(i: int) -> None:
    return None


def run_baseline(n: int, repo: Path, rev: str, threads: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    from validation.context import AssertionSpec
    from validation.snapshots import snapshot
    from validation.validators.checks import judge_assertion

    def one(i: int) -> None:
        with snapshot(str(repo), rev, label="baseline") as root:
            judge_assertion(root, AssertionSpec(f"F{i}-FILE", "file", "s", {"file": f"f{i}.txt", "contains": f"feature {i}"}))
            judge_assertion(root, AssertionSpec(f"F{i}-RUN", "run", "s", CHECK_RUN))

    broker = dramatiq.get_broker()
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=50)
    worker.start()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, range(n)))
    for i in range(n):
        _noop.send(i)
    broker.join("bench")
    elapsed = time.monotonic() - started
    worker.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--features", type=int, default=200)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    loop = run_loop(args.features, args.threads)
    baseline = run_baseline(args.features, loop["repo"], loop["rev"], args.threads)
    loop_fps, base_fps = args.features / loop["elapsed"], args.features / baseline
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"features={args.features} threads={args.threads} database={django.conf.settings.DATABASES['default']['ENGINE']}")
    print(f"loop: {loop['elapsed']:.2f}s  {loop_fps:.1f} features/s  latency p50={loop['p50']:.2f}s p99={loop['p99']:.2f}s")
    print(f"baseline: {baseline:.2f}s  {base_fps:.1f} features/s")
    print(f"ratio_loop_time_over_baseline={loop['elapsed'] / baseline:.2f}")
    print(f"peak_rss_mb={rss_mb:.0f}")


if __name__ == "__main__":
    main()
