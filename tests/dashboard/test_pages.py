"""The dashboard's server-rendered pages and fragments, through Django's test client:
sign-in, membership (404 otherwise), what each page shows, constant query counts."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from missions.models import MissionFeature
from missions.outbox import publish_on_commit
from validation.views.common import FRAGMENT_HEADER

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def badge(html: str, element_id: str) -> tuple[str, str]:
    """(colour class, data-state) of the badge with this id."""
    found = re.search(rf'<span class="badge badge--([\w-]+)" data-state="([\w-]*)" id="{re.escape(element_id)}">', html)
    assert found, f"no badge #{element_id}"
    return found.group(1), found.group(2)


def pages(m) -> list[str]:
    return [f"/missions/{m.mission.pk}/", f"/features/{m.total.pk}/", f"/runs/{m.failed.pk}/"]


def parts(m) -> list[str]:
    mission, feature, run = m.mission.pk, m.total.pk, m.failed.pk
    return (
        [f"/missions/{mission}/_/{p}/" for p in ("header", "tree", "assertions", "feed")]
        + [f"/missions/{mission}/_/milestone/{m.milestone.pk}/"]
        + [f"/features/{feature}/_/{p}/" for p in ("header", "assertions", "runs", "lineage", "tasks", "reviews")]
        + [f"/runs/{run}/_/{p}/" for p in ("summary", "verdict", "journal")]
    )


def test_signing_in_is_required_and_the_login_page_signs_in(alice):
    client = Client()
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == "/login/?next=/"
    page = client.get("/login/")
    assert page.status_code == 200 and b'<label for="id_username">' in page.content
    bad = client.post("/login/", {"username": "alice", "password": "wrong", "next": "/"})
    assert bad.status_code == 200 and b"did not match" in bad.content
    good = client.post("/login/", {"username": "alice", "password": "pw-alice-123", "next": "/"})
    assert good.status_code == 302 and good["Location"] == "/"
    assert client.get("/").status_code == 200


def test_every_page_and_fragment_needs_a_signed_in_user(small_mission):
    for url in pages(small_mission) + parts(small_mission):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url


def test_a_non_member_gets_404_for_every_page_and_fragment(small_mission, bob):
    client = client_for(bob)
    for url in pages(small_mission) + parts(small_mission):
        assert client.get(url).status_code == 404, url
    listing = client.get("/")
    assert listing.status_code == 200 and b"Shop" not in listing.content


def test_members_and_staff_see_every_page_and_fragment(small_mission, bob, staff):
    small_mission.mission.members.add(bob)
    for user in (bob, staff):
        client = client_for(user)
        for url in pages(small_mission):
            assert client.get(url).status_code == 200, url
        for url in parts(small_mission):
            response = client.get(url)
            assert response.status_code == 200 and response[FRAGMENT_HEADER] == "1", url
            assert "no-store" in response["Cache-Control"]


def test_the_missions_list_shows_status_progress_blocked_and_last_activity(small_mission, alice):
    MissionFeature.objects.filter(pk=small_mission.idle.pk).update(loop_state="blocked")
    mission = small_mission.mission
    publish_on_commit(mission, "mission:updated", {"mission": mission.pk, "status": mission.status, "changed": []})
    html = client_for(alice).get("/").content.decode()
    row = re.search(rf'<tr data-mission="{small_mission.mission.pk}">(.*?)</tr>', html, re.S).group(1)
    assert "Shop" in row and 'data-state="active"' in row
    assert "1 / 3 passed" in row  # the fix passed; the root needs a fix; the idle feature is blocked
    assert "1 blocked" in row
    assert "mission:updated" in row and "just now" in row


def test_the_mission_page_shows_the_tree_rollups_assertions_and_feed(small_mission, alice):
    html = client_for(alice).get(f"/missions/{small_mission.mission.pk}/").content.decode()
    # tree with loop-state badges (colour class and words), attempts and budget of the lineage root
    assert badge(html, "feature-cart-total-state") == ("needs_fix", "needs_fix")
    assert badge(html, "feature-cart-total-fix-1-state") == ("passed", "passed")
    assert "needs fix</span>" in html
    assert "budget 2/3 left" in html  # the fix is charged to its root
    assert badge(html, "milestone-cart-rollup") == ("failed", "failed") and "rollup failed</span>" in html
    assert "1 / 1 linked" in html
    # assertions panel: statement, check, status, linked features
    assert "total == 8" in html and "run: python -m unittest tests.test_cart" in html
    assert 'class="chip chip--needs_fix">cart-total' in html
    # the live stream and the event id the page was rendered at
    assert f'data-live-stream="/events/missions/{small_mission.mission.pk}/"' in html
    assert f'data-live-last-id="mission-{small_mission.mission.pk}:' in html
    # controls call the API
    assert f'action="/api/missions/{small_mission.mission.pk}/pause/"' in html
    assert f'action="/api/missions/{small_mission.mission.pk}/autopilot/"' in html


def test_the_rounds_chart_is_an_accessible_inline_svg(small_mission, alice):
    html = (
        client_for(alice)
        .get(f"/missions/{small_mission.mission.pk}/_/milestone/{small_mission.milestone.pk}/")
        .content.decode()
    )
    svg = re.search(r"<svg class=\"rounds\".*?</svg>", html, re.S).group(0)
    assert 'role="img"' in svg and "Validation rounds of Cart: 2 rounds, 1 passed, 1 failed" in svg
    assert svg.count('class="seg-pass"') == 1 and svg.count('class="seg-fail"') == 1
    assert f'href="/runs/{small_mission.failed.pk}/"' in svg
    assert "0 passed, 1 failed, 0 blocked" in svg  # each bar's title says it in words


def test_the_feature_page_shows_runs_failures_lineage_task_and_buttons(small_mission, alice):
    f = small_mission.total
    html = client_for(alice).get(f"/features/{f.pk}/").content.decode()
    for action in ("validate", "repair", "create_fix"):
        assert f'action="/api/features/{f.pk}/{action}/"' in html
    assert 'name="mode" value="clear"' in html and 'name="mode" value="re_run"' in html
    assert 'data-button="review"' in html
    # run history: status, trigger, attempts, duration, tokens, summary, failures with expected/actual/evidence
    assert f"Run #{small_mission.failed.pk}" in html and "150 tokens" in html and "implementation 1" in html
    assert "<pre>8</pre>" in html and "<pre>7</pre>" in html and "AssertionError: 7 != 8" in html
    # lineage as a chain, with the budget
    assert "cart-total-fix-1" in html and "fix round 1" in html and "1 of 3 fix rounds used" in html
    # the task and its log, escaped
    assert "line 2 &lt;b&gt;not html&lt;/b&gt;" in html


def test_the_run_page_shows_verdicts_failures_and_a_verified_journal(small_mission, alice):
    html = client_for(alice).get(f"/runs/{small_mission.failed.pk}/").content.decode()
    assert 'id="verdict-VAL-CART-001"' in html and "wrong total" in html
    assert "Hash chain verified: 2 entries." in html
    assert html.count('class="timeline-item') == 2 and "decision" in html
    replay = re.search(r'<form[^>]*>[^<]*(<input[^>]*>)?<button[^>]*data-button="replay"[^>]*>', html).group(0)
    assert f'action="/api/validation-runs/{small_mission.failed.pk}/replay/"' in replay and "disabled" not in replay


def test_a_broken_journal_chain_is_reported(small_mission, alice):
    from validation.models import JournalEntry

    JournalEntry.objects.filter(run=small_mission.failed, seq=1).update(payload={"exit": 0})
    html = client_for(alice).get(f"/runs/{small_mission.failed.pk}/_/journal/").content.decode()
    assert "Hash chain broken at entry 1" in html


def _review(mission, feature, alice, state: str, report: str | None, *, tamper: bool = False):
    from validation.models import Review, ReviewArtifact

    review = Review.objects.create(
        mission=mission, feature=feature, state=state, created_by=alice, request={"objective": "Check the cart"}
    )
    if report is not None:
        data = report.encode()
        ReviewArtifact.objects.create(
            review=review,
            kind="report",
            name="report.md",
            content=report + (" " if tamper else ""),
            byte_length=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
    return review


def test_the_review_page_shows_progress_then_the_verified_report(small_mission, alice, bob):
    running = _review(small_mission.mission, small_mission.total, alice, "evaluating", None)
    html = client_for(alice).get(f"/reviews/{running.pk}/").content.decode()
    assert 'aria-current="step">evaluating' in html and "appears here once the review completes" in html
    done = _review(
        small_mission.mission,
        small_mission.total,
        alice,
        "completed",
        "# Validation report\n\n## Findings\n\n- one <script>alert(1)</script>\n",
    )
    html = client_for(alice).get(f"/reviews/{done.pk}/").content.decode()
    assert "<h1>Validation report</h1>" in html and "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;" in html and "Verified:" in html
    tampered = _review(small_mission.mission, small_mission.total, alice, "completed", "# Report\n", tamper=True)
    html = client_for(alice).get(f"/reviews/{tampered.pk}/").content.decode()
    assert "does not match its recorded length and hash" in html and "<h1>Report</h1>" not in html
    assert client_for(bob).get(f"/reviews/{done.pk}/").status_code == 404
    listing = client_for(alice).get(f"/features/{small_mission.total.pk}/_/reviews/").content.decode()
    assert f"Review #{done.pk}" in listing


def test_the_tree_fragment_takes_the_same_number_of_queries_whatever_the_size(small_mission, alice):
    client = client_for(alice)
    url = f"/missions/{small_mission.mission.pk}/_/tree/"
    client.get(url)
    with CaptureQueriesContext(connection) as small:
        client.get(url)
    for i in range(15):
        f = MissionFeature(slice=small_mission.slice, key=f"extra-{i}", title=f"Extra {i}", order=10 + i)
        f.save()
        f.assertions.add(small_mission.assertion)
    with CaptureQueriesContext(connection) as large:
        response = client.get(url)
    assert response.content.decode().count('class="feature') >= 18
    assert len(large) == len(small), [q["sql"] for q in large.captured_queries]


def test_static_files_are_served_without_debug(client):
    for path in ("/static/dashboard/dashboard.css", "/static/dashboard/live.js"):
        response = client.get(path)
        assert response.status_code == 200 and response.content
        again = client.get(path, HTTP_IF_MODIFIED_SINCE=response["Last-Modified"])
        assert again.status_code == 304
    assert client.get("/static/../settings.py").status_code == 404
    assert client.get("/static/dashboard/nope.css").status_code == 404
