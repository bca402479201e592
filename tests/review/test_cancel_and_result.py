"""Cancel in every stage, nothing before the preflight commit, and a result that is only
ever answered from verified data."""

from __future__ import annotations

import hashlib
import threading

import pytest
from django.db import connection, transaction

from tests.review.conftest import event_names
from tests.review.support import Evaluator, Reviewer, candidate_answer, finding, request_body
from validation.models import Review, ReviewArtifact
from validation.review import artifacts, pipeline, stages
from validation.review.create import review_create
from validation.review.state import captured_stages

pytestmark = pytest.mark.django_db(transaction=True)


def cancel(api_for, user, review):
    return api_for(user).post(f"/api/reviews/{review.pk}/cancel/")


def calls(bodies) -> int:
    return sum(getattr(b, "calls", 0) or len(getattr(b, "attempts", [])) for b in bodies.values())


# --- between stages (the next stage finds the review cancelled and does nothing) --------------


def stepwise(alice, mission, stop_before: str):
    """Run the pipeline in this thread until the next stage to run is `stop_before`."""
    with captured_stages() as queue:
        review = review_create(body=request_body(mission="shop"), user=alice).review
        while queue and queue[0][0] != stop_before:
            pipeline.run_captured([queue.pop(0)])
    return review, queue


@pytest.mark.parametrize(
    ("stop_before", "state"),
    [("start", "initializing"), ("evaluate", "candidates_complete"), ("render", "evaluation_complete")],
)
def test_cancel_between_stages(api_for, alice, mission, standard, stop_before, state):
    review, queue = stepwise(alice, mission, stop_before)
    review.refresh_from_db()
    assert review.state == state
    before = (calls(standard), ReviewArtifact.objects.filter(review=review).count())
    response = cancel(api_for, alice, review)
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    with captured_stages():
        pipeline.run_captured(queue)  # the stages that were already on their way
    review.refresh_from_db()
    assert review.state == "cancelled"
    assert (review.failure_code, review.failure_stage) == ("cancelled", state)
    assert review.failure_reason == "cancelled by alice"
    assert (calls(standard), ReviewArtifact.objects.filter(review=review).count()) == before
    assert event_names(mission.pk)[-2:] == ["state:cancelled", "cancelled"]
    answer = api_for(alice).get(f"/api/reviews/{review.pk}/result/").json()
    assert answer["ready"] is False and answer["state"] == "cancelled" and "report" not in answer


def test_cancel_while_rendering_leaves_no_answer(api_for, alice, mission, standard, monkeypatch):
    real = stages.render_report

    def render_and_cancel(**kwargs):
        assert Review.objects.get().state == "rendering"
        cancel(api_for, alice, Review.objects.get())
        return real(**kwargs)

    monkeypatch.setattr(stages, "render_report", render_and_cancel)
    review, queue = stepwise(alice, mission, "render")
    with captured_stages():
        pipeline.run_captured(queue)
    review.refresh_from_db()
    assert (review.state, review.failure_stage) == ("cancelled", "rendering")
    answer = api_for(alice).get(f"/api/reviews/{review.pk}/result/").json()
    assert answer["ready"] is False and "report" not in answer


# --- in flight (the model call itself is stopped) ------------------------------------------------


def test_cancel_while_candidates_run(api_for, alice, mission, worker, models):
    gate = threading.Event()  # never opened: only the cancel can end these calls
    bodies = models(**{f"c{i}": Reviewer(candidate_answer(), gate=gate) for i in (1, 2, 3)}, eval=Evaluator())
    review_id = api_for(alice).post("/api/reviews/", request_body(mission="shop"), format="json").json()["id"]
    for name in ("c1", "c2", "c3"):
        assert bodies[name].started.wait(30)
    assert Review.objects.get(pk=review_id).state == "candidates_running"
    assert cancel(api_for, alice, Review.objects.get(pk=review_id)).status_code == 200
    worker.drain(timeout=30)
    review = Review.objects.get(pk=review_id)
    assert (review.state, review.failure_stage) == ("cancelled", "candidates_running")
    assert not ReviewArtifact.objects.filter(review=review, kind__in=["response"]).exists()
    assert not ReviewArtifact.objects.filter(review=review, name__endswith=".outcome.json").exists()
    assert bodies["eval"].attempts == [] and review.label_map == {}


def test_cancel_while_evaluating(api_for, alice, mission, worker, standard, models):
    gate = threading.Event()
    evaluator = models(eval=Evaluator(gate=gate))["eval"]
    review_id = api_for(alice).post("/api/reviews/", request_body(mission="shop"), format="json").json()["id"]
    assert evaluator.started.wait(30)
    assert Review.objects.get(pk=review_id).state == "evaluating"
    assert cancel(api_for, alice, Review.objects.get(pk=review_id)).status_code == 200
    worker.drain(timeout=30)
    review = Review.objects.get(pk=review_id)
    assert (review.state, review.failure_stage) == ("cancelled", "evaluating")
    names = set(ReviewArtifact.objects.filter(review=review).values_list("name", flat=True))
    assert "evaluator.prompt-1.json" in names
    assert not names & {"evaluator.response-1.txt", "evaluation.json", "report.md"}


def test_a_finished_review_cannot_be_cancelled(api_for, alice, mission, worker, standard):
    review_id = api_for(alice).post("/api/reviews/", request_body(mission="shop"), format="json").json()["id"]
    worker.drain()
    response = cancel(api_for, alice, Review.objects.get(pk=review_id))
    assert response.status_code == 409
    assert response.json()["code"] == "review_finished" and response.json()["state"] == "completed"


# --- nothing before the preflight commit --------------------------------------------------------


def test_the_pipeline_starts_only_after_the_preflight_commit(alice, mission, standard, monkeypatch):
    seen = []
    real_send = pipeline.review_start.send

    def send(review_id):
        def look():  # another connection sees only committed rows
            try:
                review = Review.objects.filter(pk=review_id).first()
                seen.append(
                    (review.state if review else None, ReviewArtifact.objects.filter(review_id=review_id).count())
                )
            finally:
                connection.close()

        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
        return real_send(review_id)

    monkeypatch.setattr(pipeline.review_start, "send", send)
    review = review_create(body=request_body(mission="shop"), user=alice).review
    assert seen == [("initializing", 3)]
    assert review.pk


def test_a_rolled_back_preflight_starts_nothing(alice, mission, standard, monkeypatch):
    sent = []
    monkeypatch.setattr(pipeline.review_start, "send", lambda review_id: sent.append(review_id))
    with pytest.raises(RuntimeError), transaction.atomic():
        review_create(body=request_body(mission="shop"), user=alice)
        raise RuntimeError("the caller's transaction fails after the preflight")
    assert sent == [] and Review.objects.count() == 0 and calls(standard) == 0


# --- retrieval -------------------------------------------------------------------------------------


def test_result_of_a_running_review_answers_at_once(api_for, alice, mission, standard):
    with captured_stages():
        review = review_create(body=request_body(mission="shop"), user=alice).review
    answer = api_for(alice).get(f"/api/reviews/{review.pk}/result/").json()
    assert answer == {**answer, "id": review.pk, "state": "initializing", "ready": False}
    assert "report" not in answer


@pytest.fixture
def completed(api_for, alice, mission, worker, standard):
    review_id = api_for(alice).post("/api/reviews/", request_body(mission="shop"), format="json").json()["id"]
    worker.drain()
    review = Review.objects.get(pk=review_id)
    assert review.state == "completed"
    return review


def integrity_error(api_for, user, review) -> dict:
    response = api_for(user).get(f"/api/reviews/{review.pk}/result/")
    assert response.status_code == 409, response.json()
    body = response.json()
    assert body["code"] == "review_integrity_error" and "report" not in body
    return body


def test_tampering_with_the_report_fails_verification(api_for, alice, completed):
    ReviewArtifact.objects.filter(review=completed, name="report.md").update(
        content="# Validation report\n\nAll good.\n"
    )
    body = integrity_error(api_for, alice, completed)
    assert any(p.startswith("report.md:") for p in body["fields"]["artifacts"])
    assert api_for(alice).get(f"/api/reviews/{completed.pk}/artifact/?name=report.md").status_code == 409


def test_a_consistent_forgery_is_caught_by_the_manifest(api_for, alice, completed):
    forged = "# Validation report\n\nNothing to see.\n"
    data = forged.encode()
    ReviewArtifact.objects.filter(review=completed, name="report.md").update(
        content=forged, byte_length=len(data), sha256=hashlib.sha256(data).hexdigest()
    )
    body = integrity_error(api_for, alice, completed)
    assert body["fields"]["artifacts"] == [
        "report.md: differs from the manifest",
        "report.md: missing or different from the manifest",
    ]


@pytest.mark.parametrize("name", ["candidate-2.response.txt", "evaluation.json", "anonymous_map.json"])
def test_tampering_with_any_artifact_fails_verification(api_for, alice, completed, name):
    row = ReviewArtifact.objects.get(review=completed, name=name)
    ReviewArtifact.objects.filter(pk=row.pk).update(content=row.content + " ")
    assert any(p.startswith(f"{name}:") for p in integrity_error(api_for, alice, completed)["fields"]["artifacts"])


def test_tampering_with_the_request_or_label_map_fails_verification(api_for, alice, completed):
    swapped = {**completed.label_map, "1": completed.label_map["2"], "2": completed.label_map["1"]}
    Review.objects.filter(pk=completed.pk).update(label_map=swapped)
    assert (
        "anonymous_map.json: the stored label map does not match the review"
        in integrity_error(api_for, alice, completed)["fields"]["artifacts"]
    )
    Review.objects.filter(pk=completed.pk).update(
        label_map=completed.label_map, request={**completed.request, "objective": "Other"}
    )
    assert (
        "request: the stored request does not match its canonical JSON"
        in integrity_error(api_for, alice, completed)["fields"]["artifacts"]
    )


def test_a_large_report_is_served_whole_through_its_link(api_for, alice, completed, monkeypatch):
    monkeypatch.setattr(artifacts, "INLINE_LIMIT", 100)
    answer = api_for(alice).get(f"/api/reviews/{completed.pk}/result/").json()
    report = answer["report"]
    assert report["content"] is None and report["url"] == f"/api/reviews/{completed.pk}/artifact/?name=report.md"
    download = api_for(alice).get(report["url"])
    assert download.status_code == 200 and download["Content-Type"].startswith("text/markdown")
    assert len(download.content) == report["byte_length"] > 100
    assert hashlib.sha256(download.content).hexdigest() == report["sha256"] == download["X-Content-SHA256"]
    assert answer["accounting"]["url"].endswith("name=accounting.json")


def test_the_review_record_lists_its_artifacts(api_for, alice, completed):
    body = api_for(alice).get(f"/api/reviews/{completed.pk}/").json()
    assert body["state"] == "completed" and body["result_url"].endswith("/result/")
    assert {"report.md", "result.json"} <= {a["name"] for a in body["artifacts"]}
    assert all(set(a) == {"name", "kind", "byte_length", "sha256", "created_at"} for a in body["artifacts"])


def test_findings_reach_the_report_when_one_reviewer_found_them(api_for, alice, mission, worker, models):
    models(
        c1=Reviewer(candidate_answer()),
        c2=Reviewer(candidate_answer([finding("Only one saw it")])),
        c3=Reviewer(candidate_answer()),
        eval=Evaluator(),
    )
    review_id = api_for(alice).post("/api/reviews/", request_body(mission="shop"), format="json").json()["id"]
    worker.drain()
    report = api_for(alice).get(f"/api/reviews/{review_id}/result/").json()["report"]["content"]
    assert "### high: Only one saw it" in report
