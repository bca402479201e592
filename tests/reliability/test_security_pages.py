"""The security matrix of the pages and streams: every dashboard page, every admin page,
the SSE streams and the WebSocket, for an anonymous user, a member, a stranger and staff
(what each role gets: test_security_api.py).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from tests.reliability.conftest import ROLES, mission_rows, token_of, user_of

pytestmark = pytest.mark.django_db

# ================================================================= dashboard pages


def dashboard_urls(w) -> list[str]:
    """Every page of the dashboard (from its URL patterns) with the world's objects, and
    every part (fragment) a page has."""
    from validation.views import pages, runs

    urls = [
        "/",
        "/_/missions/",
        f"/missions/{w.mission.pk}/",
        f"/features/{w.f1.pk}/",
        f"/runs/{w.r1.pk}/",
        f"/reviews/{w.review.pk}/",
        f"/reviews/{w.review.pk}/_/review/",
    ]
    urls += [f"/missions/{w.mission.pk}/_/{part}/" for part in pages.MISSION_PARTS if part != "milestone"]
    urls += [f"/missions/{w.mission.pk}/_/milestone/{w.m1.pk}/"]
    urls += [f"/features/{w.f1.pk}/_/{part}/" for part in pages.FEATURE_PARTS]
    urls += [f"/runs/{w.r1.pk}/_/{part}/" for part in runs.RUN_PARTS]
    return urls


def test_the_dashboard_table_covers_every_dashboard_pattern(world):
    import validation.urls

    names = {p.name for p in validation.urls.urlpatterns} - {"login", "logout", "static-file"}
    from django.urls import resolve

    covered = {resolve(u.split("?")[0]).url_name for u in dashboard_urls(world)}
    assert names <= covered, f"dashboard pages without a row: {sorted(names - covered)}"


PUBLIC_DASHBOARD = {"/", "/_/missions/"}  # lists: every signed-in user sees their own rows


@pytest.mark.parametrize("role", ROLES)
def test_dashboard_matrix(role, users, world):
    client = Client()
    user = user_of(users, role)
    if user is not None:
        client.force_login(user)
    before = mission_rows(world.mission.pk)
    for url in dashboard_urls(world):
        response = client.get(url)
        if role == "anonymous":
            assert response.status_code == 302 and "/login/" in response["Location"], url
        elif role == "stranger" and url not in PUBLIC_DASHBOARD:
            assert response.status_code == 404, url
        else:
            assert response.status_code == 200, (url, response.status_code)
            if role == "stranger":
                assert world.mission.title.encode() not in response.content, url
    assert mission_rows(world.mission.pk) == before


# ====================================================================== admin pages


def admin_urls(w) -> list[tuple[str, str]]:
    """(url, kind) for the admin index, every app index and, for every registered model,
    its changelist, add page and the change, history and delete pages of one object."""
    urls = [(reverse("admin:index"), "index")]
    apps = set()
    for model in admin.site._registry:
        opts = model._meta
        apps.add(opts.app_label)
        base = f"admin:{opts.app_label}_{opts.model_name}"
        urls.append((reverse(f"{base}_changelist"), "changelist"))
        urls.append((reverse(f"{base}_add"), "add"))
        obj = model._default_manager.order_by("pk").first()
        if obj is not None:
            for page in ("change", "history", "delete"):
                urls.append((reverse(f"{base}_{page}", args=[obj.pk]), page))
    urls += [(reverse("admin:app_list", args=[label]), "app") for label in sorted(apps)]
    return urls


@pytest.mark.parametrize("role", ROLES)
def test_admin_matrix(role, users, world):
    from tests.review.support import request_body  # noqa: F401 — the world has a review with artifacts

    client = Client()
    user = user_of(users, role)
    if user is not None:
        client.force_login(user)
    before = mission_rows(world.mission.pk)
    urls = admin_urls(world)
    assert len(urls) > 40
    for url, kind in urls:
        response = client.get(url)
        if role != "staff":
            # members and strangers are not staff: the admin is not theirs at all
            assert response.status_code == 302 and "/admin/login/" in response["Location"], (url, response.status_code)
            continue
        # staff (here a superuser) reach every page; view-only records refuse add/delete with 403
        assert response.status_code in (200, 403), (url, response.status_code)
        if response.status_code == 403:
            assert kind in ("add", "delete", "change"), url
    assert mission_rows(world.mission.pk) == before


# =================================================================== SSE and WebSocket


def _asgi_get(path: str, token: str | None, *, wait: float = 15.0) -> tuple[int, bytes]:
    """GET `path` from the ASGI application and read until the first body chunk that has
    data (a stream never ends: disconnect after it)."""
    from fusion_site.asgi import application

    headers = [(b"host", b"testserver"), (b"accept", b"text/event-stream")]
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 12345),
        "server": ("testserver", 80),
    }

    async def run():
        inbox: asyncio.Queue = asyncio.Queue()
        await inbox.put({"type": "http.request", "body": b"", "more_body": False})
        done = asyncio.Event()
        status, body = 0, b""

        async def receive():
            if not inbox.empty():
                return await inbox.get()
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            nonlocal status, body
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body += message.get("body", b"")
                if body.strip() or not message.get("more_body", False):
                    done.set()

        task = asyncio.ensure_future(application(scope, receive, send))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=wait)
        done.set()
        try:
            await asyncio.wait_for(task, timeout=5)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
        return status, body

    return asyncio.run(run())


def _sse_forbidden(body: bytes) -> bool:
    return b"stream-error" in body and b"forbidden" in body


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", ROLES)
def test_sse_matrix(role, users, git_repo):
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"}, "hello")
    from tests.reliability.conftest import build_world

    w = build_world(users, git_repo)
    user = user_of(users, role)
    token = token_of(user) if user else None
    status, body = _asgi_get(f"/events/missions/{w.mission.pk}/", token)
    if role in ("anonymous", "stranger"):
        assert _sse_forbidden(body), body[:300]
    else:
        assert status == 200 and not _sse_forbidden(body), body[:300]
        assert b"event: stream-open" in body, body[:300]
    status, body = _asgi_get("/events/missions/", token)
    if role == "anonymous":
        assert _sse_forbidden(body), body[:300]
    else:
        assert status == 200 and not _sse_forbidden(body) and b"event: stream-open" in body, body[:300]
    # the stranger's own list feed carries their own mission only, never the member's
    if role == "stranger":
        from missions.streams import user_channels

        assert user_channels(users.stranger) == {f"mission-{w.theirs.pk}"}
    # someone else's mission never appears in the SSE stream of the list for a member
    if role == "member":
        from missions.streams import user_channels

        assert user_channels(users.member) == {f"mission-{w.mission.pk}"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.usefixtures("own_channel_layer", "synthetic_events")  # an event of its own making
def test_websocket_matrix(role, users, git_repo):
    from channels.testing import WebsocketCommunicator

    from fusion_site.asgi import application
    from missions.outbox import publish_on_commit
    from tests.reliability.conftest import build_world

    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"}, "hello")
    w = build_world(users, git_repo)
    user = user_of(users, role)
    query = f"?token={token_of(user)}" if user else ""

    async def session():
        from channels.db import database_sync_to_async

        communicator = WebsocketCommunicator(application, f"/ws/missions/{w.mission.pk}/{query}")
        connected, _sub = await communicator.connect(timeout=10)
        if role in ("anonymous", "stranger"):
            message = await communicator.receive_output(timeout=5)
            return connected, message
        await database_sync_to_async(publish_on_commit)(
            w.mission.pk, "mission:updated", {"mission": w.mission.pk, "change": "ws-matrix"}
        )
        message = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return connected, message

    connected, message = asyncio.run(session())
    if role in ("anonymous", "stranger"):
        assert message["type"] == "websocket.close" and message["code"] == 4403, message
    else:
        assert connected
        assert message["event"] == "mission:updated" and message["data"]["change"] == "ws-matrix", message
