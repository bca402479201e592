"""Faults in the production shape: PostgreSQL, Redis and separate
`manage.py rundramatiq` worker processes pointed at the pytest test database.

The test process is the web tier and the periodic sweep: it completes the tasks (their
messages go to Redis on commit), runs `recover()` every few seconds as the embedded
server's sweep would, injects the faults and checks the invariants.

1. Worker crashes: 200 features in flight across two worker processes; one of them is
   SIGKILLed (its whole process group) at random moments, at least 10 times, and
   restarted each time.
2. Lost messages: the deployment's Dramatiq keys in Redis are deleted mid-run (queues,
   delayed queues, acks). The shared Redis server itself is not restarted: other
   engineers' and CI's runs use it; deleting this deployment's namespace loses exactly
   what a restart without persistence loses for this deployment.
3. Database outage: every connection of the workers is terminated with
   `pg_terminate_backend`, repeatedly (the shared PostgreSQL server is not stopped).

Afterwards (each scenario): every feature is in the state a clean run reaches (good
implementations passed; bad ones implementing with exactly one fix feature), every
(feature, implementation attempt) has exactly one run with a verdict and that run one
accepted decision in its journal, no fix feature is duplicated, no worktree or snapshot
folder is left, MissionEvent seq is gapless per mission and every recorded event reached
the event stream's storage, at most one running run per feature, lineage consistent
with the runs, stored rollups equal to a recomputation.

Skipped unless DATABASE_URL is PostgreSQL and REDIS_URL is set (CI's second pass).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import quote

import dramatiq
import pytest
from django.conf import settings
from django.db import connection

from fusion_site.repos.snapshots import snapshot_root
from missions.models import ContractAssertion, Milestone, Mission, MissionEvent, MissionFeature, Slice
from missions.selectors import milestone_rollup
from missions.services.tasks import task_complete, task_create
from tests.conftest import is_postgres
from tests.support.workers import child_database_url
from validation.models import FixLineage, JournalEntry, RunStatus, ValidatorRun
from validation.services.recovery import recover

pytestmark = [
    pytest.mark.skipif(
        not (settings.REDIS_URL and is_postgres()),
        reason="production shape only: needs DATABASE_URL=postgres://… and REDIS_URL "
        "(the PostgreSQL + Redis pass of .ci/run)",
    ),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.postgres,
]

ROOT = Path(__file__).resolve().parents[2]
FEATURES = int(os.environ.get("FUSION_FAULT_FEATURES", "200"))
KILLS = int(os.environ.get("FUSION_FAULT_KILLS", "10"))
LEASE_SECONDS = 4
SETTLE_TIMEOUT = float(os.environ.get("FUSION_FAULT_TIMEOUT", "300"))


def clear_namespace() -> int:
    """Delete every Redis key of this deployment's Dramatiq namespace (queues, delayed
    queues, acks, heartbeats); nobody else uses this prefix."""
    broker = dramatiq.get_broker()
    keys = list(broker.client.scan_iter(match=f"{broker.namespace}*", count=500))
    for key in keys:
        broker.client.delete(key)
    return len(keys)


class Workers:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, name: str) -> subprocess.Popen:
        log = self.tmp_path / f"worker-{name}-{len(self.procs)}.log"
        env = {
            **os.environ,
            "DATABASE_URL": child_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "FUSION_EVENTS_PREFIX": settings.EVENTS_PREFIX,
            "FUSION_DATA_DIR": str(settings.DATA_DIR),
            "FUSION_SNAPSHOT_DIR": str(snapshot_root()),
            "FUSION_RETRY_BACKOFF_MS": "0",
            "FUSION_RUN_LEASE_SECONDS": str(LEASE_SECONDS),
            "FUSION_CHECK_PARALLELISM": "1",
            "DJANGO_SETTINGS_MODULE": "fusion_site.settings",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
        }
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "rundramatiq",
                    "--processes",
                    "1",
                    "--threads",
                    "2",
                    "--worker-shutdown-timeout",
                    "3000",
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append((proc, log))
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # forked workers that outlived their master

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}" for _, log in self.procs if log.exists()
        )

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                self.kill(proc, signal.SIGTERM)


@pytest.fixture
def workers(transactional_db, tmp_path, settings):
    settings.FUSION_REDRIVE_GRACE = 15  # a queued run is re-sent only once it has clearly been lost
    clear_namespace()
    handle = Workers(tmp_path)
    try:
        yield handle
    finally:
        handle.stop_all()
        clear_namespace()


# ------------------------------------------------------------------------ the world


def build(git_repo, owner, n: int, *, bad_every: int = 4) -> tuple[Mission, str, dict[int, str]]:
    """A mission of `n` features, each judged by one file check on its own file; every
    `bad_every`-th implementation is wrong. Returns the mission, the revision that lands
    and {feature id: expected clean-run end state}."""
    files, expected = {}, {}
    mission = Mission.objects.create(
        key="faults", title="Faults", owner=owner, status="active", auto_fix=True, repository=str(git_repo.path)
    )
    milestone = Milestone.objects.create(mission=mission, key="m1", title="Milestone")
    slice_ = Slice(milestone=milestone, key="s1", title="Slice")
    slice_.save()
    for i in range(n):
        key = f"f{i:03d}"
        good = i % bad_every != bad_every - 1
        files[f"src/{key}.txt"] = f"done {key}\n" if good else f"todo {key}\n"
        feature = MissionFeature(slice=slice_, key=key, title=f"Feature {key}", order=i)
        feature.save()
        a = ContractAssertion(
            milestone=milestone,
            key=f"VAL-{key}",
            title=f"{key} done",
            statement=f"{key} is done",
            check_spec={"file": f"src/{key}.txt", "contains": f"^done {key}$"},
            order=i,
        )
        a.save()
        feature.assertions.add(a)
        expected[feature.pk] = "passed" if good else "implementing"
    revision = git_repo.commit(files, "implement everything")
    return mission, revision, expected


def start_all(mission: Mission, owner, revision: str) -> None:
    tasks = [task_create(user=owner, feature=f) for f in MissionFeature.objects.filter(mission=mission).order_by("pk")]
    for task in tasks:
        task_complete(user=owner, task=task, revision=revision, summary="landed")


def roots(mission: Mission):
    return MissionFeature.objects.filter(mission=mission, generated_from__isnull=True)


def settled(mission: Mission, expected: dict[int, str]) -> bool:
    states = dict(roots(mission).values_list("pk", "loop_state"))
    if states != expected:
        return False
    return not ValidatorRun.objects.filter(mission=mission, status=RunStatus.RUNNING).exists()


def drive(mission, expected, workers: Workers, *, timeout: float = SETTLE_TIMEOUT, during=None) -> dict:
    """Sweep every few seconds (the periodic recovery) until the mission settles;
    `during(elapsed)` injects faults. Returns what the sweeps did."""
    started = time.monotonic()
    totals: Counter = Counter()
    last_sweep = 0.0
    while time.monotonic() - started < timeout:
        elapsed = time.monotonic() - started
        if during is not None:
            during(elapsed)
        if time.monotonic() - last_sweep > 3:
            report = recover()
            last_sweep = time.monotonic()
            for name, value in report.items():
                totals[name] += len(value) if isinstance(value, (list, dict)) else int(bool(value))
        if (during is None or getattr(during, "done", True)) and settled(mission, expected):
            return dict(totals)
        time.sleep(0.5)
    states = Counter(roots(mission).values_list("loop_state", flat=True))
    pytest.fail(f"the mission did not settle in {timeout:g}s: {dict(states)}\n{workers.logs()}")


# ----------------------------------------------------------------------- invariants


def worktrees(repo) -> list[str]:
    out = repo.git("worktree", "list", "--porcelain")
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


def assert_invariants(mission: Mission, expected: dict[int, str], git_repo) -> dict:
    # the clean-run end state
    states = dict(roots(mission).values_list("pk", "loop_state"))
    assert states == expected
    # one run with a verdict per (feature, implementation attempt), one accepted decision each
    verdicts: dict[tuple[int, int], list[int]] = defaultdict(list)
    for run in ValidatorRun.objects.filter(
        mission=mission,
        feature__generated_from__isnull=True,
        status__in=[RunStatus.PASSED, RunStatus.FAILED, RunStatus.BLOCKED],
    ):
        verdicts[(run.feature_id, run.implementation_attempt)].append(run.pk)
    doubled = {k: v for k, v in verdicts.items() if len(v) != 1}
    assert not doubled, f"(feature, attempt) with more than one verdict: {doubled}"
    assert len(verdicts) == len(expected)
    # fixes: exactly one per failed root, lineage consistent with the runs
    fixes = Counter(
        MissionFeature.objects.filter(mission=mission, generated_from__isnull=False).values_list(
            "generated_from_id", flat=True
        )
    )
    bad = {pk for pk, state in expected.items() if state == "implementing"}
    assert dict(fixes) == dict.fromkeys(bad, 1), "a fix feature is missing or duplicated"
    for lineage in FixLineage.objects.filter(root__mission=mission).select_related("run", "fix"):
        assert lineage.run.status == RunStatus.FAILED and lineage.run.feature_id == lineage.source_id
        assert (
            lineage.fix.generated_from_id == lineage.source_id and lineage.fix.generated_from_run_id == lineage.run_id
        )
    assert FixLineage.objects.filter(root__mission=mission).count() == len(bad)
    # at most one running run per feature (the partial unique index), none left running
    running = Counter(
        ValidatorRun.objects.filter(mission=mission, status=RunStatus.RUNNING).values_list("feature_id", flat=True)
    )
    assert all(n <= 1 for n in running.values())
    # rollups equal to a recomputation
    for milestone in Milestone.objects.filter(mission=mission):
        assert milestone.validation_state == milestone_rollup(milestone_id=milestone.pk)["state"]
    # the audit log is gapless and every recorded event reached the stream's storage
    seqs = list(MissionEvent.objects.filter(mission=mission).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)), "MissionEvent seq has gaps"
    from django_eventstream.models import Event

    from missions.relay import redeliver_missing

    # The last sweep, once the workers are idle (no sender is in flight: no grace needed).
    relayed = redeliver_missing(grace_seconds=0)
    streamed = set()
    for data in Event.objects.filter(channel=f"mission-{mission.pk}").exclude(type="").values_list("data", flat=True):
        value = json.loads(data)
        if isinstance(value, str):  # send_event encodes the payload, the storage encodes that string again
            value = json.loads(value)
        streamed.add(value.get("seq"))
    missing = sorted(set(seqs) - streamed)
    assert not missing, f"{len(missing)} recorded events never reached the event stream (seq {missing[:20]})"
    # no snapshot left behind
    report = recover()
    assert report["reaped"] == [] and report["redriven_runs"] == []
    assert not list(snapshot_root().iterdir())
    assert worktrees(git_repo) == [str(git_repo.path)]
    # checked last, so that a failure here says every other invariant held
    verdict_runs = {pk for runs in verdicts.values() for pk in runs}
    accepted = Counter(
        JournalEntry.objects.filter(run__mission=mission, kind="decision", payload__verdict="accepted").values_list(
            "run_id", flat=True
        )
    )
    wrong = {pk: accepted.get(pk, 0) for pk in verdict_runs if accepted.get(pk, 0) != 1}
    assert not wrong, f"runs whose journal does not hold exactly one accepted decision: {wrong}; " + "; ".join(
        f"run {pk}: "
        + ", ".join(
            f"{e.seq}:{e.kind}:{e.key}:{e.payload.get('verdict', '')}"
            for e in JournalEntry.objects.filter(run_id=pk).order_by("seq")
        )
        for pk in list(wrong)[:3]
    )
    assert not [pk for pk, n in accepted.items() if n > 1], "a run accepted two verdicts"
    return {
        "events": len(seqs),
        "relayed_at_end": len(relayed),
        "runs": ValidatorRun.objects.filter(mission=mission).count(),
        "errors": ValidatorRun.objects.filter(mission=mission, status=RunStatus.ERROR).count(),
    }


def report(capsys, text: str) -> None:
    with capsys.disabled():
        print(f"\n[faults] {text}")


# ------------------------------------------------------------------------ scenarios


def test_clean_run_and_worker_kills(workers, git_repo, alice, capsys):
    """200 features in flight on two workers; one is SIGKILLed ≥ 10 times at random moments."""
    mission, revision, expected = build(git_repo, alice, FEATURES)
    stable = workers.start("stable")
    victim = [workers.start("victim")]
    rng = random.Random(int(os.environ.get("FUSION_FAULT_SEED", "8")))
    kills = {"count": 0, "next": rng.uniform(1.5, 4.0)}

    def during(elapsed):
        if kills["count"] < KILLS and elapsed >= kills["next"]:
            workers.kill(victim[0])
            kills["count"] += 1
            victim[0] = workers.start("victim")
            kills["next"] = elapsed + rng.uniform(1.5, 5.0)
        during.done = kills["count"] >= KILLS

    during.done = False
    started = time.monotonic()
    start_all(mission, alice, revision)
    sweeps = drive(mission, expected, workers, during=during)
    elapsed = time.monotonic() - started
    assert kills["count"] >= KILLS and stable.poll() is None
    figures = assert_invariants(mission, expected, git_repo)
    report(
        capsys,
        f"worker kills: {FEATURES} features, {kills['count']} SIGKILLs, settled in {elapsed:.1f}s; "
        f"sweeps {sweeps}; {figures}",
    )


def test_lost_redis_messages_are_recovered_by_the_sweep(workers, git_repo, alice, capsys):
    n = max(FEATURES // 4, 20)
    mission, revision, expected = build(git_repo, alice, n)
    workers.start("a")
    workers.start("b")
    flushed = {"times": 0, "keys": 0}

    def during(elapsed):
        if flushed["times"] < 3 and elapsed >= 1.0 + 3.0 * flushed["times"]:
            flushed["keys"] += clear_namespace()
            flushed["times"] += 1
        during.done = flushed["times"] >= 3

    during.done = False
    started = time.monotonic()
    start_all(mission, alice, revision)
    sweeps = drive(mission, expected, workers, during=during)
    figures = assert_invariants(mission, expected, git_repo)
    report(
        capsys,
        f"lost messages: {n} features, namespace flushed {flushed['times']}x ({flushed['keys']} keys), "
        f"settled in {time.monotonic() - started:.1f}s; sweeps {sweeps}; {figures}",
    )


def _terminate_worker_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return len(cursor.fetchall())


def test_database_connections_killed_repeatedly(workers, git_repo, alice, capsys):
    n = max(FEATURES // 4, 20)
    mission, revision, expected = build(git_repo, alice, n)
    workers.start("a")
    workers.start("b")
    outage = {"times": 0, "sessions": 0}

    def during(elapsed):
        if outage["times"] < 8 and elapsed >= 1.0 + 1.5 * outage["times"]:
            outage["sessions"] += _terminate_worker_connections()
            outage["times"] += 1
        during.done = outage["times"] >= 8
        # mid-outage invariants: never two running runs of one feature, lineage sound
        running = Counter(
            ValidatorRun.objects.filter(mission=mission, status=RunStatus.RUNNING).values_list("feature_id", flat=True)
        )
        assert all(c <= 1 for c in running.values())

    during.done = False
    started = time.monotonic()
    start_all(mission, alice, revision)
    sweeps = drive(mission, expected, workers, during=during)
    report(
        capsys,
        f"database outages: {n} features, {outage['times']} rounds of pg_terminate_backend "
        f"({outage['sessions']} sessions), settled in {time.monotonic() - started:.1f}s; sweeps {sweeps}",
    )
    figures = assert_invariants(mission, expected, git_repo)
    report(capsys, f"database outages: invariants hold; {figures}")
