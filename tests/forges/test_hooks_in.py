"""The webhook's door (docs/FORGES.md, "Webhooks"): what a forge's request is answered,
and what is recorded of it, for each provider; replays and oversized bodies."""

from __future__ import annotations

import io
import json

import pytest
from django.test import Client

from forges.inbound.receive import delivery_receive
from forges.models import Delivery, Forge
from missions.models import Mission
from tests.reliability.conftest import race

from .conftest import follow, hook, push_payload, signed_headers

pytestmark = pytest.mark.django_db(transaction=True)

PROVIDERS = ("github", "gitlab", "gitea", "generic")
HEAD = "a" * 40


@pytest.fixture
def two(alice, idle_broker):
    """Two missions, each following its forge with its own secret, on every provider."""

    def make(provider: str) -> tuple[Mission, Mission]:
        one = Mission.objects.create(key="one", title="One", owner=alice)
        other = Mission.objects.create(key="other", title="Other", owner=alice)
        follow(one, provider)
        follow(other, provider)
        return one, other

    return make


@pytest.mark.parametrize("provider", PROVIDERS)
def test_each_providers_signature_right_wrong_missing_and_of_another_mission(two, provider):
    one, other = two(provider)
    client = Client()
    payload = push_payload("refs/heads/main", HEAD)
    other_secret = Forge.objects.get(mission=other).secret

    right = hook(client, one, payload, provider=provider)
    wrong = hook(client, one, payload, provider=provider, secret="not-the-secret")
    missing = hook(client, one, payload, provider=provider, secret=None)
    foreign = hook(client, one, payload, provider=provider, secret=other_secret)

    assert right.status_code == 202
    assert right.json() == {"status": "queued", "delivery": right.json()["delivery"]}
    for answer in (wrong, missing, foreign):
        assert answer.status_code == 401
        assert answer.json()["code"] == "bad_signature"
    rows = list(Delivery.objects.filter(mission=one).order_by("id"))
    assert [r.state for r in rows] == ["received", "rejected", "rejected", "rejected"]
    assert rows[0].payload == (payload if provider != "generic" else rows[0].payload)
    assert rows[0].payload["ref"] == "refs/heads/main"
    for rejected in rows[1:]:
        assert rejected.payload is None and rejected.reason == "the signature is missing or wrong"
        assert rejected.delivery_id == ""  # a forged request holds no delivery id
    assert not Delivery.objects.filter(mission=other).exists()


def test_a_gitea_hook_may_sign_as_forgejo(two):
    one, _ = two("gitea")
    body = json.dumps(push_payload("refs/heads/main", HEAD)).encode()
    secret = Forge.objects.get(mission=one).secret
    headers = signed_headers("gitea", secret, body, "push", "forgejo-1")
    headers["X-Forgejo-Signature"] = headers.pop("X-Gitea-Signature")
    headers["X-Forgejo-Delivery"] = headers.pop("X-Gitea-Delivery")
    answer = Client().post("/hooks/gitea/one/", data=body, content_type="application/json", headers=headers)
    assert answer.status_code == 202
    assert Delivery.objects.get(pk=answer.json()["delivery"]).delivery_id == "forgejo-1"


def test_the_deployments_secret_serves_a_forge_without_its_own_and_without_either_the_hook_is_closed(two, settings):
    one, _ = two("github")
    Forge.objects.filter(mission=one).update(secret="")
    settings.FUSION_FORGE_WEBHOOK_SECRET = "deployment-secret"
    payload = push_payload("refs/heads/main", HEAD)
    assert hook(Client(), one, payload, secret="deployment-secret").status_code == 202

    settings.FUSION_FORGE_WEBHOOK_SECRET = ""
    closed = hook(Client(), one, payload, secret="")
    assert closed.status_code == 403 and closed.json()["code"] == "no_secret"
    assert Delivery.objects.filter(mission=one).latest("id").state == "rejected"


def test_an_unknown_mission_or_a_provider_the_mission_does_not_follow_is_not_found(two):
    one, _ = two("github")
    client = Client()
    body = json.dumps(push_payload("refs/heads/main", HEAD)).encode()
    secret = Forge.objects.get(mission=one).secret
    headers = signed_headers("github", secret, body, "push", "x-1")

    nowhere = client.post("/hooks/github/nope/", data=body, content_type="application/json", headers=headers)
    assert (nowhere.status_code, nowhere.json()) == (404, {"code": "not_found", "detail": "no such hook"})
    assert not Delivery.objects.exists()

    gitlab = hook(client, one, push_payload("refs/heads/main", HEAD), provider="gitlab")
    assert gitlab.status_code == 404 and gitlab.json() == {"code": "not_found", "detail": "no such hook"}
    [rejected] = Delivery.objects.filter(mission=one)
    assert (rejected.state, rejected.provider) == ("rejected", "gitlab")
    assert "not gitlab" in rejected.reason

    Forge.objects.filter(mission=one).delete()
    assert hook(client, one, {}, secret="whatever").status_code == 404
    assert Delivery.objects.filter(mission=one).latest("id").reason == "the mission follows no forge"


def test_only_post_is_answered(two):
    two("github")
    assert Client().get("/hooks/github/one/").status_code == 405


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_replayed_delivery_is_answered_200_and_changes_nothing(two, provider):
    one, _ = two(provider)
    client = Client()
    payload = push_payload("refs/heads/main", HEAD)
    # A forged request with the same id first: it cannot burn the real delivery's id.
    assert hook(client, one, payload, provider=provider, secret="forged", delivery="same").status_code == 401
    first = hook(client, one, payload, provider=provider, delivery="same")
    again = hook(client, one, payload, provider=provider, delivery="same")
    assert first.status_code == 202
    assert (again.status_code, again.json()) == (200, {"status": "duplicate"})
    assert Delivery.objects.filter(mission=one).exclude(state="rejected").count() == 1


def test_copies_of_one_delivery_arriving_at_once_are_recorded_once(two):
    one, _ = two("github")
    payload = push_payload("refs/heads/main", HEAD)
    answers = race(*(lambda: hook(Client(), one, payload, delivery="burst-1") for _ in range(6)))
    assert not [a for a in answers if isinstance(a, BaseException)], answers
    assert sorted(a.status_code for a in answers) == [200] * 5 + [202]
    assert [a.json() for a in answers if a.status_code == 200] == [{"status": "duplicate"}] * 5
    assert Delivery.objects.filter(mission=one, delivery_id="burst-1").count() == 1


def test_a_gitlab_delivery_without_its_uuid_is_known_by_its_body(two):
    one, _ = two("gitlab")
    body = json.dumps(push_payload("refs/heads/main", HEAD)).encode()
    secret = Forge.objects.get(mission=one).secret
    headers = {"X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": secret}
    client = Client()
    first = client.post("/hooks/gitlab/one/", data=body, content_type="application/json", headers=headers)
    again = client.post("/hooks/gitlab/one/", data=body, content_type="application/json", headers=headers)
    assert first.status_code == 202 and again.json() == {"status": "duplicate"}
    assert Delivery.objects.get(pk=first.json()["delivery"]).delivery_id.startswith("sha256:")


def test_an_oversized_body_is_refused_before_it_is_read_or_verified(two, settings):
    one, _ = two("github")
    settings.FUSION_FORGE_HOOK_MAX_BYTES = 200
    big = {"ref": "refs/heads/main", "after": HEAD, "padding": "x" * 300}
    answer = hook(Client(), one, big)
    assert answer.status_code == 413 and answer.json()["code"] == "body_too_large"
    [row] = Delivery.objects.filter(mission=one)
    assert row.state == "rejected" and row.payload is None and "larger than 200 bytes" in row.reason

    # A body without a length (chunked) is read up to the limit and one byte more, no further.
    body = json.dumps(big).encode()
    stream = io.BytesIO(body)
    secret = Forge.objects.get(mission=one).secret
    headers = signed_headers("github", secret, body, "push", "chunked-1")
    refused = delivery_receive(
        provider="github", mission_key="one", headers=headers, stream=stream, content_length=None
    )
    assert refused.status == 413 and stream.tell() == 201

    small = hook(Client(), one, {"ref": "refs/heads/main", "after": HEAD})
    assert small.status_code == 202


def test_a_verified_body_that_is_not_a_json_object_is_rejected(two):
    one, _ = two("github")
    answer = hook(Client(), one, {}, body=b"[1, 2]")
    assert answer.status_code == 400 and answer.json()["code"] == "bad_payload"
    assert hook(Client(), one, {}, body=b"not json").status_code == 400
    assert set(Delivery.objects.filter(mission=one).values_list("state", flat=True)) == {"rejected"}


def test_githubs_ping_is_answered_at_once_and_recorded_as_ignored(two):
    one, _ = two("github")
    answer = hook(Client(), one, {"zen": "Keep it simple.", "hook_id": 1}, event="ping")
    assert answer.status_code == 200 and answer.json()["status"] == "ignored"
    row = Delivery.objects.get(pk=answer.json()["delivery"])
    assert (row.state, row.reason, row.event) == ("ignored", "ping", "ping")
