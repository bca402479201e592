"""Admission and the loop's operator actions through the REST API."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from missions.models import MissionEvent, MissionFeature
from validation.models import JournalEntry, RunStatus, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)

GREETING = {"file": "hello.py", "contains": r"def hello\("}


@pytest.fixture
def stranger(django_user_model):
    return django_user_model.objects.create_user("stranger", password="pw-stranger-123")


def hello_feature(build_mission, git_repo, *, good=True, **kwargs) -> MissionFeature:
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n" if good else "def goodbye():\n    pass\n"})
    build_mission({"hello": [("VAL-1", GREETING)]}, **kwargs)
    return MissionFeature.objects.get(key="hello")


def validate(client, feature, **body):
    return client.post(f"/api/features/{feature.pk}/validate/", body, format="json")


# --- admission ------------------------------------------------------------------


def test_validate_answers_202_with_the_run(idle_broker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo)
    response = validate(api_for(alice), feature)
    assert response.status_code == 202, response.json()
    body = response.json()
    run = ValidatorRun.objects.get(feature=feature)
    assert body["id"] == run.pk and body["status"] == "running" and body["outcome"] == "started"
    assert body["validator_attempt"] == 1 and body["implementation_attempt"] == 0
    assert body["run"]["revision"] == git_repo.git("rev-parse", "HEAD").strip()
    feature.refresh_from_db()
    assert feature.loop_state == "validating" and feature.last_run_id == run.pk and feature.validator_attempts == 1
    started = MissionEvent.objects.get(type="validator-run:started")
    assert started.payload["run"] == run.pk and started.actor_id == alice.pk


def test_second_validate_while_running_is_409_and_changes_nothing(idle_broker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo)
    client = api_for(alice)
    first = validate(client, feature)
    assert first.status_code == 202
    events = MissionEvent.objects.count()
    second = validate(client, feature)
    assert second.status_code == 409, second.json()
    assert second.json()["code"] == "validation_already_running" and second.json()["run"] == first.json()["id"]
    assert ValidatorRun.objects.filter(feature=feature).count() == 1
    assert MissionEvent.objects.count() == events
    assert ValidatorRun.objects.get(pk=first.json()["id"]).status == RunStatus.RUNNING


def test_feature_without_assertions_is_400(idle_broker, build_mission, git_repo, alice, api_for):
    build_mission({"bare": []})
    feature = MissionFeature.objects.get(key="bare")
    response = validate(api_for(alice), feature)
    assert response.status_code == 400 and response.json()["code"] == "no_assertions"
    feature.refresh_from_db()
    assert feature.loop_state == "idle" and not ValidatorRun.objects.exists()


@pytest.mark.parametrize("status", ["paused", "planning"])
def test_inactive_mission_is_409(idle_broker, build_mission, git_repo, alice, api_for, status):
    feature = hello_feature(build_mission, git_repo, status=status)
    events = MissionEvent.objects.count()
    response = validate(api_for(alice), feature)
    assert response.status_code == 409 and response.json()["code"] == "mission_not_active"
    assert not ValidatorRun.objects.exists() and MissionEvent.objects.count() == events


def test_unknown_profile_is_400(idle_broker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo)
    response = validate(api_for(alice), feature, validator="nope")
    assert response.status_code == 400 and response.json()["code"] == "unknown_validator"
    assert not ValidatorRun.objects.exists()


def test_identical_input_after_a_pass_reuses_it(worker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo)
    client = api_for(alice)
    assert validate(client, feature).status_code == 202
    worker.drain()
    first = ValidatorRun.objects.get(feature=feature)
    assert first.status == RunStatus.PASSED
    assert JournalEntry.objects.filter(run=first, kind="check").count() == 1
    # Back to implementing (the operator clears), then the same input again.
    assert client.post(f"/api/features/{feature.pk}/repair/", {"mode": "clear"}, format="json").status_code == 200
    again = validate(client, feature)
    assert again.status_code == 200, again.json()
    assert again.json()["outcome"] == "reused"
    worker.drain()
    reused = ValidatorRun.objects.filter(feature=feature).order_by("-id").first()
    assert reused.pk != first.pk and reused.reused_from_id == first.pk and reused.status == RunStatus.PASSED
    assert reused.verdict == first.verdict
    assert not JournalEntry.objects.filter(run=reused, kind="check").exists()
    feature.refresh_from_db()
    assert feature.loop_state == "passed" and feature.last_run_id == reused.pk


def test_validate_on_a_passed_feature_reuses_the_pass(worker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo)
    client = api_for(alice)
    assert validate(client, feature).status_code == 202
    worker.drain()
    events = MissionEvent.objects.count()
    again = validate(client, feature)
    assert again.status_code == 200, again.json()
    assert again.json()["outcome"] == "reused" and again.json()["run"]["reused_from"] is not None
    worker.drain()
    feature.refresh_from_db()
    assert feature.loop_state == "passed"
    assert ValidatorRun.objects.filter(feature=feature).count() == 2
    assert MissionEvent.objects.count() > events  # the reuse is recorded


def test_three_identical_failures_block(worker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo, good=False, auto_fix=False)
    client = api_for(alice)
    for attempt in range(1, 4):
        response = validate(client, feature)
        assert response.status_code == 202, (attempt, response.json())
        worker.drain()
        feature.refresh_from_db()
        assert feature.loop_state == "needs_fix" and feature.validator_attempts == attempt
    blocked = validate(client, feature)
    assert blocked.status_code == 200, blocked.json()
    assert blocked.json()["outcome"] == "blocked" and blocked.json()["run"] is None
    feature.refresh_from_db()
    assert feature.loop_state == "blocked" and feature.stop_reason == "fingerprint_failures"
    assert ValidatorRun.objects.filter(feature=feature).count() == 3
    assert MissionEvent.objects.filter(type="feature:updated", payload__cause="fingerprint_failures").count() == 1


def test_repair_clear_and_re_run(worker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo, good=False, auto_fix=False)
    client = api_for(alice)
    for _ in range(3):
        validate(client, feature)
        worker.drain()
    validate(client, feature)
    feature.refresh_from_db()
    assert feature.loop_state == "blocked"

    # re_run forces a new run even though the same input failed 3 times.
    rerun = client.post(f"/api/features/{feature.pk}/repair/", {"mode": "re_run", "reason": "flaky?"}, format="json")
    assert rerun.status_code == 202, rerun.json()
    assert rerun.json()["status"] == "running" and rerun.json()["validator_attempt"] == 4
    worker.drain()
    assert ValidatorRun.objects.get(pk=rerun.json()["id"]).status == RunStatus.FAILED
    feature.refresh_from_db()
    assert feature.loop_state == "needs_fix"

    cleared = client.post(
        f"/api/features/{feature.pk}/repair/", {"mode": "clear", "reason": "rewriting"}, format="json"
    )
    assert cleared.status_code == 200, cleared.json()
    feature.refresh_from_db()
    assert feature.loop_state == "implementing" and feature.stop_reason == ""
    assert (feature.validator_attempts, feature.implementation_attempts, feature.fix_rounds) == (0, 0, 0)
    event = MissionEvent.objects.filter(type="feature:updated", payload__cause="clear").get()
    assert event.actor_id == alice.pk and event.payload["reason"] == "rewriting"

    # An implementing feature needs no repair.
    for mode in ("clear", "re_run"):
        refused = client.post(f"/api/features/{feature.pk}/repair/", {"mode": mode}, format="json")
        assert refused.status_code == 409 and refused.json()["code"] == "not_repairable"
    bad = client.post(f"/api/features/{feature.pk}/repair/", {"mode": "explode"}, format="json")
    assert bad.status_code == 400


def test_repair_refused_while_a_run_is_running(idle_broker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo)
    client = api_for(alice)
    assert validate(client, feature).status_code == 202
    for mode in ("clear", "re_run"):
        response = client.post(f"/api/features/{feature.pk}/repair/", {"mode": mode}, format="json")
        assert response.status_code == 409 and response.json()["code"] == "validation_already_running"
    assert ValidatorRun.objects.count() == 1


# --- reads ----------------------------------------------------------------------


def test_loop_snapshot_and_run_listing(worker, build_mission, git_repo, alice, api_for):
    feature = hello_feature(build_mission, git_repo, good=False)
    client = api_for(alice)
    assert validate(client, feature).status_code == 202
    worker.drain()
    fix = MissionFeature.objects.get(generated_from=feature)
    git_repo.commit({"hello.py": "def hello():\n    pass\n"})
    feature.refresh_from_db()
    assert feature.loop_state == "implementing"  # the fix was created; the root waits
    # A second, passing run of the root at the new HEAD.
    assert validate(client, feature).status_code == 202
    worker.drain()

    loop = client.get(f"/api/features/{feature.pk}/loop/")
    assert loop.status_code == 200
    body = loop.json()
    assert body["loop_state"] == "passed" and body["fix_rounds"] == 1
    assert body["retry_budget"] == 3 and body["budget_left"] == 2
    assert [r["status"] for r in body["runs"]] == ["passed", "failed"]  # newest first
    assert body["runs"][0]["id"] > body["runs"][1]["id"]
    failures = body["runs"][1]["failures"]
    assert [f["assertion_key"] for f in failures] == ["VAL-1"] and failures[0]["actual"] == "no match"
    assert [(ln["root"], ln["source"], ln["fix"], ln["failed_assertions"]) for ln in body["lineage"]] == [
        (feature.pk, feature.pk, fix.pk, ["VAL-1"])
    ]
    assert body["last_run"] == body["runs"][0]["id"]

    failed_run = body["runs"][1]["id"]
    listing = client.get("/api/validation-runs/", {"feature": feature.pk, "status": "failed"})
    assert listing.status_code == 200
    assert [r["id"] for r in listing.json()["results"]] == [failed_run]
    assert [r["id"] for r in client.get("/api/validation-runs/", {"status": "passed"}).json()["results"]] == [
        body["runs"][0]["id"]
    ]
    assert client.get("/api/validation-runs/", {"feature": fix.pk}).json()["results"] == []
    assert len(client.get("/api/validation-runs/").json()["results"]) == 2

    detail = client.get(f"/api/validation-runs/{failed_run}/")
    assert detail.status_code == 200
    run = detail.json()
    assert run["verdict"]["status"] == "fail"
    assert [(a["key"], a["verdict"]) for a in run["verdict"]["assertions"]] == [("VAL-1", "fail")]
    assert run["failures"][0]["assertion_key"] == "VAL-1" and run["failures"][0]["evidence"]
    assert client.get(f"/api/validation-runs/{failed_run}/journal/").status_code == 200


def test_a_stranger_sees_nothing_and_changes_nothing(idle_broker, build_mission, git_repo, alice, stranger, api_for):
    feature = hello_feature(build_mission, git_repo)
    run_id = validate(api_for(alice), feature).json()["id"]
    ValidatorRun.objects.filter(pk=run_id).update(status=RunStatus.FAILED)
    MissionFeature.objects.filter(pk=feature.pk).update(loop_state="needs_fix")
    events = MissionEvent.objects.count()
    client = api_for(stranger)
    for response in (
        validate(client, feature),
        client.post(f"/api/features/{feature.pk}/repair/", {"mode": "clear"}, format="json"),
        client.post(f"/api/features/{feature.pk}/repair/", {"mode": "re_run"}, format="json"),
        client.post(f"/api/features/{feature.pk}/create_fix/"),
        client.get(f"/api/features/{feature.pk}/loop/"),
        client.get(f"/api/validation-runs/{run_id}/"),
        client.get(f"/api/validation-runs/{run_id}/journal/"),
    ):
        assert response.status_code == 404, (response.request["PATH_INFO"], response.status_code)
        assert response.json()["code"] == "not_found"
    listing = client.get("/api/validation-runs/", {"feature": feature.pk})
    assert listing.status_code == 200 and listing.json()["results"] == []
    assert ValidatorRun.objects.count() == 1 and MissionEvent.objects.count() == events
    anonymous = api_for(None).get(f"/api/features/{feature.pk}/loop/")
    assert anonymous.status_code == 401


# --- concurrency ----------------------------------------------------------------


def test_two_concurrent_validates_admit_exactly_one(idle_broker, build_mission, git_repo, alice, api_for):
    """PostgreSQL: the row lock on the feature serializes them; SQLite: IMMEDIATE
    transactions do. Either way one 202 and one 409."""
    feature = hello_feature(build_mission, git_repo)
    barrier = threading.Barrier(2)
    results: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def call():
        try:
            client = api_for(alice)
            barrier.wait(timeout=10)
            response = validate(client, feature)
            with lock:
                results.append((response.status_code, response.json()))
        finally:
            connection.close()

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(code for code, _ in results) == [202, 409], results
    conflict = next(body for code, body in results if code == 409)
    assert conflict["code"] == "validation_already_running"
    assert ValidatorRun.objects.filter(feature=feature).count() == 1
    assert MissionEvent.objects.filter(type="validator-run:started").count() == 1
