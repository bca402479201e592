"""The review request rules one by one: each message and path, normalization, the
legacy prompt shape, idempotency keys, references, and what the API answers."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.review.support import request_body
from validation.models import Review, ReviewArtifact
from validation.review.request import (
    EXPECTED_SHAPE,
    LegacyPromptRequest,
    ReviewRequestInvalid,
    normalize_request,
    request_digest,
)


def errors_of(body) -> dict[str, list[str]]:
    with pytest.raises(ReviewRequestInvalid) as info:
        normalize_request(body)
    return info.value.fields


# --- normalization ----------------------------------------------------------------------


def test_strings_are_trimmed_and_optional_arrays_default_to_empty():
    body = request_body(objective="  Add hello  ", scope=[" app.py ", "\ttests/\n"], background=[])
    out = normalize_request(body)
    assert out["objective"] == "Add hello"
    assert out["scope"] == ["app.py", "tests/"]
    assert out["knownLimitations"] == [] and out["exclusions"] == []
    assert out["background"] == []
    assert list(out) == [
        "objective",
        "background",
        "changeSummary",
        "scope",
        "acceptanceCriteria",
        "verification",
        "knownLimitations",
        "exclusions",
    ]


def test_provided_keeps_status_and_trimmed_evidence_only():
    out = normalize_request(
        request_body(verification={"status": "provided", "evidence": [{"check": " pytest ", "outcome": " ok "}]})
    )
    assert out["verification"] == {"status": "provided", "evidence": [{"check": "pytest", "outcome": "ok"}]}


def test_not_run_normalizes_evidence_to_empty():
    out = normalize_request(request_body(verification={"status": "not_run", "reason": " no CI here "}))
    assert out["verification"] == {"status": "not_run", "evidence": [], "reason": "no CI here"}
    out = normalize_request(request_body(verification={"status": "not_run", "reason": "x", "evidence": []}))
    assert out["verification"] == {"status": "not_run", "evidence": [], "reason": "x"}


def test_references_are_kept_normalized():
    out = normalize_request(request_body(mission=" shop ", feature=3, revision=" abc123 "))
    assert (out["mission"], out["feature"], out["revision"]) == ("shop", 3, "abc123")


def test_canonical_form_ignores_key_order_and_surrounding_whitespace():
    a = normalize_request(request_body(objective="Add hello"))
    b = normalize_request(dict(reversed(list(request_body(objective=" Add hello ").items()))))
    assert request_digest(a) == request_digest(b)
    text, sha = request_digest(a)
    assert text == json.dumps(a, sort_keys=True, separators=(",", ":"), ensure_ascii=False)  # RFC 8785 here
    assert sha == hashlib.sha256(text.encode()).hexdigest()


# --- the legacy prompt shape ------------------------------------------------------------


def test_prompt_key_is_refused_first_with_the_new_shape():
    with pytest.raises(LegacyPromptRequest) as info:
        normalize_request({"prompt": "review my change", "bogus": 1, "scope": []})
    exc = info.value
    assert exc.code == "legacy_prompt_request"
    assert exc.fields == {"prompt": ["no longer accepted; use the shape in expected_shape"]}  # nothing else listed
    assert "objective" in exc.detail and "acceptanceCriteria" in exc.detail
    assert exc.extra["expected_shape"] == EXPECTED_SHAPE


# --- each rule, its message and its path -----------------------------------------------


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        ({"objective": "   "}, "objective", "must not be blank"),
        ({"objective": 3}, "objective", "must be a string"),
        ({"changeSummary": ""}, "changeSummary", "must not be blank"),
        ({"scope": []}, "scope", "must have at least one item"),
        ({"scope": ["a", "b", " "]}, "scope[2]", "must not be blank"),
        ({"scope": "app.py"}, "scope", "must be an array of strings"),
        ({"acceptanceCriteria": []}, "acceptanceCriteria", "must have at least one item"),
        ({"acceptanceCriteria": ["ok", 7]}, "acceptanceCriteria[1]", "must be a string"),
        ({"background": [""]}, "background[0]", "must not be blank"),
        ({"knownLimitations": ["x", "  "]}, "knownLimitations[1]", "must not be blank"),
        ({"exclusions": None}, "exclusions", "must be an array of strings"),
        ({"surprise": 1}, "surprise", "unknown field"),
        ({"verification": "done"}, "verification", "must be an object with status and evidence or reason"),
        ({"verification": {"evidence": []}}, "verification.status", "is required"),
        ({"verification": {"status": "maybe"}}, "verification.status", "must be 'provided' or 'not_run'"),
        ({"verification": {"status": "provided"}}, "verification.evidence", "is required when status is 'provided'"),
        (
            {"verification": {"status": "provided", "evidence": []}},
            "verification.evidence",
            "must not be empty when status is 'provided'",
        ),
        (
            {"verification": {"status": "provided", "evidence": [{"check": "c", "outcome": "o"}], "reason": "r"}},
            "verification.reason",
            "is not allowed when status is 'provided'",
        ),
        ({"verification": {"status": "not_run"}}, "verification.reason", "is required when status is 'not_run'"),
        (
            {"verification": {"status": "not_run", "reason": "r", "evidence": [{"check": "c", "outcome": "o"}]}},
            "verification.evidence",
            "must be empty when status is 'not_run'",
        ),
        ({"verification": {"status": "not_run", "reason": "  "}}, "verification.reason", "must not be blank"),
        (
            {"verification": {"status": "provided", "evidence": [{"check": " ", "outcome": "o"}]}},
            "verification.evidence[0].check",
            "must not be blank",
        ),
        (
            {"verification": {"status": "provided", "evidence": [{"check": "c"}]}},
            "verification.evidence[0].outcome",
            "is required",
        ),
        (
            {"verification": {"status": "provided", "evidence": [{"check": "c", "outcome": "o", "url": "u"}]}},
            "verification.evidence[0].url",
            "unknown field",
        ),
        (
            {"verification": {"status": "provided", "evidence": ["c"]}},
            "verification.evidence[0]",
            "must be an object with check and outcome",
        ),
        ({"verification": {"status": "not_run", "reason": "r", "note": 1}}, "verification.note", "unknown field"),
        ({"mission": True}, "mission", "must be an id (integer) or a key (string)"),
        ({"feature": 0}, "feature", "must be a positive id"),
        ({"mission": 2**63}, "mission", "must be a positive id"),
        ({"mission": 2**53}, "mission", "must be a positive id"),  # past what canonical JSON holds exactly
        ({"objective": "a\x00b"}, "objective", "must not contain NUL characters"),
        ({"scope": ["\ud800"]}, "scope[0]", "must be valid Unicode text (no lone surrogates)"),
        ({"revision": "-x"}, "revision", "must be a commit-ish without spaces, at most 80 characters"),
        ({"objective": "x" * 20_001}, "objective", "must be at most 20000 characters"),
        ({"scope": ["a"] * 101}, "scope", "must have at most 100 items"),
    ],
)
def test_each_rule_has_its_message_and_path(change, path, message):
    fields = errors_of(request_body(**change))
    assert fields == {path: [message]}


@pytest.mark.parametrize(
    "missing", ["objective", "background", "changeSummary", "scope", "acceptanceCriteria", "verification"]
)
def test_required_keys(missing):
    body = request_body()
    del body[missing]
    assert errors_of(body) == {missing: ["is required"]}


def test_all_errors_are_listed_at_once_in_the_detail_and_by_path():
    body = request_body(objective=" ", scope=["a", "", 5], verification={"status": "not_run"}, extra=1)
    del body["changeSummary"]
    with pytest.raises(ReviewRequestInvalid) as info:
        normalize_request(body)
    exc = info.value
    assert exc.fields == {
        "extra": ["unknown field"],
        "objective": ["must not be blank"],
        "changeSummary": ["is required"],
        "scope[1]": ["must not be blank"],
        "scope[2]": ["must be a string"],
        "verification.reason": ["is required when status is 'not_run'"],
    }
    assert [e["path"] for e in exc.extra["errors"]] == [
        "extra",
        "objective",
        "changeSummary",
        "scope[1]",
        "scope[2]",
        "verification.reason",
    ]
    for path in exc.fields:
        assert f"{path}: " in exc.detail


def test_body_must_be_an_object():
    with pytest.raises(ReviewRequestInvalid) as info:
        normalize_request(["objective"])
    assert info.value.detail == "the review request must be a JSON object"


# --- through the API ------------------------------------------------------------------------


@pytest.mark.django_db
def test_api_answers_400_with_every_path_and_records_nothing(api_for, alice):
    response = api_for(alice).post(
        "/api/reviews/", request_body(scope=["ok", " "], acceptanceCriteria=[]), format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_review_request"
    assert body["fields"] == {"scope[1]": ["must not be blank"], "acceptanceCriteria": ["must have at least one item"]}
    assert Review.objects.count() == 0


@pytest.mark.django_db
def test_api_legacy_prompt_gets_the_migration_error(api_for, alice):
    response = api_for(alice).post("/api/reviews/", {"prompt": "please review"}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "legacy_prompt_request"
    assert body["expected_shape"]["verification"]["status"] == "provided"
    assert set(body["fields"]) == {"prompt"}


@pytest.mark.django_db
def test_api_needs_a_signed_in_user(api_for):
    assert api_for(None).post("/api/reviews/", request_body(), format="json").status_code == 401


@pytest.mark.django_db
def test_receipt_is_202_after_the_durable_preflight(api_for, alice, mission, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = api_for(alice).post(
            "/api/reviews/", request_body(mission="shop", objective=" Add hello "), format="json"
        )
    assert response.status_code == 202, response.json()
    body = response.json()
    review = Review.objects.get(pk=body["id"])
    assert body["state"] == review.state == "initializing"
    assert body["result_url"] == f"/api/reviews/{review.pk}/result/"
    assert body["events_url"] == f"/events/missions/{mission.pk}/"
    assert response["Location"] == f"/api/reviews/{review.pk}/"
    assert review.request["objective"] == "Add hello"
    text, sha = request_digest(review.request)
    assert (review.canonical_request, review.request_sha256) == (text, sha) == (text, body["request_sha256"])
    assert review.revision == mission.repo.git("rev-parse", "HEAD").strip()  # pinned to a full commit
    names = set(ReviewArtifact.objects.filter(review=review).values_list("name", flat=True))
    assert names == {"request.json", "profile.json", "canonical_input.json"}
    # The progress event and the start of the pipeline, both after commit (the mission's
    # lock, taken first, also leaves its record, a callback that does nothing: not a side
    # effect; missions/locks.py).
    effects = [c for c in callbacks if type(c).__name__ != "_Held"]
    assert len(effects) == 2


@pytest.mark.django_db
def test_profile_problems_are_clear(api_for, alice, settings):
    response = api_for(alice).post("/api/reviews/?profile=nope", request_body(), format="json")
    assert response.status_code == 400 and response.json()["code"] == "unknown_review_profile"
    settings.FUSION_REVIEW_PROFILES = ""
    response = api_for(alice).post("/api/reviews/", request_body(), format="json")
    assert response.status_code == 503 and response.json()["code"] == "review_profile_unavailable"
    settings.FUSION_REVIEW_PROFILES = {"default": {"candidates": ["a", "b"], "evaluator": "e", "api_key": "k"}}
    response = api_for(alice).post("/api/reviews/", request_body(), format="json")
    assert response.status_code == 503
    assert "exactly 3 models" in response.json()["detail"] and "unknown option 'api_key'" in response.json()["detail"]
    assert Review.objects.count() == 0


@pytest.mark.django_db
def test_references_are_checked_against_what_the_user_may_see(api_for, alice, mission, django_user_model):
    bob = django_user_model.objects.create_user("bob")
    response = api_for(bob).post("/api/reviews/", request_body(mission=mission.pk), format="json")
    assert response.status_code == 400 and response.json()["fields"] == {"mission": ["no such mission"]}
    response = api_for(alice).post("/api/reviews/", request_body(feature=mission.feature.pk + 99), format="json")
    assert response.json()["fields"] == {"feature": ["no such feature"]}
    response = api_for(alice).post("/api/reviews/", request_body(mission="shop", revision="nope"), format="json")
    assert response.status_code == 400 and response.json()["code"] == "revision_unavailable"
    response = api_for(alice).post("/api/reviews/", request_body(revision="abc"), format="json")
    assert response.json()["fields"] == {"revision": ["no repository to resolve it in"]}
    response = api_for(alice).post("/api/reviews/", request_body(mission="shop", feature="greet"), format="json")
    assert response.status_code == 202
    assert Review.objects.get().feature_id == mission.feature.pk
    assert Review.objects.count() == 1


# --- idempotency keys -----------------------------------------------------------------------


@pytest.mark.django_db
def test_same_key_and_body_is_the_same_review(api_for, alice, django_user_model):
    client = api_for(alice)
    first = client.post("/api/reviews/", request_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = client.post(
        "/api/reviews/", request_body(objective="  Add a greeting function "), format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"] and again.json()["replayed"] is True
    assert again["Idempotent-Replayed"] == "true"
    other = client.post(
        "/api/reviews/", request_body(objective="Something else"), format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert other.status_code == 409
    assert other.json()["code"] == "idempotency_key_reused" and other.json()["review"] == first.json()["id"]
    # Keys belong to their user; no key means a new review each time.
    bob = django_user_model.objects.create_user("bob")
    assert (
        api_for(bob).post("/api/reviews/", request_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-1").json()["id"]
        != first.json()["id"]
    )
    assert client.post("/api/reviews/", request_body(), format="json").json()["id"] != first.json()["id"]
    assert Review.objects.count() == 3


@pytest.mark.django_db
def test_bad_idempotency_key_is_refused(api_for, alice):
    response = api_for(alice).post("/api/reviews/", request_body(), format="json", HTTP_IDEMPOTENCY_KEY="a b")
    assert response.status_code == 400 and response.json()["code"] == "invalid_idempotency_key"


# --- visibility ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_reviews_are_visible_to_mission_members_and_creators_only(api_for, alice, mission, django_user_model):
    bob = django_user_model.objects.create_user("bob")
    own = api_for(alice).post("/api/reviews/", request_body(mission="shop"), format="json").json()["id"]
    loose = api_for(bob).post("/api/reviews/", request_body(), format="json").json()["id"]
    assert api_for(bob).get(f"/api/reviews/{own}/").status_code == 404
    assert api_for(bob).get(f"/api/reviews/{own}/result/").status_code == 404
    assert api_for(bob).post(f"/api/reviews/{own}/cancel/").status_code == 404
    assert api_for(alice).get(f"/api/reviews/{loose}/").status_code == 404
    mission.members.add(bob)
    assert api_for(bob).get(f"/api/reviews/{own}/").status_code == 200
    ids = [r["id"] for r in api_for(bob).get("/api/reviews/").json()["results"]]
    assert sorted(ids) == sorted([own, loose])
