"""The review pipeline against scripted OpenAI-compatible servers over real HTTP on
127.0.0.1: one server per model of the profile, a real Dramatiq worker."""

from __future__ import annotations

import json

import pytest

from tests.review.support import candidate_answer, fenced, finding, good_evaluation, request_body, violating
from tests.support.openai_server import ScriptedOpenAIServer
from validation.models import Review, ReviewArtifact

pytestmark = pytest.mark.django_db(transaction=True)
KEY_ENV = "REVIEW_TEST_LLM_KEY"


def _user_content(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def evaluator_turn(*plans):
    """A turn that reads the blind input out of the request; one plan per attempt."""
    seen: list[str] = []

    def turn(context):
        content = _user_content(context["body"])
        seen.append(content)
        payload = json.loads(content.split("\n", 1)[1])
        blind = payload["original_blind_input"] if content.startswith("Repair input") else payload
        return ("text", json.dumps(plans[min(len(seen), len(plans)) - 1](blind)))

    turn.seen = seen
    return turn


@pytest.fixture
def servers(settings, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-review-test")
    started: list[ScriptedOpenAIServer] = []

    def make(c1: list, c2: list, c3: list, evaluator: list) -> dict[str, ScriptedOpenAIServer]:
        out = {}
        for name, turns in (("c1", c1), ("c2", c2), ("c3", c3), ("eval", evaluator)):
            out[name] = ScriptedOpenAIServer(turns, model=f"model-{name}").start()
            started.append(out[name])
        spec = {
            name: {"base_url": s.base_url, "model": f"model-{name}", "api_key_env": KEY_ENV} for name, s in out.items()
        }
        settings.FUSION_REVIEW_PROFILES = json.dumps(
            {"default": {"candidates": [spec["c1"], spec["c2"], spec["c3"]], "evaluator": spec["eval"], "timeout": 60}}
        )
        return out

    yield make
    for server in started:
        server.stop()


def run(api_for, user, worker) -> Review:
    response = api_for(user).post("/api/reviews/", request_body(mission="shop"), format="json")
    assert response.status_code == 202, response.json()
    worker.drain()
    return Review.objects.get(pk=response.json()["id"])


def test_three_reviewers_with_tools_and_an_evaluator_over_http(api_for, alice, mission, worker, servers):
    s = servers(
        c1=[
            ("tool", "ls", {"path": "."}),
            ("tool", "read", {"path": "app.py"}),
            ("text", candidate_answer([finding("hello() returns 'hello'", location="app.py:2")])),
        ],
        c2=[
            ("tool", "grep", {"pattern": "return", "path": "."}),
            ("text", fenced(candidate_answer([finding("Wrong word", location="app.py:2", severity="critical")]))),
        ],
        c3=[("text", candidate_answer([], verified=["app.py defines hello()"]))],
        evaluator=[evaluator_turn(good_evaluation)],
    )
    review = run(api_for, alice, worker)
    assert review.state == "completed", review.failure_reason
    # The tools ran on the snapshot and their answers went back over the wire.
    c1 = s["c1"].requests
    assert [r["turn"] for r in c1] == [0, 1, 2]
    assert {t["function"]["name"] for t in c1[0]["body"]["tools"]} == {"read", "grep", "find", "ls"}
    tool_answers = [m["content"] for m in c1[2]["body"]["messages"] if m["role"] == "tool"]
    assert "app.py" in tool_answers[0] and "return 'hello'" in tool_answers[1]
    assert {k.lower(): v for k, v in c1[0]["headers"].items()}["authorization"] == "Bearer sk-review-test"
    assert "app.py:2: " in next(m["content"] for m in s["c2"].requests[1]["body"]["messages"] if m["role"] == "tool")
    # The evaluator is blind: no tools, and only labels, never the slots or models.
    evaluation_request = s["eval"].requests[0]["body"]
    assert "tools" not in evaluation_request or not evaluation_request["tools"]
    blind = _user_content(evaluation_request)
    assert "model-c1" not in blind and '"candidate_id":"A"' in blind
    report = api_for(alice).get(f"/api/reviews/{review.pk}/result/").json()["report"]["content"]
    assert "### critical: Wrong word" in report and report.count("### ") == 1
    assert "- app.py defines hello()" in report
    assert "recovered from a fenced JSON block" in report
    assert ReviewArtifact.objects.filter(review=review, kind="recovery").count() == 1


def test_one_unusable_reviewer_over_http(api_for, alice, mission, worker, servers):
    servers(
        c1=[("text", "Looks good to me!")],
        c2=[("text", candidate_answer([finding("Bug")]))],
        c3=[("text", candidate_answer())],
        evaluator=[evaluator_turn(good_evaluation)],
    )
    review = run(api_for, alice, worker)
    assert review.state == "completed"
    report = api_for(alice).get(f"/api/reviews/{review.pk}/result/").json()["report"]["content"]
    assert "One of the three reviewers returned no usable report" in report


def test_two_unusable_reviewers_over_http_fail(api_for, alice, mission, worker, servers):
    s = servers(
        c1=[("text", "Looks good to me!")],
        c2=[("text", "```json\n{}\n```\ntrailing")],
        c3=[("text", candidate_answer())],
        evaluator=[evaluator_turn(good_evaluation)],
    )
    review = run(api_for, alice, worker)
    assert (review.state, review.failure_stage) == ("failed", "candidate")
    assert s["eval"].requests == []


def test_the_evaluator_repair_over_http(api_for, alice, mission, worker, servers):
    turn = evaluator_turn(violating(lambda acc: acc["decisions"].pop()), good_evaluation)
    s = servers(
        c1=[("text", candidate_answer([finding("Bug")]))],
        c2=[("text", candidate_answer())],
        c3=[("text", candidate_answer())],
        evaluator=[turn],
    )
    review = run(api_for, alice, worker)
    assert review.state == "completed" and review.evaluator_attempts == 2
    assert len(s["eval"].requests) == 2
    repair = json.loads(turn.seen[1].split("\n", 1)[1])
    assert set(repair) == {"original_blind_input", "invalid_output", "validation_errors"}
    assert any("has no decision for" in e for e in repair["validation_errors"])
