"""The outbox's delivery, with the clock driven by the test (no sleep): retries with
backoff on 5xx, 429 (its `Retry-After`) and a hanging forge, a permanent refusal recorded
and shown on the mission until a later success, a forge down for a minute answered once,
a row claimed by a worker that died sent again by the sweep after its lease, and the
token sent only where the deployment lets it go."""

from __future__ import annotations

import logging
from datetime import timedelta
from email.utils import format_datetime

import pytest
from django.utils import timezone

from forges.models import Forge, Outbox, OutboxKind, OutboxState
from forges.services.delivery import claim, deliver, due, outbox_sweep, retry_delay
from validation.services.recovery import recover

pytestmark = pytest.mark.django_db

SHA = "a" * 40
TOKEN = "forge-token-value-0123456789"


@pytest.fixture(autouse=True)
def _backoff(settings):
    settings.FUSION_FORGE_RETRY_BASE = 4.0
    settings.FUSION_FORGE_RETRY_MAX = 60.0
    settings.FUSION_FORGE_LEASE_SECONDS = 60
    settings.FUSION_FORGE_TIMEOUT = 0.5


def status_row(forge: Forge, state: str = "success") -> Outbox:
    payload = {
        "sha": SHA,
        "state": state,
        "description": "2/2 assertions passed",
        "target_url": "http://fusion.example/runs/1/",
        "context": forge.context,
        "run": 1,
        "run_status": "passed",
    }
    return Outbox.objects.create(
        forge=forge,
        kind=OutboxKind.STATUS,
        key=f"status:{SHA}:{state}",
        payload=payload,
        next_attempt_at=timezone.now() - timedelta(seconds=5),
    )


def test_a_server_error_is_retried_after_a_backoff_with_jitter(forge_mission, fake_forge):
    row = status_row(forge_mission())
    fake_forge.fail_next(1, status=502)
    t0 = timezone.now()
    assert deliver(outbox_id=row.pk, now=t0) == "retry"
    row.refresh_from_db()
    wait = (row.next_attempt_at - t0).total_seconds()
    assert 2.0 <= wait <= 4.0  # the first delay: between half and all of the base
    assert (row.state, row.attempts, row.last_status) == (OutboxState.PENDING, 1, 502)
    assert row.claim_token == "" and row.lease_until is None
    assert deliver(outbox_id=row.pk, now=t0 + timedelta(seconds=1)) == "skipped"  # not due yet
    assert due(now=t0 + timedelta(seconds=1)) == []
    assert due(now=row.next_attempt_at) == [row.pk]
    assert deliver(outbox_id=row.pk, now=row.next_attempt_at) == "delivered"
    row.refresh_from_db()
    assert (row.state, row.attempts, row.delivered_version, row.last_error) == (OutboxState.DELIVERED, 2, 1, "")
    assert len(fake_forge.requests_to("POST")) == 2 and len(fake_forge.statuses_of(SHA)) == 1


def test_the_backoff_doubles_up_to_its_cap():
    now = timezone.now()
    for attempts, ceiling in ((1, 4), (2, 8), (3, 16), (4, 32), (5, 60), (40, 60)):
        delays = [retry_delay(attempts=attempts, now=now) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempts, min(delays), max(delays))
        assert len(set(delays)) > 1  # jitter: two senders that failed together do not retry together


@pytest.mark.parametrize("header", ["120", "date"])
def test_a_429_waits_as_long_as_retry_after_asks(forge_mission, fake_forge, header):
    row = status_row(forge_mission())
    t0 = timezone.now().replace(microsecond=0)
    value = header if header != "date" else format_datetime(t0 + timedelta(seconds=120), usegmt=True)
    fake_forge.fail_next(1, status=429, headers={"Retry-After": value})
    assert deliver(outbox_id=row.pk, now=t0) == "retry"
    row.refresh_from_db()
    assert row.next_attempt_at == t0 + timedelta(seconds=120)
    assert row.last_status == 429


def test_retry_after_is_capped(settings, forge_mission, fake_forge):
    settings.FUSION_FORGE_RETRY_AFTER_MAX = 300
    row = status_row(forge_mission())
    fake_forge.fail_next(1, status=503, headers={"Retry-After": "86400"})
    t0 = timezone.now()
    deliver(outbox_id=row.pk, now=t0)
    row.refresh_from_db()
    assert row.next_attempt_at == t0 + timedelta(seconds=300)


def test_a_forge_that_does_not_answer_is_retried(forge_mission, fake_forge):
    row = status_row(forge_mission())
    fake_forge.hang_next(1)
    t0 = timezone.now()
    assert deliver(outbox_id=row.pk, now=t0) == "retry"
    row.refresh_from_db()
    assert row.last_status is None and row.last_error.startswith("timeout")
    assert deliver(outbox_id=row.pk, now=row.next_attempt_at) == "delivered"
    assert len(fake_forge.statuses_of(SHA)) == 1


@pytest.mark.parametrize("status", [401, 403, 404, 422])
def test_a_permanent_refusal_is_recorded_and_shown_on_the_mission_until_a_success(
    forge_mission, fake_forge, status, client, alice
):
    forge = forge_mission()
    row = status_row(forge)
    fake_forge.fail_next(1, status=status, body={"message": "Bad credentials"})
    assert deliver(outbox_id=row.pk) == "refused"
    row.refresh_from_db()
    forge.refresh_from_db()
    assert row.state == OutboxState.REFUSED and row.last_status == status
    assert f"HTTP {status}" in row.last_error and "Bad credentials" in row.last_error
    assert forge.refusal == f"status success of {SHA[:12]}: {row.last_error}"
    assert deliver(outbox_id=row.pk) == "skipped"  # refused: never sent again by itself
    client.force_login(alice)
    page = client.get(f"/missions/{forge.mission_id}/").content.decode()
    assert "Bad credentials" in page and f"HTTP {status}" in page

    later = status_row(forge, "failure")
    assert deliver(outbox_id=later.pk) == "delivered"
    forge.refresh_from_db()
    assert forge.refusal == ""
    assert "Bad credentials" not in client.get(f"/missions/{forge.mission_id}/").content.decode()


def test_a_forge_down_for_a_minute_gets_the_status_once_it_is_back(forge_mission, fake_forge):
    row = status_row(forge_mission())
    fake_forge.fail_next(1000, status=503)
    t0 = timezone.now()
    t, outcomes = t0, []
    while t < t0 + timedelta(minutes=5) and "delivered" not in outcomes:
        if t >= t0 + timedelta(minutes=1):
            fake_forge.failures.clear()  # the forge is back
        outcomes += [deliver(outbox_id=pk, now=t) for pk in due(now=t)]
        t += timedelta(seconds=1)
    assert outcomes[-1] == "delivered" and outcomes.count("delivered") == 1
    assert set(outcomes[:-1]) == {"retry"} and 3 <= len(outcomes) - 1 <= 8  # backed off, not hammered
    assert len(fake_forge.statuses_of(SHA)) == 1
    row.refresh_from_db()
    assert row.state == OutboxState.DELIVERED and t - t0 < timedelta(minutes=3)


def test_a_row_claimed_by_a_worker_that_died_is_sent_again_after_its_lease(forge_mission, fake_forge):
    row = status_row(forge_mission())
    t0 = timezone.now()
    assert claim(outbox_id=row.pk, now=t0)  # the worker took it, then was killed
    assert deliver(outbox_id=row.pk, now=t0 + timedelta(seconds=30)) == "skipped"
    assert due(now=t0 + timedelta(seconds=30)) == []
    later = t0 + timedelta(seconds=61)
    assert due(now=later) == [row.pk]
    assert deliver(outbox_id=row.pk, now=later) == "delivered"
    assert len(fake_forge.statuses_of(SHA)) == 1


@pytest.mark.django_db(transaction=True)
def test_the_recovery_sweep_sends_a_killed_workers_row(worker, forge_mission, fake_forge):
    row = status_row(forge_mission())
    Outbox.objects.filter(pk=row.pk).update(
        claim_token="dead-worker", lease_until=timezone.now() - timedelta(seconds=1), attempts=1
    )
    report = recover()
    assert report["forge_outbox_sent"] == [row.pk]
    worker.drain()
    row.refresh_from_db()
    assert row.state == OutboxState.DELIVERED and row.attempts == 2
    assert len(fake_forge.statuses_of(SHA)) == 1
    assert outbox_sweep() == []


def test_the_token_goes_only_where_the_deployment_lets_it(settings, monkeypatch, forge_mission, fake_forge, caplog):
    monkeypatch.setenv("FORGE_TOKEN", TOKEN)
    forge = forge_mission(token_env="FORGE_TOKEN")
    fake_forge.require_token("github", TOKEN)
    settings.FUSION_GIT_CREDENTIALS = {"FORGE_TOKEN": ["https://api.github.com/"]}
    refused = status_row(forge)
    with caplog.at_level(logging.DEBUG):
        assert deliver(outbox_id=refused.pk) == "refused"
    [request] = fake_forge.requests
    assert "authorization" not in request.headers
    refused.refresh_from_db()
    assert "FUSION_GIT_CREDENTIALS does not let FORGE_TOKEN go to" in refused.last_error

    settings.FUSION_GIT_CREDENTIALS = {"FORGE_TOKEN": [fake_forge.base_url + "/github/"]}
    allowed = status_row(forge, "failure")
    with caplog.at_level(logging.DEBUG):
        assert deliver(outbox_id=allowed.pk) == "delivered"
    assert fake_forge.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in caplog.text
    assert not Outbox.objects.filter(last_error__contains=TOKEN).exists()
    assert TOKEN not in Forge.objects.get(pk=forge.pk).refusal


@pytest.mark.parametrize(
    ("provider", "path", "header", "state"),
    [
        ("gitlab", f"/projects/acme%2Fshop/statuses/{SHA}", ("private-token", TOKEN), "success"),
        ("gitea", f"/repos/acme/shop/statuses/{SHA}", ("authorization", f"token {TOKEN}"), "success"),
        ("github", f"/repos/acme/shop/statuses/{SHA}", ("authorization", f"Bearer {TOKEN}"), "success"),
    ],
)
def test_each_provider_gets_its_own_request(
    settings, monkeypatch, forge_mission, fake_forge, provider, path, header, state
):
    monkeypatch.setenv("FORGE_TOKEN", TOKEN)
    settings.FUSION_GIT_CREDENTIALS = {"FORGE_TOKEN": [fake_forge.base_url + "/"]}
    forge = forge_mission(provider=provider, token_env="FORGE_TOKEN")
    fake_forge.require_token(provider, TOKEN)
    assert deliver(outbox_id=status_row(forge).pk) == "delivered"
    [request] = fake_forge.requests
    assert (request.method, request.path, request.headers[header[0]]) == ("POST", path, header[1])
    [status] = fake_forge.statuses_of(SHA)
    assert status["state"] == state and status["description"] == "2/2 assertions passed"
    if provider == "gitlab":
        assert request.json["name"] == "fusion-missions" and "context" not in request.json
    else:
        assert request.json["context"] == "fusion-missions"
