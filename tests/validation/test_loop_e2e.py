"""The loop end to end on a real worker: task completion -> validation -> pass/fix/block."""

from __future__ import annotations

import shutil

import pytest
from django.db import transaction

from missions.models import MissionEvent, MissionFeature, Task
from missions.services.tasks import task_complete, task_create
from validation.models import FixLineage, RunStatus, ValidatorFailure, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)

GREETING = {"file": "hello.py", "contains": r"def hello\("}


def test_task_completion_drives_feature_to_passed(worker, build_mission, git_repo, alice):
    mission = build_mission(
        {"hello": [("VAL-1", GREETING), ("VAL-2", {"run": "python hello.py", "expect_output": "hi"})]}
    )
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    feature.refresh_from_db()
    assert feature.loop_state == "implementing" and feature.implementation_attempts == 1
    rev = git_repo.commit({"hello.py": "def hello():\n    return 'hi'\nprint(hello())\n"})
    task_complete(user=alice, task=task, revision=rev, summary="added hello")
    worker.drain()
    feature.refresh_from_db()
    assert feature.loop_state == "passed" and feature.status == "done"
    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.PASSED and run.revision == rev and run.verdict["status"] == "pass"
    assert {a["key"]: a["verdict"] for a in run.verdict["assertions"]} == {"VAL-1": "pass", "VAL-2": "pass"}
    assert set(mission.assertions.values_list("status", flat=True)) == {"passed"}
    assert (
        not list((git_repo.path.parent.parent / "snapshots").glob("*"))
        if (git_repo.path.parent.parent / "snapshots").exists()
        else True
    )


def test_failure_generates_fix_then_root_revalidated(worker, build_mission, git_repo, alice):
    build_mission({"hello": [("VAL-1", GREETING)]}, autopilot=False)
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    bad = git_repo.commit({"hello.py": "def goodbye():\n    pass\n"})
    task_complete(user=alice, task=task, revision=bad)
    worker.drain()
    feature.refresh_from_db()
    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.FAILED
    failure = ValidatorFailure.objects.get(run=run)
    assert failure.assertion_key == "VAL-1" and failure.expected and failure.actual == "no match"
    fix = MissionFeature.objects.get(generated_from=feature)
    assert fix.title == "Fix: Feature hello" and "## Validation cause" in fix.description and "VAL-1" in fix.description
    assert list(fix.assertions.values_list("key", flat=True)) == ["VAL-1"]
    assert FixLineage.objects.filter(source=feature, fix=fix, run=run, root=feature).count() == 1
    assert feature.loop_state == "implementing" and feature.fix_rounds == 1
    fix_task = task_create(user=alice, feature=fix)
    good = git_repo.commit({"hello.py": "def hello():\n    pass\n"})
    task_complete(user=alice, task=fix_task, revision=good)
    worker.drain()
    fix.refresh_from_db()
    feature.refresh_from_db()
    assert fix.loop_state == "passed"
    assert feature.loop_state == "passed"  # the root was re-validated at the fix's revision
    root_runs = ValidatorRun.objects.filter(feature=feature).order_by("id")
    assert [r.status for r in root_runs] == ["failed", "passed"] and root_runs.last().revision == good
    assert root_runs.last().trigger == "fix"


def test_duplicate_delivery_makes_one_run(worker, build_mission, git_repo, alice):
    from validation.actors import process_task_outcome

    build_mission({"hello": [("VAL-1", GREETING)]})
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    rev = git_repo.commit({"hello.py": "def hello():\n    pass\n"})
    task_complete(user=alice, task=task, revision=rev)
    process_task_outcome.send(task.pk)
    process_task_outcome.send(task.pk)
    worker.drain()
    assert ValidatorRun.objects.filter(feature=feature).count() == 1


def test_budget_exhausted_blocks_root(worker, build_mission, git_repo, alice):
    build_mission({"hello": [("VAL-1", GREETING)]}, retry_budget=1)
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    task_complete(user=alice, task=task, revision=git_repo.commit({"hello.py": "x = 1\n"}))
    worker.drain()
    fix = MissionFeature.objects.get(generated_from=feature)
    fix_task = task_create(user=alice, feature=fix)
    task_complete(user=alice, task=fix_task, revision=git_repo.commit({"hello.py": "x = 2\n"}))
    worker.drain()
    feature.refresh_from_db()
    fix.refresh_from_db()
    assert feature.loop_state == "blocked" and feature.stop_reason == "budget_exhausted"
    assert fix.loop_state == "blocked"
    assert MissionFeature.objects.filter(generated_from=fix).count() == 0  # no second round
    assert MissionEvent.objects.filter(type="fix-feature:budget-exhausted").count() == 1


def test_report_only_mission_records_failure_without_fix(worker, build_mission, git_repo, alice, api_for):
    build_mission({"hello": [("VAL-1", GREETING)]}, auto_fix=False)
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    task_complete(user=alice, task=task, revision=git_repo.commit({"hello.py": "x = 1\n"}))
    worker.drain()
    feature.refresh_from_db()
    assert feature.loop_state == "needs_fix" and not MissionFeature.objects.filter(generated_from=feature).exists()
    response = api_for(alice).post(f"/api/features/{feature.pk}/create_fix/")
    assert response.status_code == 201, response.json()
    assert response.json()["generated_from"] == feature.pk
    again = api_for(alice).post(f"/api/features/{feature.pk}/create_fix/")
    assert again.status_code == 409 and again.json()["code"] in ("fix_exists", "no_failure")


def test_a_revision_the_workspace_cannot_resolve_is_refused_at_once(worker, build_mission, tmp_path, alice, api_for):
    plain = tmp_path / "plain"
    plain.mkdir()
    build_mission({"hello": [("VAL-1", GREETING)]}, workspace=plain)
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    response = api_for(alice).post(f"/api/tasks/{task.pk}/complete/", {"revision": "abc123"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "unknown_revision", response.json()
    assert "is not a git repository" in response.json()["detail"]
    task.refresh_from_db()
    assert task.status == "todo" and task.revision == "" and not ValidatorRun.objects.exists()


def test_a_repository_gone_after_completion_is_judged_from_the_mirror(worker, build_mission, git_repo, alice):
    build_mission({"hello": [("VAL-1", GREETING)]})
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    revision = git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    with transaction.atomic():
        task_complete(user=alice, task=task, revision=revision)  # a local commit is mirrored at once
        shutil.rmtree(git_repo.path / ".git")  # gone before the run executes (after commit)
    worker.drain()
    feature.refresh_from_db()
    run = ValidatorRun.objects.filter(feature=feature).order_by("id").first()
    assert run.status == RunStatus.PASSED and run.revision == revision
    assert feature.loop_state == "passed"


def test_a_repository_gone_before_any_mirror_blocks_with_clear_reason(
    worker, build_mission, git_repo, alice, settings, tmp_path
):
    build_mission({"hello": [("VAL-1", GREETING)]})
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    revision = git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    with transaction.atomic():
        task_complete(user=alice, task=task, revision=revision)
        shutil.rmtree(git_repo.path / ".git")
        settings.FUSION_REPO_CACHE = tmp_path / "another-host-cache"  # a worker that never mirrored it
    worker.drain()
    feature.refresh_from_db()
    runs = list(ValidatorRun.objects.filter(feature=feature).order_by("id"))
    assert runs and all(r.status == RunStatus.ERROR and "workspace_unavailable" in r.error for r in runs)
    assert str(git_repo.path) in runs[-1].error
    assert feature.loop_state == "blocked" and feature.stop_reason == "workspace_unavailable"
    assert str(git_repo.path) in feature.stop_detail


def test_assertion_without_check_is_blocked_by_checks(worker, build_mission, git_repo, alice):
    build_mission({"hello": [("VAL-1", None)]})
    feature = MissionFeature.objects.get(key="hello")
    task = task_create(user=alice, feature=feature)
    task_complete(user=alice, task=task, revision=git_repo.commit({"a.txt": "a"}))
    worker.drain()
    feature.refresh_from_db()
    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.BLOCKED and "no check and no agent configured" in run.blocked_reason
    assert feature.loop_state == "blocked" and feature.stop_reason == "validator_blocked"
    assert Task.objects.get(pk=task.pk).status == "done"
