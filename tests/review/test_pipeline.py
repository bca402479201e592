"""The review pipeline on a real Dramatiq worker with FunctionModel reviewers: candidate
outcomes, anonymization, the evaluator's accounting with its one repair, artifacts,
events, and what a review never touches."""

from __future__ import annotations

import json
import re

import pytest

from missions.models import MissionFeature
from tests.review.conftest import event_names, progress_events
from tests.review.support import (
    VIOLATIONS,
    Evaluator,
    Reviewer,
    candidate_answer,
    fenced,
    finding,
    good_evaluation,
    request_body,
    violating,
)
from validation.models import Review, ReviewArtifact

pytestmark = pytest.mark.django_db(transaction=True)


def start(api_for, user, **changes) -> Review:
    response = api_for(user).post("/api/reviews/", request_body(mission="shop", **changes), format="json")
    assert response.status_code == 202, response.json()
    return Review.objects.get(pk=response.json()["id"])


def run(api_for, user, worker, **changes) -> Review:
    review = start(api_for, user, **changes)
    worker.drain()
    review.refresh_from_db()
    return review


def names(review: Review) -> set[str]:
    return set(ReviewArtifact.objects.filter(review=review).values_list("name", flat=True))


def result(api_for, user, review: Review) -> dict:
    response = api_for(user).get(f"/api/reviews/{review.pk}/result/")
    assert response.status_code == 200, response.json()
    return response.json()


def test_three_valid_candidates_complete_with_a_verified_report(api_for, alice, mission, worker, standard):
    review = run(api_for, alice, worker)
    assert review.state == "completed", review.failure_reason
    assert review.evaluator_attempts == 1
    assert sorted(review.label_map) == ["1", "2", "3"] and sorted(review.label_map.values()) == ["A", "B", "C"]
    answer = result(api_for, alice, review)
    assert answer["ready"] is True and answer["verified"] is True
    report = answer["report"]["content"]
    # The two app.py:1 findings are one group, shown once with the group's (highest) severity.
    assert report.count("### ") == 2
    assert "### critical: Wrong greeting text" in report and "### minor: No test for hello()" in report
    assert report.index("### critical") < report.index("### minor")
    assert "- hello() exists" in report and report.count("hello() exists") == 1  # verified, de-duplicated
    assert "- Did not run the app." in report
    assert "No source findings were excluded." in report
    accounting = answer["accounting"]["content"]
    assert len(accounting["findings"]) == 3 and len(accounting["groups"]) == 2
    assert {f["source_id"][:2] for f in accounting["findings"]} <= {"A-", "B-", "C-"}
    assert all(re.fullmatch(r"[ABC]-F\d{3}", f["source_id"]) for f in accounting["findings"])
    assert not re.search(r"[ABC]-F\d{3}", report)
    assert {
        "anonymous_map.json",
        "evaluator.input.json",
        "evaluation.json",
        "report.md",
        "accounting.json",
        "result.json",
        "candidate-1.prompt.json",
        "candidate-1.response.txt",
        "candidate-A.json",
        "evaluator.prompt-1.json",
        "evaluator.response-1.txt",
    } <= names(review)
    assert review.tokens_in > 0 and review.tokens_out > 0
    events = event_names(mission.pk)
    assert events[:2] == ["state:initializing", "state:candidates_running"]
    assert events.count("candidate_started") == 3 and events.count("candidate_completed") == 3
    # A candidate records its outcome, then announces it, then checks whether it was the
    # last: two candidates finishing together may announce after the other one moved the
    # review to candidates_complete. The states themselves are compare-and-swaps, in order.
    assert [e for e in events if e != "candidate_completed"][-7:] == [
        "state:candidates_complete",
        "state:evaluating",
        "evaluation_started",
        "state:evaluation_complete",
        "state:rendering",
        "state:completed",
        "completed",
    ]


def test_candidates_read_the_pinned_snapshot_with_read_only_tools(api_for, alice, mission, worker, models):
    tools = [("ls", {"path": "."}), ("read", {"path": "app.py"}), ("read", {"path": "../../etc/passwd"})]
    reviewers = models(
        c1=Reviewer(candidate_answer(), tools=tools),
        c2=Reviewer(candidate_answer()),
        c3=Reviewer(candidate_answer()),
        eval=Evaluator(),
    )
    review = start(api_for, alice)
    # The live tree moves on after the request: the reviewers must not see it.
    mission.repo.commit({"app.py": "def hello():\n    return 'CHANGED'\n"}, "later")
    worker.drain()
    review.refresh_from_db()
    assert review.state == "completed"
    c1 = reviewers["c1"]
    assert c1.tool_names == ["read", "grep", "find", "ls"]
    assert "app.py" in c1.tool_results[0]
    assert "return 'hello'" in c1.tool_results[1] and "CHANGED" not in c1.tool_results[1]
    assert c1.tool_results[2].startswith("refused")
    assert reviewers["eval"].tool_names == [[]]  # the evaluator has no tools


def test_one_fenced_candidate_is_recovered_and_recorded(api_for, alice, mission, worker, models):
    models(
        c1=Reviewer(fenced(candidate_answer([finding("Bug")]))),
        c2=Reviewer(candidate_answer()),
        c3=Reviewer(candidate_answer()),
        eval=Evaluator(),
    )
    review = run(api_for, alice, worker)
    assert review.state == "completed"
    recoveries = ReviewArtifact.objects.filter(review=review, kind="recovery")
    assert recoveries.count() == 1
    label = review.label_map["1"]
    assert json.loads(recoveries.get().content) == {
        "candidate_id": label,
        "rule": "single ```json fence",
        "preamble_bytes": 19,
        "body_bytes": len(candidate_answer([finding("Bug")])),
    }
    report = result(api_for, alice, review)["report"]["content"]
    assert report.count("recovered from a fenced JSON block") == 1
    assert "### high: Bug" in report


def test_two_fenced_candidates_make_one_aggregate_limitation(api_for, alice, mission, worker, models):
    models(
        c1=Reviewer(fenced(candidate_answer())),
        c2=Reviewer(fenced(candidate_answer())),
        c3=Reviewer(candidate_answer()),
        eval=Evaluator(),
    )
    review = run(api_for, alice, worker)
    report = result(api_for, alice, review)["report"]["content"]
    assert "- Two reviewer report(s) had to be recovered from a fenced JSON block" in report
    assert report.count("fenced JSON block") == 1


def test_one_unusable_candidate_is_replaced_by_an_empty_report(api_for, alice, mission, worker, models):
    models(
        c1=Reviewer("I think the change is fine."),
        c2=Reviewer(candidate_answer([finding("Bug")])),
        c3=Reviewer(candidate_answer()),
        eval=Evaluator(),
    )
    review = run(api_for, alice, worker)
    assert review.state == "completed"
    label = review.label_map["1"]
    unusable = json.loads(ReviewArtifact.objects.get(review=review, name=f"candidate-{label}.unusable.json").content)
    assert unusable["problems"][0].startswith("not a JSON document")
    assert json.loads(ReviewArtifact.objects.get(review=review, name=f"candidate-{label}.json").content) == {
        "findings": [],
        "verified": [],
        "limitations": [],
    }
    report = result(api_for, alice, review)["report"]["content"]
    assert "- One of the three reviewers returned no usable report; it was replaced by an empty report." in report


def test_two_unusable_candidates_fail_the_review_and_keep_the_label_map(api_for, alice, mission, worker, models):
    evaluator = Evaluator()
    models(c1=Reviewer("nope"), c2=Reviewer('{"findings": "many"}'), c3=Reviewer(candidate_answer()), eval=evaluator)
    review = run(api_for, alice, worker)
    assert review.state == "failed"
    assert (review.failure_code, review.failure_stage) == ("evaluation_invalid", "candidate")
    assert "2 of the three reviewers returned no usable report" in review.failure_reason
    assert sorted(review.label_map.values()) == ["A", "B", "C"] and "anonymous_map.json" in names(review)
    assert evaluator.attempts == []  # the evaluator never ran
    answer = result(api_for, alice, review)
    assert answer["ready"] is False and "report" not in answer
    assert answer["failure_code"] == "evaluation_invalid" and answer["reason"] == review.failure_reason
    assert event_names(mission.pk)[-2:] == ["state:failed", "failed"]


def test_a_model_error_makes_that_candidate_unusable(api_for, alice, mission, worker, models):
    from validation.review import llm

    models(c2=Reviewer(candidate_answer()), c3=Reviewer(candidate_answer()), eval=Evaluator())
    llm.TEST_MODELS.pop("test:c1", None)  # c1 is not registered: its call fails
    review = run(api_for, alice, worker)
    assert review.state == "completed"
    outcome = json.loads(ReviewArtifact.objects.get(review=review, name="candidate-1.outcome.json").content)
    assert outcome["status"] == "error" and outcome["code"] == "unavailable"


@pytest.mark.parametrize("rule", sorted(VIOLATIONS))
def test_each_accounting_violation_gets_one_repair_then_succeeds(
    api_for, alice, mission, worker, standard, models, rule
):
    mutate, message = VIOLATIONS[rule]
    evaluator = models(eval=Evaluator(violating(mutate), good_evaluation))["eval"]
    review = run(api_for, alice, worker)
    assert review.state == "completed", review.failure_reason
    assert review.evaluator_attempts == 2
    errors = json.loads(ReviewArtifact.objects.get(review=review, name="evaluator.errors-1.json").content)
    assert any(message in e for e in errors), errors
    repair = evaluator.attempts[1]
    assert repair["repair"] is True
    assert repair["payload"]["validation_errors"] == errors
    assert repair["payload"]["original_blind_input"] == evaluator.attempts[0]["payload"]
    assert json.loads(repair["payload"]["invalid_output"])["validation_accounting"]  # the invalid answer itself
    events = progress_events(mission.pk)
    retry = [e for e in events if e["event"] == "evaluation_retry"]
    assert len(retry) == 1 and retry[0]["violations"] == len(errors)


@pytest.mark.parametrize("rule", sorted(VIOLATIONS))
def test_a_second_violation_fails_the_review(api_for, alice, mission, worker, standard, models, rule):
    mutate, message = VIOLATIONS[rule]
    evaluator = models(eval=Evaluator(violating(mutate)))["eval"]
    review = run(api_for, alice, worker)
    assert review.state == "failed"
    assert (review.failure_code, review.failure_stage) == ("evaluation_invalid", "evaluation")
    assert message in review.failure_reason
    assert len(evaluator.attempts) == 2 and review.evaluator_attempts == 2
    assert "report.md" not in names(review)


def test_an_evaluator_answer_that_is_not_json_is_repaired(api_for, alice, mission, worker, standard, models):
    models(eval=Evaluator(lambda blind: "Everything looks fine!", good_evaluation))
    review = run(api_for, alice, worker)
    assert review.state == "completed" and review.evaluator_attempts == 2


def test_violations_are_bounded(api_for, alice, mission, worker, models):
    many = [finding(f"Bug {i}", location=f"f{i}.py") for i in range(40)]
    models(
        c1=Reviewer(candidate_answer(many)),
        c2=Reviewer(candidate_answer()),
        c3=Reviewer(candidate_answer()),
        eval=Evaluator(violating(lambda acc: acc.update(decisions=[])), good_evaluation),
    )
    review = run(api_for, alice, worker)
    assert review.state == "completed"
    errors = json.loads(ReviewArtifact.objects.get(review=review, name="evaluator.errors-1.json").content)
    assert len(errors) == 25 and errors[-1].startswith("… and ") and errors[-1].endswith("more violations")
    assert sum(len(e) for e in errors[:-1]) <= 4000 and all(len(e) <= 500 for e in errors)


def test_every_artifact_has_its_length_and_hash(api_for, alice, mission, worker, standard):
    import hashlib

    review = run(api_for, alice, worker)
    rows = ReviewArtifact.objects.filter(review=review)
    assert rows.count() >= 20
    for row in rows:
        data = row.content.encode("utf-8")
        assert (row.byte_length, row.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    manifest = json.loads(rows.get(name="result.json").content)
    assert {a["name"] for a in manifest["artifacts"]} == names(review) - {"result.json"}


def test_a_review_never_changes_the_feature(api_for, alice, mission, worker, standard):
    feature = mission.feature
    before = MissionFeature.objects.filter(pk=feature.pk).values().get()
    run(api_for, alice, worker, feature=feature.pk)
    after = MissionFeature.objects.filter(pk=feature.pk).values().get()
    assert before == after
    assert not [
        e for e in event_names(mission.pk) if not e.startswith(("state:", "candidate_", "evaluation_", "completed"))
    ]


def test_a_review_without_a_mission_reads_no_repository(api_for, alice, worker, standard):
    response = api_for(alice).post("/api/reviews/", request_body(), format="json")
    assert response.json()["events_url"] is None
    worker.drain()
    review = Review.objects.get(pk=response.json()["id"])
    assert review.state == "completed" and review.revision == ""
    assert standard["c1"].tool_names == []
    report = result(api_for, alice, review)["report"]["content"]
    assert "No repository was attached to this review" in report


def test_an_answer_with_unstorable_characters_is_stored_safely(api_for, alice, mission, worker, models):
    models(
        c1=Reviewer("garbage \x00 and \ud800"),
        c2=Reviewer(candidate_answer()),
        c3=Reviewer(candidate_answer()),
        eval=Evaluator(),
    )
    review = run(api_for, alice, worker)
    assert review.state == "completed", review.failure_reason
    stored = ReviewArtifact.objects.get(review=review, name="candidate-1.response.txt")
    assert stored.content == "garbage \ufffd and \ufffd"
    assert result(api_for, alice, review)["verified"] is True
