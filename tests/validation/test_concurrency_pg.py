"""Concurrency of the loop: real threads, each with its own database
connection, released together by a barrier.

Written for PostgreSQL, where writers really interleave and the row locks, the partial
unique indexes and READ COMMITTED re-checks decide the races; CI runs this module in its
PostgreSQL + Redis pass. Every scenario here is also valid on SQLite (IMMEDIATE
transactions serialize the writers there), so the embedded pass runs the same tests
instead of skipping them; only the check that the threads hold distinct PostgreSQL
sessions is PostgreSQL-only.

Scenarios: two validate requests -> one 202 and one 409; fix creation for one failed run
from concurrent workers -> one fix, one lineage row, the same fix for every caller; 20
simultaneous completions of one task -> one run; the reaper against a late completion
-> exactly one terminal write; a verdict that sends the autopilot nothing against the
autopilot switched on meanwhile -> the switch waits, then notifies.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import dramatiq
import pytest
from django.db import connection, transaction
from django.utils import timezone

from missions.errors import Conflict
from missions.models import Mission, MissionEvent, MissionFeature, Task
from missions.services.tasks import task_create
from tests.conftest import is_postgres
from tests.support.locks import announcing_begin, wait_until_another_waits
from validation.models import FixLineage, RunStatus, ValidatorRun
from validation.services import runner
from validation.services.fixes import fix_create
from validation.services.recovery import reap_runs
from validation.services.verdicts import complete as outcomes
from validation.services.verdicts.admit import feature_admit
from validation.services.verdicts.complete import run_complete
from validation.services.verdicts.start import start_run
from validation.services.verdicts.task import task_outcome_process
from validation.verdict import AssertionVerdict, Evidence, Verdict

pytestmark = pytest.mark.django_db(transaction=True)

GREETING = {"file": "hello.py", "contains": r"def hello\("}
BAD_GREETING = {"file": "hello.py", "contains": r"def never_there\("}


def race(*fns, timeout: float = 60) -> list:
    """Run every callable in its own thread (own connection), released at once; return
    their results in order, or the exception a callable raised in its place."""
    barrier = threading.Barrier(len(fns))
    results: list = [None] * len(fns)

    def go(i, fn):
        try:
            barrier.wait(timeout=timeout)
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 — reported to the test as a value
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i, fn), name=f"racer-{i}") for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a racer hung (lock never released?)"
    return results


def features(build_mission, git_repo, n: int, *, check=GREETING, **kwargs) -> list[MissionFeature]:
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    build_mission({f"f{i}": [(f"VAL-{i}", check)] for i in range(n)}, **kwargs)
    return list(MissionFeature.objects.order_by("order"))


def started_events(feature: MissionFeature) -> int:
    return MissionEvent.objects.filter(type="validator-run:started", payload__feature=feature.pk).count()


# --- the racers really are concurrent sessions -------------------------------------------


@pytest.mark.skipif(not is_postgres(), reason="PostgreSQL only: SQLite has no server sessions (see the SQLite variant)")
def test_racers_hold_distinct_postgresql_sessions():
    def backend_pid():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    pids = race(*[backend_pid] * 4)
    assert all(isinstance(p, int) for p in pids) and len(set(pids)) == 4


@pytest.mark.skipif(is_postgres(), reason="the SQLite variant of test_racers_hold_distinct_postgresql_sessions")
def test_racers_hold_distinct_sqlite_connections():
    all_open = threading.Barrier(4)

    def raw_connection():
        connection.ensure_connection()
        raw = connection.connection
        all_open.wait(timeout=20)  # compare while all four are open (ids of closed ones are reused)
        return id(raw)

    seen = race(*[raw_connection] * 4)
    assert len(set(seen)) == 4, seen


# --- admission ------------------------------------------------------------------------


def test_two_concurrent_validate_requests_give_one_202_and_one_409(
    idle_broker, build_mission, git_repo, alice, api_for
):
    """Five rounds, one fresh feature each, so that a lucky interleaving cannot hide a race."""
    for feature in features(build_mission, git_repo, 5):

        def validate(feature=feature):
            response = api_for(alice).post(f"/api/features/{feature.pk}/validate/", {}, format="json")
            return response.status_code, response.json()

        results = race(validate, validate)
        assert sorted(code for code, _ in results) == [202, 409], results
        accepted = next(body for code, body in results if code == 202)
        conflict = next(body for code, body in results if code == 409)
        assert conflict["code"] == "validation_already_running"
        run = ValidatorRun.objects.get(feature=feature)
        assert accepted["id"] == run.pk and run.status == RunStatus.RUNNING and run.validator_attempt == 1
        feature.refresh_from_db()
        assert feature.loop_state == "validating" and feature.validator_attempts == 1 and feature.last_run_id == run.pk
        assert started_events(feature) == 1


def test_an_admission_held_open_makes_the_second_request_wait_then_409(
    idle_broker, build_mission, git_repo, alice, api_for, monkeypatch
):
    """Staged: the first admission holds its transaction open after creating the run until
    the second request waits for it (row lock / IMMEDIATE); that request then sees the
    running run."""
    feature = features(build_mission, git_repo, 1)[0]
    holding, begun = threading.Event(), threading.Event()
    from validation.services.verdicts import admit as admission

    real_start_run = admission.start_run

    def held_start_run(**kwargs):
        run = real_start_run(**kwargs)
        if threading.current_thread().name == "racer-0":
            holding.set()
            wait_until_another_waits(begun)  # still inside feature_admit's transaction
        return run

    monkeypatch.setattr(admission, "start_run", held_start_run)

    def first():
        response = api_for(alice).post(f"/api/features/{feature.pk}/validate/", {}, format="json")
        return response.status_code, response.json()

    def second():
        assert holding.wait(timeout=60)
        with announcing_begin(begun):
            response = api_for(alice).post(f"/api/features/{feature.pk}/validate/", {}, format="json")
        return response.status_code, response.json()

    (code1, body1), (code2, body2) = race(first, second)
    assert (code1, code2) == (202, 409), (body1, body2)
    assert body2["code"] == "validation_already_running"
    assert ValidatorRun.objects.filter(feature=feature).count() == 1 and started_events(feature) == 1


def test_the_database_allows_one_running_run_per_feature_even_without_the_row_lock(
    idle_broker, build_mission, git_repo
):
    """Two workers that skipped admission's row lock both try to create a running run:
    the partial unique index lets one in and the other gets a Conflict, not a second run."""
    feature = features(build_mission, git_repo, 1)[0]
    from validation import profiles
    from validation.services.run_input import RunInput, feature_assertion_specs, input_fingerprint

    profile = profiles.get_profile("composite")
    revision = git_repo.git("rev-parse", "HEAD").strip()
    assertions = feature_assertion_specs(feature)
    fingerprint = input_fingerprint(revision=revision, assertions=assertions, profile=profile)
    judged = RunInput(
        profile=profile,
        revision=revision,
        revision_name="",
        assertions=assertions,
        protection={},
        fingerprint=fingerprint,
    )

    def bypass():
        with transaction.atomic():
            stale = MissionFeature.objects.select_related("mission", "slice").get(pk=feature.pk)  # no row lock
            return start_run(feature=stale, judged=judged, trigger="manual", cause="validate", actor_id=None)

    results = race(bypass, bypass)
    runs = [r for r in results if isinstance(r, ValidatorRun)]
    conflicts = [r for r in results if isinstance(r, Conflict)]
    assert len(runs) == 1 and len(conflicts) == 1, results
    assert conflicts[0].code in ("validation_already_running", "state_changed")
    assert ValidatorRun.objects.filter(feature=feature).count() == 1
    assert ValidatorRun.objects.get(feature=feature).pk == runs[0].pk
    feature.refresh_from_db()
    assert feature.loop_state == "validating" and feature.last_run_id == runs[0].pk


# --- fix idempotency ------------------------------------------------------------------


def failed_feature(build_mission, git_repo, **kwargs) -> tuple[MissionFeature, ValidatorRun]:
    """A report-only mission whose feature failed: `needs_fix`, no fix yet."""
    feature = features(build_mission, git_repo, 1, check=BAD_GREETING, auto_fix=False, **kwargs)[0]
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    assert runner.execute_run(run.pk) == RunStatus.FAILED
    feature.refresh_from_db()
    assert feature.loop_state == "needs_fix" and not FixLineage.objects.exists()
    return feature, run


@pytest.mark.parametrize("workers", [2, 6])
def test_fix_create_from_concurrent_workers_makes_one_fix(idle_broker, build_mission, git_repo, workers):
    feature, run = failed_feature(build_mission, git_repo)
    results = race(*[lambda: fix_create(source_id=feature.pk, run_id=run.pk)] * workers)
    assert all(isinstance(r, MissionFeature) for r in results), results
    assert len({r.pk for r in results}) == 1
    fix = MissionFeature.objects.get(generated_from=feature)
    assert results[0].pk == fix.pk and fix.title == f"Fix: {feature.title}"
    lineage = FixLineage.objects.get()
    assert (lineage.root_id, lineage.source_id, lineage.fix_id, lineage.run_id) == (
        feature.pk,
        feature.pk,
        fix.pk,
        run.pk,
    )
    assert list(lineage.failed_assertions.values_list("key", flat=True)) == ["VAL-0"]
    feature.refresh_from_db()
    assert feature.fix_rounds == 1 and feature.loop_state == "implementing"  # charged once, moved once
    assert MissionEvent.objects.filter(type="fix-feature:created").count() == 1
    assert MissionEvent.objects.filter(type="feature:updated", payload__cause="fix_created").count() == 1


def test_fix_create_racing_the_operator_and_the_sweep_makes_one_fix(
    idle_broker, build_mission, git_repo, alice, api_for
):
    """The operator's `create_fix` (report-only mission) against a recovery sweep that
    re-drives `needs_fix` once auto-fix was switched on: one fix; the operator gets it
    (201) or is told it exists (409)."""
    from validation.services.recovery import redrive_features

    feature, run = failed_feature(build_mission, git_repo)
    Mission.objects.filter(pk=feature.mission_id).update(auto_fix=True)

    def operator():
        response = api_for(alice).post(f"/api/features/{feature.pk}/create_fix/")
        return response.status_code, response.json()

    (code, body), report = race(operator, redrive_features)
    fix = MissionFeature.objects.get(generated_from=feature)
    assert FixLineage.objects.count() == 1
    if code == 201:
        assert body["id"] == fix.pk
    else:
        assert code == 409 and body["code"] in ("fix_exists", "no_failure"), body
        assert report["needs_fix"] == [feature.pk]
    feature.refresh_from_db()
    assert feature.fix_rounds == 1 and MissionEvent.objects.filter(type="fix-feature:created").count() == 1


# --- duplicate task completions --------------------------------------------------------


def test_twenty_simultaneous_completions_of_one_task_make_one_run(worker, build_mission, git_repo, alice, api_for):
    feature = features(build_mission, git_repo, 1)[0]
    task = task_create(user=alice, feature=feature)
    revision = git_repo.git("rev-parse", "HEAD").strip()

    def complete():
        response = api_for(alice).post(
            f"/api/tasks/{task.pk}/complete/", {"revision": revision, "summary": "done"}, format="json"
        )
        return response.status_code

    codes = race(*[complete] * 20)
    assert codes == [200] * 20, codes
    worker.drain()
    assert MissionEvent.objects.filter(type="task:updated", payload__change="completed").count() == 1
    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.PASSED and run.revision == revision and run.trigger == "task"
    feature.refresh_from_db()
    assert feature.loop_state == "passed" and started_events(feature) == 1


def test_twenty_simultaneous_deliveries_of_one_task_outcome_make_one_run(idle_broker, build_mission, git_repo, alice):
    """The same `process_task_outcome` message delivered 20 times at once (redelivery
    after a worker died, a sweep re-driving it meanwhile): one admission wins."""
    feature = features(build_mission, git_repo, 1)[0]
    task = task_create(user=alice, feature=feature)
    revision = git_repo.git("rev-parse", "HEAD").strip()
    Task.objects.filter(pk=task.pk).update(status="done", revision=revision, finished_at=timezone.now())
    outcomes_ = race(*[lambda: task_outcome_process(task_id=task.pk)] * 20)
    assert outcomes_.count("started") == 1, outcomes_
    assert set(outcomes_) <= {"started", "already_running", "duplicate", "not_implementing"}, outcomes_
    assert ValidatorRun.objects.filter(feature=feature).count() == 1 and started_events(feature) == 1


# --- the reaper against a late completion ------------------------------------------------


def pass_verdict(key: str) -> Verdict:
    return Verdict(
        status="pass",
        summary="late but fine",
        assertions=[
            AssertionVerdict(
                key=key, verdict="pass", message="ok", evidence=[Evidence(kind="other", text="late answer")]
            )
        ],
    )


def expired_run(feature: MissionFeature) -> ValidatorRun:
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    ValidatorRun.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    return run


def assert_one_terminal_write(feature: MissionFeature, run: ValidatorRun, *, reaped: bool) -> None:
    run.refresh_from_db()
    feature.refresh_from_db()
    completed = MissionEvent.objects.filter(type="validator-run:completed", payload__run=run.pk)
    assert completed.count() == 1
    if reaped:
        assert run.status == RunStatus.ERROR and run.verdict is None and run.error.startswith("timeout:")
        assert completed.get().payload["status"] == "error"
        retry = ValidatorRun.objects.exclude(pk=run.pk).get(feature=feature)
        assert (
            retry.status == RunStatus.RUNNING and feature.last_run_id == retry.pk and feature.loop_state == "validating"
        )
    else:
        assert run.status == RunStatus.PASSED and run.error == "" and run.verdict["status"] == "pass"
        assert completed.get().payload["status"] == "passed"
        assert ValidatorRun.objects.filter(feature=feature).count() == 1 and feature.loop_state == "passed"


def test_reaper_and_late_completion_racing_write_exactly_once(idle_broker, build_mission, git_repo):
    wins = {"reaper": 0, "completion": 0}
    for i, feature in enumerate(features(build_mission, git_repo, 6)):
        run = expired_run(feature)
        reaped, completed = race(
            reap_runs, lambda run=run, i=i: run_complete(run_id=run.pk, verdict=pass_verdict(f"VAL-{i}"))
        )
        assert not isinstance(reaped, BaseException) and not isinstance(completed, BaseException), (reaped, completed)
        assert (reaped == [run.pk]) != bool(completed), (reaped, completed)  # exactly one of them wrote
        assert_one_terminal_write(feature, run, reaped=bool(reaped))
        wins["reaper" if reaped else "completion"] += 1
    assert sum(wins.values()) == 6


@pytest.mark.parametrize("first", ["reaper", "completion"])
def test_the_side_that_commits_second_writes_nothing(idle_broker, build_mission, git_repo, monkeypatch, first):
    """Staged: one side has done its compare-and-swap on `running` and holds its
    transaction open; the other, which still read the run as `running`, must wait for it
    and then update zero rows (PostgreSQL re-checks the row after the lock; SQLite's
    IMMEDIATE transaction starts only after the first commits)."""
    feature = features(build_mission, git_repo, 1)[0]
    run = expired_run(feature)
    holding, begun = threading.Event(), threading.Event()
    real_finish = outcomes.run_finish

    def held_finish(**fields):
        won = real_finish(**fields)
        if threading.current_thread().name == "racer-0":
            holding.set()
            wait_until_another_waits(begun)  # the terminal write is made but not committed
        return won

    monkeypatch.setattr(outcomes, "run_finish", held_finish)
    reap = reap_runs
    complete = lambda: run_complete(run_id=run.pk, verdict=pass_verdict("VAL-0"))  # noqa: E731

    def later(fn):
        def call():
            assert holding.wait(timeout=60)
            with announcing_begin(begun):
                return fn()

        return call

    if first == "reaper":
        reaped, completed = race(reap, later(complete))
        assert reaped == [run.pk] and completed is False
    else:
        completed, reaped = race(complete, later(reap))
        assert completed is True and reaped == []
    assert_one_terminal_write(feature, run, reaped=first == "reaper")


def test_a_verdict_that_skips_the_autopilot_never_loses_a_switch_made_meanwhile(idle_broker, alice):
    """A verdict's step sends no autopilot message when the mission's row, as it locked it,
    says the autopilot is off (`queueing.autopilot_notify`). Switching the autopilot on
    meanwhile writes that row: it waits for the step's commit and notifies after its own,
    so the autopilot then sees what the step changed."""
    from missions.locks import lock_mission
    from missions.services.lifecycle import mission_set_autopilot
    from validation.services.queueing import autopilot_notify

    mission = Mission.objects.create(key="m", title="Mission", owner=alice, status="active")
    order: list[str] = []  # what happened, in order (list.append is atomic)

    class Recorder(dramatiq.Middleware):
        def before_enqueue(self, broker, message, delay):
            order.append(f"enqueued {message.actor_name}")

    recorder = Recorder()
    idle_broker.middleware.append(recorder)
    holding, begun, release = threading.Event(), threading.Event(), threading.Event()

    def verdict_step():
        try:
            with transaction.atomic():
                lock_mission(mission.pk)
                autopilot_notify(mission.pk)  # off, as locked: nothing is sent
                holding.set()
                assert release.wait(timeout=120)
                order.append("step commits")
        finally:
            connection.close()

    def switch():
        try:
            assert holding.wait(timeout=60)
            with announcing_begin(begun):
                mission_set_autopilot(mission=Mission.objects.get(pk=mission.pk), user=alice, enabled=True)
            order.append("switched")
        finally:
            connection.close()

    try:
        threads = [threading.Thread(target=run, name=name) for name, run in (("step", verdict_step), ("on", switch))]
        for thread in threads:
            thread.start()
        assert holding.wait(timeout=60)
        wait_until_another_waits(begun)  # the switch waits behind the step's lock
        assert "switched" not in order
        release.set()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        release.set()
        idle_broker.middleware.remove(recorder)
    assert order == ["step commits", "enqueued autopilot_advance", "switched"]
