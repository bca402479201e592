"""The dashboard in a real browser: Playwright driving Debian's chromium against the real
ASGI server (see conftest.py). Pages must change live, from the event stream, without a
reload; a marker set on `window` at the start proves the page was never reloaded.

Playwright's synchronous API keeps an asyncio loop running in this thread, which Django
takes for an async context and refuses ORM calls from: DJANGO_ALLOW_ASYNC_UNSAFE is set
for the duration of this module only (the test thread is not an event loop thread).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import dramatiq
import pytest

from tests.dashboard.conftest import api, commit_change, off_thread

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def browser():
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    manager = playwright_api.sync_playwright().start()
    chromium = manager.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    try:
        yield chromium
    finally:
        chromium.close()
        manager.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class Session:
    """One signed-in browser context; collects script errors so that a test can assert none."""

    def __init__(self, browser, server, user, viewport=(1360, 900)):
        self.server = server
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        self.context.set_default_timeout(10_000)
        self.errors: list[str] = []
        self.page = self.new_page()
        self.page.goto(server.url + "/login/")
        self.page.fill("#id_username", user.username)
        self.page.fill("#id_password", user.password_text)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(server.url + "/")

    def new_page(self):
        page = self.context.new_page()
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text}"))
        return page

    def open(self, path: str, page=None):
        page = page or self.page
        response = page.goto(self.server.url + path)
        return response

    def live(self, page=None):
        page = page or self.page
        expect(page.locator("body")).to_have_attribute("data-live-state", "connected")
        page.evaluate("window.__sameDocument = 'not reloaded'")

    def not_reloaded(self, page=None) -> bool:
        return (page or self.page).evaluate("window.__sameDocument") == "not reloaded"

    def close(self):
        self.context.close()


@pytest.fixture
def session(browser, asgi_server):
    opened: list[Session] = []

    def open_(user, **kwargs) -> Session:
        s = Session(browser, asgi_server, user, **kwargs)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


def badge(page, element_id: str):
    return page.locator(f"#{element_id}")


def test_completing_a_task_through_the_api_turns_the_badge_validating_then_passed(
    held_demo, alice, session, asgi_server
):
    s = session(alice)
    s.open(f"/missions/{held_demo.mission.pk}/")
    s.live()
    state = badge(s.page, "feature-cart-count-state")
    expect(state).to_have_attribute("data-state", "implementing")

    revision = commit_change(held_demo.mission.repository, "cart-count")
    status, body = api(
        asgi_server,
        "POST",
        f"/api/tasks/{held_demo.tasks['cart-count'].pk}/complete/",
        token=alice.token,
        body={"revision": revision, "summary": "item_count written"},
    )
    assert status == 200, body

    held_demo.stepper.until("process_task_outcome")  # admission: the run starts
    expect(state).to_have_attribute("data-state", "validating", timeout=5000)
    expect(state).to_contain_text("validating")

    held_demo.stepper.until("run_validator")  # the checks run and pass
    judged = time.monotonic()
    expect(state).to_have_attribute("data-state", "passed", timeout=5000)
    latency = time.monotonic() - judged
    expect(state).to_contain_text("passed")
    assert latency < 1.5, f"the badge changed {latency:.2f} s after the verdict"

    feed = s.page.locator("[data-live-region=feed]")
    expect(feed).to_contain_text("validator-run:completed")
    expect(feed).to_contain_text("cart-count: validating → passed")
    assert s.not_reloaded()
    assert s.errors == []


def test_validate_twice_shows_the_conflict_message(held_demo, alice, session, asgi_server):
    revision = commit_change(held_demo.mission.repository, "cart-total")
    status, body = api(
        asgi_server,
        "POST",
        f"/api/tasks/{held_demo.tasks['cart-total'].pk}/complete/",
        token=alice.token,
        body={"revision": revision},
    )
    assert status == 200, body  # its outcome stays queued: nobody steps the broker in this test
    s = session(alice)
    s.open(f"/features/{held_demo.features['cart-total'].pk}/")
    s.live()
    result = s.page.locator("[data-action-result]")

    s.page.click("[data-button=validate]")
    expect(result).to_contain_text("Validate: started")
    expect(result).to_have_attribute("data-kind", "ok")
    expect(badge(s.page, "feature-state")).to_have_attribute("data-state", "validating")  # live, from the API's event

    s.page.click("[data-button=validate]")
    expect(result).to_contain_text("HTTP 409 validation_already_running")
    expect(result).to_contain_text("a validation of this feature is already running")
    expect(result).to_have_attribute("role", "alert")
    expect(result).to_have_attribute("data-kind", "error")
    assert s.not_reloaded()
    assert [e for e in s.errors if "409 (Conflict)" not in e] == []  # the browser logs the refused request


def received_seqs(page) -> list[int]:
    return page.evaluate("window.fusionLive.received.map(e => e.seq)")


def test_a_reconnected_page_replays_the_events_it_missed(held_demo, alice, session, asgi_server):
    mission = held_demo.mission
    s = session(alice)
    s.open(f"/missions/{mission.pk}/")
    s.live()
    expect(badge(s.page, "mission-status")).to_have_attribute("data-state", "active")

    s.page.click("[data-live-toggle]")  # the visible "Pause live updates" button
    expect(s.page.locator("body")).to_have_attribute("data-live-state", "paused")
    before = len(received_seqs(s.page))
    for path, body in (
        (f"/api/missions/{mission.pk}/autopilot/", {"enabled": False}),
        (f"/api/missions/{mission.pk}/pause/", None),
    ):
        status, answer = api(asgi_server, "POST", path, token=alice.token, body=body)
        assert status == 200, answer
    mission.refresh_from_db()
    missed = list(mission.events.filter(seq__gt=mission.event_seq - 2).order_by("seq").values_list("seq", flat=True))
    s.page.wait_for_timeout(300)
    assert len(received_seqs(s.page)) == before  # nothing arrives while disconnected
    expect(badge(s.page, "mission-status")).to_have_attribute("data-state", "active")

    s.page.click("[data-live-toggle]")  # "Resume live updates": reconnects from the last id seen
    s.page.wait_for_function(f"{missed}.every(seq => window.fusionLive.received.some(e => e.seq === seq))")
    expect(badge(s.page, "mission-status")).to_have_attribute("data-state", "paused")
    expect(s.page.locator("#mission-autopilot")).to_have_attribute("data-state", "off")
    assert s.page.evaluate("window.fusionLive.resets") == 0  # replayed, not reset
    assert s.not_reloaded()
    assert s.errors == []


def test_the_page_follows_the_servers_event_catalogue_and_named_mission_changes(held_demo, alice, session):
    """live.js listens to exactly `missions.event_catalogue.EVENT_TYPES`, rendered into the page;
    a named change of the mission (the autopilot halting, then going on) updates the header
    that follows `mission:updated`."""
    from missions.event_catalogue import EVENT_TYPES
    from missions.transitions import mission_transition

    mission = held_demo.mission
    s = session(alice)
    s.open(f"/missions/{mission.pk}/")
    s.live()
    assert s.page.evaluate("window.fusionLive.eventTypes") == list(EVENT_TYPES)
    header = s.page.locator("[data-live-region=header]")
    expect(header).not_to_contain_text("Stopped:")

    reason = "feature cart-total is blocked (operator): repair it to continue"
    off_thread(
        mission_transition,
        mission=mission.pk,
        old="active",
        new="active",
        cause="halt",
        reason=reason,
    )
    expect(header).to_contain_text(f"Stopped: {reason}")
    off_thread(mission_transition, mission=mission.pk, old="active", new="active", cause="continue")
    expect(header).not_to_contain_text("Stopped:")
    assert [e["type"] for e in s.page.evaluate("window.fusionLive.received")][-2:] == [
        "mission:halted",
        "mission:continued",
    ]
    assert s.not_reloaded()
    assert s.errors == []


def test_a_page_whose_last_id_is_too_old_reloads_its_state(held_demo, alice, session, asgi_server):
    from django_eventstream.models import Event as StoredEvent

    mission = held_demo.mission
    s = session(alice)
    s.open(f"/missions/{mission.pk}/")
    s.live()
    s.page.evaluate("window.fusionLive.disconnect()")
    status, answer = api(asgi_server, "POST", f"/api/missions/{mission.pk}/pause/", token=alice.token)
    assert status == 200, answer
    off_thread(StoredEvent.objects.filter(channel=f"mission-{mission.pk}").delete)  # trimmed past the page's id
    s.page.evaluate("window.fusionLive.connect()")
    s.page.wait_for_function("window.fusionLive.resets === 1")
    expect(badge(s.page, "mission-status")).to_have_attribute("data-state", "paused")
    assert s.not_reloaded()
    assert s.errors == []


def test_a_non_member_gets_no_page_and_no_events(held_demo, bob, alice, session, asgi_server):
    mission = held_demo.mission
    s = session(bob)
    assert s.open(f"/missions/{mission.pk}/").status == 404
    assert s.open(f"/features/{held_demo.features['cart-total'].pk}/").status == 404
    s.open("/")
    expect(s.page.locator("#missions")).not_to_contain_text(mission.title)

    answer = s.page.request.get(f"{asgi_server.url}/events/missions/{mission.pk}/")
    assert "event: stream-error" in answer.text() and '"condition": "forbidden"' in answer.text()

    # An EventSource opened by hand on the mission's stream gets the refusal and nothing else.
    s.page.evaluate(
        """url => {
        window.seen = [];
        const source = new EventSource(url);
        source.addEventListener('stream-error', e => { window.seen.push('stream-error:' + JSON.parse(e.data).condition); source.close(); });
        source.addEventListener('mission:updated', e => window.seen.push('event'));
    }""",
        f"/events/missions/{mission.pk}/",
    )
    s.page.wait_for_function("window.seen.length > 0")
    status, answer = api(asgi_server, "POST", f"/api/missions/{mission.pk}/pause/", token=alice.token)
    assert status == 200, answer
    s.page.wait_for_timeout(500)
    assert s.page.evaluate("window.seen") == ["stream-error:forbidden"]


def test_the_demo_runs_itself_live_in_the_browser(tmp_path, alice, session, asgi_server, transactional_db):
    """What `make run` shows a newcomer: the demo mission, watched from its page while a
    real worker runs it — features turn implementing → validating → passed, the failed
    discount produces a fix feature, the rollups move — all without a reload. Screenshots
    of the main pages are kept (in docs/ when FUSION_SCREENSHOTS_DIR says so)."""
    from missions.management.commands.demo import create_demo
    from missions.models import MissionFeature
    from validation.models import ValidatorRun

    broker = dramatiq.get_broker()
    broker.flush_all()
    mission = off_thread(create_demo, directory=tmp_path / "demo-repo", user=alice)
    s = session(alice)
    listing = s.new_page()
    s.open("/", listing)
    s.live(listing)
    s.open(f"/missions/{mission.pk}/")
    s.live()
    seen_states: list[str] = []
    s.page.expose_function("recordState", lambda state: seen_states.append(state))
    s.page.evaluate("""() => document.addEventListener('fusion:updated', () => {
        const b = document.querySelector('#feature-discount-state'); if (b) window.recordState(b.dataset.state); })""")

    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        expect(badge(s.page, "mission-status")).to_have_attribute("data-state", "complete", timeout=180_000)
    finally:
        worker.stop()
        broker.flush_all()

    for key in ("cart-total", "cart-count", "discount", "discount-fix-1", "receipt"):
        expect(badge(s.page, f"feature-{key}-state")).to_have_attribute("data-state", "passed")
    assert {"validating", "needs_fix", "implementing"} & set(seen_states), seen_states
    expect(badge(s.page, "milestone-checkout-rollup")).to_have_attribute("data-state", "passed")
    expect(listing.locator(f'tr[data-mission="{mission.pk}"]')).to_contain_text("5 / 5 passed")
    assert s.not_reloaded() and s.not_reloaded(listing)
    assert s.errors == []

    shots = Path(os.environ.get("FUSION_SCREENSHOTS_DIR") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    discount = MissionFeature.objects.get(mission=mission, key="discount")
    failed_run = ValidatorRun.objects.filter(feature=discount, status="failed").first()
    s.page.set_viewport_size({"width": 1360, "height": 900})
    for name, path in (
        ("missions", "/"),
        ("mission", f"/missions/{mission.pk}/"),
        ("feature", f"/features/{discount.pk}/"),
        ("run", f"/runs/{failed_run.pk}/"),
    ):
        s.open(path)
        s.live()
        s.page.screenshot(path=str(shots / f"dashboard-{name}.png"), full_page=True)
    s.page.set_viewport_size({"width": 390, "height": 844})
    s.open(f"/missions/{mission.pk}/")
    s.page.screenshot(path=str(shots / "dashboard-mission-phone.png"))
    assert all(
        (shots / f"dashboard-{n}.png").stat().st_size > 10_000 for n in ("missions", "mission", "feature", "run")
    )
    shutil.rmtree(tmp_path / "demo-repo", ignore_errors=True)
