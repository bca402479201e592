"""`fusion_validate` and `bg_result` over MCP against a live `serve`: the review request's
refusals (shared with POST /api/reviews/), the receipt after the durable preflight, the
notification when the review ends, and the verified, whole report."""

from __future__ import annotations

import asyncio
import hashlib
import json

import anyio
import mcp_types as types
import pytest

from tests.mcp.conftest import KEY_ENV, api, http_client, structured
from tests.review.support import candidate_answer, finding, good_evaluation, request_body
from tests.review.test_http import evaluator_turn
from tests.support.openai_server import ScriptedOpenAIServer
from validation.review.request import normalize_request

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REFUSALS = [
    # (arguments, code, a path the error names)
    ({"prompt": "review my change"}, "legacy_prompt_request", "prompt"),
    ({**request_body(), "prompt": "x"}, "legacy_prompt_request", "prompt"),
    (request_body(scope=[]), "invalid_review_request", "scope"),
    (request_body(acceptanceCriteria=[]), "invalid_review_request", "acceptanceCriteria"),
    (request_body(objective="   "), "invalid_review_request", "objective"),
    (request_body(background=["ok", " "]), "invalid_review_request", "background[1]"),
    (request_body(verification={"status": "provided"}), "invalid_review_request", "verification.evidence"),
    (
        request_body(verification={"status": "provided", "evidence": []}),
        "invalid_review_request",
        "verification.evidence",
    ),
    (
        request_body(verification={"status": "provided", "evidence": [{"check": "a", "outcome": "b"}], "reason": "r"}),
        "invalid_review_request",
        "verification.reason",
    ),
    (request_body(verification={"status": "not_run"}), "invalid_review_request", "verification.reason"),
    (
        request_body(verification={"status": "not_run", "reason": "r", "evidence": [{"check": "a", "outcome": "b"}]}),
        "invalid_review_request",
        "verification.evidence",
    ),
    (request_body(verification={"status": "maybe", "reason": "r"}), "invalid_review_request", "verification.status"),
    (
        request_body(verification={"status": "not_run", "reason": "r", "extra": 1}),
        "invalid_review_request",
        "verification.extra",
    ),
    (request_body(surprise=True), "invalid_review_request", "surprise"),
    # The API's reference keys are not in the seed's contract: the mission is the connection's.
    (request_body(mission="shop"), "invalid_review_request", "mission"),
    (request_body(revision="HEAD", scope=[]), "invalid_review_request", "revision"),
]


@pytest.fixture
def models(monkeypatch):
    started: list[ScriptedOpenAIServer] = []

    def make(c1, c2, c3, evaluator) -> str:
        spec = {}
        for name, turns in (("c1", c1), ("c2", c2), ("c3", c3), ("eval", evaluator)):
            server = ScriptedOpenAIServer(turns, model=f"model-{name}").start()
            started.append(server)
            spec[name] = {"base_url": server.base_url, "model": f"model-{name}", "api_key_env": KEY_ENV}
        profile = {"candidates": [spec["c1"], spec["c2"], spec["c3"]], "evaluator": spec["eval"], "timeout": 60}
        return json.dumps({"default": profile})

    yield make
    for server in started:
        server.stop()


def test_every_refusal_of_the_review_request(serve, alice, shop, settings):
    server = serve(FUSION_REVIEW_PROFILES=json.dumps({"default": {"candidates": ["a:b"] * 3, "evaluator": "a:b"}}))

    async def scenario():
        async with http_client(server.mcp("shop"), token=alice.token) as client:
            return [await client.call_tool("fusion_validate", arguments) for arguments, _c, _p in REFUSALS]

    results = asyncio.run(scenario())
    for (arguments, code, path), result in zip(REFUSALS, results, strict=True):
        body = structured(result)
        assert result.is_error, arguments
        assert body["code"] == code, (arguments, body)
        assert path in body["fields"], (path, body)
    # The same rules as POST /api/reviews/: the same code and the same messages for a body
    # both accept the shape of.
    status, rest = api(server, "POST", "/api/reviews/", token=alice.token, body=request_body(scope=[]))
    assert status == 400 and rest["fields"] == structured(results[2])["fields"]
    # The references are told with the other problems, unknown keys first.
    assert list(structured(results[-1])["fields"])[:2] == ["revision", "scope"]
    with pytest.raises(Exception) as raised:
        normalize_request({"prompt": "x"})
    assert structured(results[0])["detail"] == raised.value.detail
    from validation.models import Review

    assert Review.objects.count() == 0  # nothing recorded for a refused request


def test_receipt_notification_and_verified_result(serve, alice, bob, shop, models):
    profiles = models(
        c1=[("text", candidate_answer([finding("hello() returns 'hello'", location="app.py:2")]))],
        c2=[("text", candidate_answer([finding("Wrong word", location="app.py:2", severity="critical")]))],
        c3=[("text", candidate_answer([], verified=["app.py defines hello()"]))],
        evaluator=[evaluator_turn(good_evaluation)],
    )
    server = serve(FUSION_REVIEW_PROFILES=profiles, **{KEY_ENV: "sk-mcp-test"})
    notes: list[str] = []
    logs: list[dict] = []

    async def scenario():
        done = anyio.Event()

        async def on_message(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                notes.append(str(message.params.uri))

        async def on_log(params) -> None:
            logs.append(params.data)
            done.set()

        async with http_client(
            server.mcp("shop"), token=alice.token, mode="legacy", message_handler=on_message, logging_callback=on_log
        ) as client:
            receipt = structured(await client.call_tool("fusion_validate", request_body()))
            early = structured(await client.call_tool("bg_result", {"taskId": receipt["taskId"]}))
            with anyio.fail_after(120):
                await done.wait()
            result = structured(await client.call_tool("bg_result", {"taskId": receipt["taskId"]}))
        async with http_client(server.mcp(), token=bob.token) as stranger:
            foreign = await stranger.call_tool("bg_result", {"taskId": receipt["taskId"]})
        return receipt, early, result, foreign

    receipt, early, result, foreign = asyncio.run(scenario())
    from validation.models import Review

    review = Review.objects.get(pk=receipt["id"])
    assert receipt["state"] == "initializing" and receipt["revision"] == shop.repo.git("rev-parse", "HEAD").strip()
    assert receipt["resource"] == f"fusion://reviews/{review.pk}" and review.source == "mcp"
    assert review.mission_id == shop.mission.pk and receipt["request_sha256"] == review.request_sha256
    assert early["ready"] is False and early["detail"].startswith("still running: ")
    assert f"fusion://reviews/{review.pk}" in notes
    assert logs and logs[-1]["taskId"] == receipt["taskId"] and logs[-1]["state"] == "completed"
    assert result["ready"] is True and result["state"] == "completed"
    report = result["report"]
    raw = report["content"].encode("utf-8")
    assert len(raw) == report["byte_length"] and hashlib.sha256(raw).hexdigest() == report["sha256"]
    assert "### critical: Wrong word" in report["content"]
    assert result["accounting"]["content"]["findings"]
    assert foreign.is_error and structured(foreign)["code"] == "not_found"


def test_fusion_validate_needs_the_connection_mission(serve, alice, shop):
    server = serve(FUSION_REVIEW_PROFILES=json.dumps({"default": {"candidates": ["a:b"] * 3, "evaluator": "a:b"}}))

    async def scenario():
        async with http_client(server.mcp(), token=alice.token) as client:
            return await client.call_tool("fusion_validate", request_body())

    result = asyncio.run(scenario())
    assert result.is_error and structured(result)["code"] == "mission_required"
