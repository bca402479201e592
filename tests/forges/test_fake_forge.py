"""The local forge answers as the three forges' APIs do (the shapes other tests rely on),
and the HTTP client reads a bounded answer."""

from __future__ import annotations

import httpx2
import pytest

from forges.providers.base import ForgeRequest
from forges.providers.http import send


@pytest.mark.parametrize(
    ("provider", "path", "head_of"),
    [
        ("github", "/repos/acme/shop/pulls/7", lambda body: (body["head"]["sha"], body["head"]["ref"])),
        ("gitea", "/repos/acme/shop/pulls/7", lambda body: (body["head"]["sha"], body["head"]["ref"])),
        ("gitlab", "/projects/acme%2Fshop/merge_requests/7", lambda body: (body["sha"], body["source_branch"])),
    ],
)
def test_a_pull_request_is_looked_up_as_each_forge_answers(fake_forge, provider, path, head_of):
    fake_forge.add_pull(provider, "acme/shop", 7, head="c" * 40, branch="hello", title="[hello] say hello")
    answer = httpx2.get(fake_forge.api_url(provider) + path)
    assert answer.status_code == 200
    body = answer.json()
    assert head_of(body) == ("c" * 40, "hello") and body["title"] == "[hello] say hello"
    assert httpx2.get(fake_forge.api_url(provider) + path.replace("/7", "/8")).status_code == 404
    [request] = fake_forge.requests_to("GET", path)
    assert request.provider == provider


def test_a_failure_on_demand_is_answered_once_then_the_forge_is_itself(fake_forge):
    url = fake_forge.api_url("github") + "/repos/acme/shop/statuses/" + "d" * 40
    fake_forge.fail_next(1, status=429, headers={"Retry-After": "7"})
    refused = httpx2.post(url, json={"state": "success", "context": "ci"})
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "7"
    created = httpx2.post(url, json={"state": "success", "context": "ci"})
    assert created.status_code == 201 and created.json()["id"] and created.json()["state"] == "success"
    assert httpx2.post(url, json={"state": "done"}).status_code == 422  # not a GitHub state
    assert [s["state"] for s in fake_forge.statuses_of("d" * 40)] == ["success"]


def test_a_large_answer_is_cut_where_the_setting_says(settings, fake_forge):
    settings.FUSION_FORGE_MAX_RESPONSE_BYTES = 1000
    fake_forge.fail_next(1, status=503, body={"message": "x" * 100_000})
    url = fake_forge.api_url("github") + "/repos/acme/shop/statuses/" + "e" * 40
    answer = send(ForgeRequest("POST", url, {"state": "success"}), auth={})
    assert answer.status == 503 and answer.body is None  # a cut JSON body is not read as JSON
    assert len(answer.excerpt) <= 500


def test_a_forge_nobody_listens_on_is_a_network_error(fake_forge):
    fake_forge.stop()
    answer = send(ForgeRequest("POST", fake_forge.api_url("github") + "/repos/a/b/statuses/" + "f" * 40, {}), auth={})
    assert answer.status is None and answer.error.startswith("network error: ConnectError")
