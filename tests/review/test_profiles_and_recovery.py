"""Review profiles, the model adapter's limits, and re-driving unfinished reviews."""

from __future__ import annotations

import threading

import pytest

from tests.review.support import Evaluator, Reviewer, candidate_answer, request_body
from validation.models import Review
from validation.review import artifacts, llm, pipeline
from validation.review.create import review_create
from validation.review.profiles import ReviewProfileError, profile_problems, resolve_profile
from validation.review.state import captured_stages


def test_profile_rules():
    assert profile_problems("p", {"candidates": ["a", "b", "c"], "evaluator": "e"}) == []
    assert (
        profile_problems(
            "p",
            {
                "candidates": ["a", "b", {"base_url": "http://x/v1", "model": "m", "api_key_env": "K"}],
                "evaluator": "e",
                "timeout": 30,
            },
        )
        == []
    )
    problems = profile_problems(
        "p", {"candidates": ["a", " ", {"model": "m", "api_key": "secret"}], "timeout": 0, "colour": "blue"}
    )
    assert problems == [
        "review profile 'p': unknown option 'colour'",
        "review profile 'p' candidates[1]: a model string must not be blank",
        "review profile 'p' candidates[2]: never put the key in the profile; name its variable in 'api_key_env'",
        "review profile 'p' candidates[2]: 'base_url' is required",
        "review profile 'p': 'evaluator' is required",
        "review profile 'p': 'timeout' must be an integer from 1 to 3600",
    ]


def test_profiles_from_json_with_defaults(settings):
    settings.FUSION_REVIEW_PROFILES = '{"only": {"candidates": ["a", "b", "c"], "evaluator": "e"}}'
    assert resolve_profile() == {
        "name": "only",
        "candidates": ["a", "b", "c"],
        "evaluator": "e",
        "timeout": 600,
        "max_output_bytes": 49152,
        "request_limit": 40,
    }
    settings.FUSION_REVIEW_PROFILES = "{broken"
    with pytest.raises(ReviewProfileError, match="not valid JSON"):
        resolve_profile()


def test_a_model_whose_key_variable_is_unset_is_unavailable(monkeypatch):
    monkeypatch.delenv("NO_SUCH_REVIEW_KEY", raising=False)
    with pytest.raises(llm.ModelFailure) as info:
        llm.build_model({"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "NO_SUCH_REVIEW_KEY"})
    assert info.value.code == "unavailable" and "NO_SUCH_REVIEW_KEY" in str(info.value)


def test_a_model_call_that_outlives_its_timeout_is_stopped(models):
    gate = threading.Event()
    models(slow=Reviewer("late", gate=gate))
    with pytest.raises(llm.ModelFailure) as info:
        llm.run_text_agent("test:slow", instructions="i", prompt="p", timeout=0.5)
    assert info.value.code == "timeout"


@pytest.mark.django_db(transaction=True)
def test_timed_out_reviewers_are_unusable_and_the_reason_says_so(alice, mission, models, settings):
    settings.FUSION_REVIEW_PROFILES = {
        "default": {"candidates": ["test:c1", "test:c2", "test:c3"], "evaluator": "test:eval", "timeout": 1}
    }
    gate = threading.Event()
    models(c1=Reviewer("x", gate=gate), c2=Reviewer("x", gate=gate), c3=Reviewer(candidate_answer()), eval=Evaluator())
    with captured_stages() as queue:
        review = review_create(body=request_body(mission="shop"), user=alice).review
        pipeline.run_captured(queue)
    review.refresh_from_db()
    assert (review.state, review.failure_stage) == ("failed", "candidate")
    assert "the model call failed (timeout)" in review.failure_reason


@pytest.mark.django_db(transaction=True)
def test_unfinished_reviews_are_redriven_from_where_they_stopped(alice, mission, standard):
    with captured_stages() as queue:
        waiting = review_create(body=request_body(mission="shop"), user=alice).review
        queue.clear()  # the start message is "lost"
        running = review_create(body=request_body(mission="shop", objective="Other"), user=alice).review
        pipeline.run_captured([queue.pop(0)])  # started: three candidate messages, all "lost"
        pipeline.run_captured([queue.pop(0)])  # slot 1 answered
        queue.clear()
        assert pipeline.reviews_redrive() == []  # nothing is quiet yet
        assert sorted(pipeline.reviews_redrive(startup=True)) == [waiting.pk, running.pk]
        assert sorted(queue) == [
            ("candidate", running.pk, (2,)),
            ("candidate", running.pk, (3,)),
            ("start", waiting.pk, ()),
        ]
        pipeline.run_captured(queue)
    for review in (waiting, running):
        review.refresh_from_db()
        assert review.state == "completed"
    assert standard["c1"].calls == 2  # slot 1 of `running` was not asked again
    assert pipeline.live_snapshot_labels() == set()


@pytest.mark.django_db
def test_live_snapshot_labels_name_unfinished_reviews(alice, mission, standard, django_capture_on_commit_callbacks):
    review = review_create(body=request_body(mission="shop"), user=alice).review
    assert pipeline.live_snapshot_labels() == {f"review-{review.pk}"}
    Review.objects.filter(pk=review.pk).update(state="failed")
    assert pipeline.live_snapshot_labels() == set()
    assert artifacts.exists(review.pk, "canonical_input.json")
