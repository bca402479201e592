"""The other ways to ask for a review: the feature's Review action (API and admin) and
`manage.py review`."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.urls import resolve
from rest_framework.test import APIRequestFactory, force_authenticate

from missions.api.views import FeatureViewSet
from missions.models import MissionFeature, Task, TaskStatus
from tests.review.support import request_body
from validation.api.reviews import feature_review_action
from validation.models import Review, RunStatus, ValidatorRun
from validation.review.create import feature_review_body

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def landed(mission):
    """The feature's task landed at a new revision and a validator run judged it."""
    revision = mission.repo.commit({"app.py": "def hello():\n    return 'hi'\n"}, "say hi")
    Task.objects.create(
        mission=mission,
        feature=mission.feature,
        title="Implement greeting",
        status=TaskStatus.DONE,
        revision=revision,
        summary="hello() now returns 'hi'.",
    )
    ValidatorRun.objects.create(
        mission=mission,
        feature=mission.feature,
        milestone=mission.feature.slice.milestone,
        status=RunStatus.FAILED,
        validator="composite",
        revision=revision,
        verdict={
            "status": "fail",
            "assertions": [{"key": "VAL-GREET-001", "verdict": "fail", "message": "returns 'hi!'"}],
        },
    )
    mission.revision = revision
    return mission


def test_the_request_is_filled_from_the_feature(landed):
    feature = landed.feature
    body = feature_review_body(feature)
    run = ValidatorRun.objects.get()
    assert body == {
        "objective": "Greeting\n\nSay hi.",
        "background": ["Mission shop: Shop"],
        "changeSummary": "hello() now returns 'hi'.",
        "scope": ["The change that implements feature shop/greet (Greeting)"],
        "acceptanceCriteria": ["VAL-GREET-001: hello says hi. hello() returns 'hi'"],
        "verification": {
            "status": "provided",
            "evidence": [
                {
                    "check": f"VAL-GREET-001 (composite validator, run {run.pk}, revision {landed.revision[:12]})",
                    "outcome": "fail: returns 'hi!'",
                }
            ],
        },
        "mission": landed.pk,
        "feature": feature.pk,
        "revision": landed.revision,
    }


def test_without_a_judged_run_verification_is_not_run(mission):
    Task.objects.create(mission=mission, feature=mission.feature, title="Implement greeting")
    assert feature_review_body(mission.feature)["verification"] == {
        "status": "not_run",
        "reason": "no validator run has judged this feature yet",
    }


def test_a_feature_with_nothing_to_review_is_refused(api_for, alice, mission):
    view = type("V", (FeatureViewSet,), {"review": feature_review_action}).as_view({"post": "review"})
    request = APIRequestFactory().post(f"/api/features/{mission.feature.pk}/review/")
    force_authenticate(request, alice)
    response = view(request, pk=mission.feature.pk)
    assert response.status_code == 409
    assert response.data["code"] == "nothing_to_review"
    assert set(response.data["fields"]) == {"changeSummary"}


def test_the_feature_action_reviews_the_tasks_revision(alice, landed, worker, standard):
    feature = landed.feature
    before = MissionFeature.objects.filter(pk=feature.pk).values().get()
    view = type("V", (FeatureViewSet,), {"review": feature_review_action}).as_view({"post": "review"})
    request = APIRequestFactory().post(f"/api/features/{feature.pk}/review/", HTTP_IDEMPOTENCY_KEY="f-1")
    force_authenticate(request, alice)
    response = view(request, pk=feature.pk)
    assert response.status_code == 202, response.data
    worker.drain()
    review = Review.objects.get(pk=response.data["id"])
    assert (review.state, review.source, review.feature_id) == ("completed", "feature", feature.pk)
    assert review.revision == landed.revision  # the task's revision, not the workspace HEAD
    assert "greet" in standard["c1"].prompts[0]
    assert MissionFeature.objects.filter(pk=feature.pk).values().get() == before


def test_the_feature_review_route(api_for, alice, landed, django_capture_on_commit_callbacks):
    """The route is part of the API: were it removed, this fails (it is never skipped)."""
    url = f"/api/features/{landed.feature.pk}/review/"
    assert resolve(url).url_name == "feature-review"
    response = api_for(alice).post(url)
    assert response.status_code == 202 and response.json()["state"] == "initializing"


def test_the_admin_action_requests_one_review_per_feature(rf, staff, landed, standard, monkeypatch):
    from validation.admin_features import review_features
    from validation.review import pipeline

    monkeypatch.setattr(pipeline.review_start, "send", lambda review_id: None)
    other = MissionFeature(slice=landed.feature.slice, key="empty", title="Nothing yet")
    other.save()
    messages = []
    modeladmin = type("A", (), {"message_user": lambda self, request, message, level: messages.append(str(message))})()
    request = rf.post("/admin/missions/missionfeature/")
    request.user = staff
    review_features(modeladmin, request, MissionFeature.objects.filter(pk__in=[landed.feature.pk, other.pk]))
    review = Review.objects.get()
    assert review.source == "admin" and review.feature_id == landed.feature.pk
    assert f"/admin/validation/review/{review.pk}/change/" in messages[0]
    assert messages[1].startswith("Not reviewed: shop/empty: the feature has nothing to review against yet")


# --- manage.py review ----------------------------------------------------------------------------


def command(*args) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("review", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue()


def test_command_runs_a_review_from_a_file_synchronously(tmp_path, mission, standard):
    path = tmp_path / "review.yaml"
    path.write_text(json.dumps(request_body(mission="shop")))
    code, out = command("--file", str(path), "--sync")
    assert code == 0, out
    review = Review.objects.get()
    assert review.state == "completed" and review.source == "cli"
    assert "# Validation report" in out and f"review {review.pk}: completed, verified" in out
    code, again = command("--result", str(review.pk))
    assert code == 0 and again == out.split("\n", 2)[2]  # the same verified report, without the receipt lines


def test_command_builds_the_request_from_flags(mission, standard, monkeypatch):
    from validation.review import pipeline

    monkeypatch.setattr(pipeline.review_start, "send", lambda review_id: None)
    code, out = command(
        "--objective",
        " Add hello ",
        "--change-summary",
        "Added hello()",
        "--scope",
        "app.py",
        "--scope",
        "tests/",
        "--criterion",
        "hello() says hi",
        "--not-run",
        "no CI",
        "--mission",
        "shop",
        "--exclusion",
        "docs",
    )
    assert code == 0, out
    review = Review.objects.get()
    assert review.request == {
        "objective": "Add hello",
        "background": [],
        "changeSummary": "Added hello()",
        "scope": ["app.py", "tests/"],
        "acceptanceCriteria": ["hello() says hi"],
        "verification": {"status": "not_run", "evidence": [], "reason": "no CI"},
        "knownLimitations": [],
        "exclusions": ["docs"],
        "mission": "shop",
    }
    assert review.state == "initializing" and f"result: /api/reviews/{review.pk}/result/" in out
    code, out = command("--cancel", str(review.pk))
    assert out.strip() == f"review {review.pk}: cancelled"
    code, out = command("--result", str(review.pk))
    assert code == 2 and "cancelled" in out


def test_command_reports_every_error_with_its_path(tmp_path, mission):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(request_body(scope=[" "], acceptanceCriteria=[])))
    with pytest.raises(CommandError) as info:
        call_command("review", "--file", str(path))
    assert "scope[0]: must not be blank" in str(info.value)
    assert "acceptanceCriteria: must have at least one item" in str(info.value)
    path.write_text(json.dumps({"prompt": "review it"}))
    with pytest.raises(CommandError) as info:
        call_command("review", "--file", str(path))
    assert "no longer accepted" in str(info.value) and "expected shape" in str(info.value)
    assert Review.objects.count() == 0


def test_command_review_of_a_feature_with_a_failing_pipeline(landed, models):
    from tests.review.support import Evaluator, Reviewer

    models(c1=Reviewer("no"), c2=Reviewer("no"), c3=Reviewer("{}"), eval=Evaluator())
    code, out = command("--of-feature", "shop/greet", "--sync")
    assert code == 1
    assert "failed (evaluation_invalid: 3 of the three reviewers returned no usable report" in out
