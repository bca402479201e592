"""Recovery: every stranded case is re-driven, and a second sweep right
after the first changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fusion_site.repos.snapshots import snapshot_root
from missions.models import Mission, MissionEvent, MissionFeature, Task
from missions.services.tasks import task_create
from validation.models import FixLineage, RunStatus, ValidatorFailure, ValidatorRun
from validation.services import runs
from validation.services.recovery import recover
from validation.services.verdicts.admit import feature_admit
from validation.services.verdicts.complete import run_complete, run_error
from validation.verdict import AssertionVerdict, Evidence, Verdict

pytestmark = pytest.mark.django_db(transaction=True)

GREETING = {"file": "hello.py", "contains": r"def hello\("}


def hello_feature(build_mission, git_repo, *, good=True, **kwargs) -> MissionFeature:
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n" if good else "def goodbye():\n    pass\n"})
    build_mission({"hello": [("VAL-1", GREETING)]}, **kwargs)
    return MissionFeature.objects.get(key="hello")


def world() -> dict:
    """Everything a sweep could change."""
    return {
        "runs": sorted(ValidatorRun.objects.values_list("pk", "status", "lease_until")),
        "features": sorted(
            MissionFeature.objects.values_list(
                "pk", "loop_state", "status", "last_run_id", "validator_attempts", "fix_rounds", "stop_reason"
            )
        ),
        "events": MissionEvent.objects.count(),
        "lineage": FixLineage.objects.count(),
        "failures": ValidatorFailure.objects.count(),
        "tasks": sorted(Task.objects.values_list("pk", "status")),
    }


def assert_second_sweep_changes_nothing(worker=None) -> None:
    before = world()
    report = recover()
    if worker is not None:
        worker.drain()
    assert report["reaped"] == [] and report["snapshots_removed"] == 0
    assert world() == before


def start_run_now(feature: MissionFeature) -> ValidatorRun:
    admitted = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate")
    assert admitted.outcome == "started"
    return admitted.run


def pass_verdict(key: str = "VAL-1") -> Verdict:
    return Verdict(
        status="pass",
        summary="late",
        assertions=[
            AssertionVerdict(
                key=key, verdict="pass", message="ok", evidence=[Evidence(kind="other", text="late answer")]
            )
        ],
    )


def test_expired_lease_is_reaped_and_retried(idle_broker, build_mission, git_repo):
    feature = hello_feature(build_mission, git_repo)
    run = start_run_now(feature)
    ValidatorRun.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timedelta(seconds=5))
    report = recover()
    assert report["reaped"] == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR and run.error.startswith("timeout:") and "reaped" in run.error
    retry = ValidatorRun.objects.exclude(pk=run.pk).get(feature=feature)
    assert retry.status == RunStatus.RUNNING and retry.lease_until is None and retry.validator_attempt == 2
    assert retry.revision == run.revision and retry.input_fingerprint == run.input_fingerprint
    feature.refresh_from_db()
    assert feature.loop_state == "validating" and feature.last_run_id == retry.pk and feature.validator_attempts == 2
    started = MissionEvent.objects.filter(type="validator-run:started").order_by("seq").last()
    assert started.payload["retry_of"] == run.pk
    assert_second_sweep_changes_nothing()


def test_a_run_never_picked_up_is_sent_again_and_completes(worker, build_mission, git_repo, monkeypatch):
    feature = hello_feature(build_mission, git_repo)
    with monkeypatch.context() as patch:
        patch.setattr(runs, "queue_run", lambda run_id, delay_ms=0: None)  # the message is lost
        run = start_run_now(feature)
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.lease_until is None
    report = recover()
    assert report["redriven_runs"] == [run.pk] and report["reaped"] == []
    worker.drain()
    run.refresh_from_db()
    feature.refresh_from_db()
    assert run.status == RunStatus.PASSED and feature.loop_state == "passed" and feature.last_run_id == run.pk
    assert ValidatorRun.objects.count() == 1
    assert_second_sweep_changes_nothing(worker)


def test_needs_fix_without_a_fix_gets_one(worker, build_mission, git_repo):
    feature = hello_feature(build_mission, git_repo, good=False, auto_fix=False)
    start_run_now(feature)
    worker.drain()
    feature.refresh_from_db()
    assert feature.loop_state == "needs_fix" and not FixLineage.objects.exists()
    # The fix was never created (report-only then, or a worker died before fix_create).
    Mission.objects.update(auto_fix=True)
    report = recover()
    worker.drain()
    assert report["needs_fix"] == [feature.pk]
    fix = MissionFeature.objects.get(generated_from=feature)
    lineage = FixLineage.objects.get()
    assert (lineage.source_id, lineage.fix_id, lineage.run_id) == (feature.pk, fix.pk, feature.last_run_id)
    feature.refresh_from_db()
    assert feature.loop_state == "implementing" and feature.fix_rounds == 1
    assert_second_sweep_changes_nothing(worker)


def test_implementing_feature_whose_task_is_done_is_validated(worker, build_mission, git_repo, alice):
    feature = hello_feature(build_mission, git_repo)
    task = task_create(user=alice, feature=feature)
    rev = git_repo.git("rev-parse", "HEAD").strip()
    # Completed behind the service's back: no process_task_outcome was ever queued.
    Task.objects.filter(pk=task.pk).update(status="done", revision=rev, finished_at=timezone.now())
    worker.drain()
    assert not ValidatorRun.objects.exists()
    report = recover()
    assert report["implementing"] == [feature.pk]
    worker.drain()
    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.PASSED and run.revision == rev and run.trigger == "task"
    feature.refresh_from_db()
    assert feature.loop_state == "passed"
    assert_second_sweep_changes_nothing(worker)


def test_stranded_done_feature_is_validated(worker, build_mission, git_repo):
    feature = hello_feature(build_mission, git_repo)
    MissionFeature.objects.filter(pk=feature.pk).update(status="done")  # done, never validated
    report = recover()
    assert report["stranded_done"] == [feature.pk]
    worker.drain()
    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.PASSED and run.trigger == "recovery"
    feature.refresh_from_db()
    assert feature.loop_state == "passed" and feature.status == "done"
    assert_second_sweep_changes_nothing(worker)


def test_inactive_missions_are_left_alone(idle_broker, build_mission, git_repo):
    feature = hello_feature(build_mission, git_repo, status="paused")
    MissionFeature.objects.filter(pk=feature.pk).update(status="done")
    before = world()
    report = recover()
    assert report["stranded_done"] == [] and world() == before


def test_a_late_completion_after_a_reap_changes_nothing(idle_broker, build_mission, git_repo):
    feature = hello_feature(build_mission, git_repo)
    run = start_run_now(feature)
    ValidatorRun.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert recover()["reaped"] == [run.pk]
    before = world()
    assert run_complete(run_id=run.pk, verdict=pass_verdict()) is False
    assert run_error(run_id=run.pk, message="late crash") is False
    assert world() == before
    run.refresh_from_db()
    feature.refresh_from_db()
    assert run.status == RunStatus.ERROR and run.verdict is None
    assert feature.loop_state == "validating" and feature.last_run_id != run.pk


def test_three_consecutive_errors_block_the_feature(idle_broker, build_mission, git_repo):
    feature = hello_feature(build_mission, git_repo)
    run = start_run_now(feature)
    for attempt in (1, 2, 3):
        assert run_error(run_id=run.pk, message=f"crash {attempt}") is True
        feature.refresh_from_db()
        if attempt < 3:
            assert feature.loop_state == "validating" and feature.last_run_id != run.pk
            run = feature.last_run
            assert run.status == RunStatus.RUNNING
    assert feature.loop_state == "blocked" and feature.stop_reason == "validator_unavailable"
    assert "crash 3" in feature.stop_detail
    assert list(ValidatorRun.objects.order_by("id").values_list("status", flat=True)) == ["error"] * 3
    assert not ValidatorRun.objects.filter(status=RunStatus.RUNNING).exists()
    before = world()
    recover()
    assert world() == before  # blocked is terminal: the sweep does not retry it
    assert_second_sweep_changes_nothing()


def test_leftover_snapshots_of_finished_runs_are_removed(idle_broker, build_mission, git_repo):
    feature = hello_feature(build_mission, git_repo)
    finished = start_run_now(feature)
    run_complete(run_id=finished.pk, verdict=pass_verdict())
    other = build_mission_feature(git_repo, feature)
    running = start_run_now(other)
    root = snapshot_root()
    # A real worktree left by a killed worker (read-only files included), and plain folders.
    stale = root / f"run-{finished.pk}-0123456789ab"
    git_repo.git("worktree", "add", "--detach", str(stale), "HEAD")
    (stale / "hello.py").chmod(0o444)
    orphan = root / "run-999999-aaaaaaaaaaaa"
    orphan.mkdir()
    live = root / f"run-{running.pk}-bbbbbbbbbbbb"
    live.mkdir()
    (live / "marker").write_text("in use")
    report = recover()
    assert report["snapshots_removed"] == 2
    assert not stale.exists() and not orphan.exists()
    assert (live / "marker").read_text() == "in use"
    assert_second_sweep_changes_nothing()


def build_mission_feature(git_repo, feature: MissionFeature) -> MissionFeature:
    """A second feature in the same slice, linked to the same assertion."""
    other = MissionFeature(slice=feature.slice, key="other", title="Other", description="Other.", order=1)
    other.save()
    other.assertions.add(*feature.assertions.all())
    return other
