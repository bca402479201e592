"""Origins on every live surface: a page on another origin must never use a signed-in
user's session to read live data. Session-signed WebSocket and MCP handshakes from a
foreign Origin are refused; token handshakes without an Origin keep working. Raw
handshakes against a live `serve`, then the attack itself in Chromium: a page on a
sibling subdomain, which gets the session cookie, opens the mission's WebSocket."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from tests.mcp.conftest import api

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
SITE = "fusion.test"
SIBLING = "evil.fusion.test"


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


class RawSocket:
    """A minimal WebSocket client over a socket: the handshake headers are the test's."""

    def __init__(self, port: int, path: str, headers: dict[str, str]):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}"]
        lines += ["Sec-WebSocket-Version: 13", *(f"{k}: {v}" for k, v in headers.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        head, _, self.rest = response.partition(b"\r\n\r\n")
        self.status = int(head.split()[1])

    def _read(self, n: int) -> bytes:
        while len(self.rest) < n:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise EOFError
            self.rest += chunk
        out, self.rest = self.rest[:n], self.rest[n:]
        return out

    def frame(self, timeout: float = 15) -> tuple[int, bytes]:
        self.sock.settimeout(timeout)
        first, second = self._read(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack(">H", self._read(2))[0]
        elif length == 127:
            length = struct.unpack(">Q", self._read(8))[0]
        return first & 0x0F, self._read(length)

    def close_code(self) -> int | None:
        """The close code of the first close frame (text frames before it are skipped)."""
        while True:
            opcode, payload = self.frame()
            if opcode == 8:
                return struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None

    def close(self) -> None:
        self.sock.close()


def _mcp_post(server, path: str, headers: dict[str, str]) -> int:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_raw_handshakes(serve, alice, shop):
    server = serve()
    cookie = session_cookie(alice)
    path = f"/ws/missions/{shop.mission.pk}/"
    own = f"http://127.0.0.1:{server.port}"
    host = f"127.0.0.1:{server.port}"

    foreign = RawSocket(server.port, path, {"Host": host, "Origin": "https://evil.example", "Cookie": cookie})
    assert foreign.status == 101 and foreign.close_code() == 4403
    foreign.close()

    for n, headers in enumerate(
        (
            {"Host": host, "Origin": own, "Cookie": cookie},  # the site's own page
            {"Host": host, "Authorization": f"Token {alice.token}"},  # a program: a token, no Origin
            {"Host": host, "Origin": "https://evil.example", "Authorization": f"Token {alice.token}"},
        ),
    ):
        ws = RawSocket(server.port, path, headers)
        assert ws.status == 101
        status, _ = api(
            server, "PATCH", f"/api/missions/{shop.mission.pk}/", token=alice.token, body={"title": f"Shop {n}"}
        )
        assert status == 200
        opcode, payload = ws.frame()
        assert opcode == 1 and json.loads(payload)["event"] == "mission:updated", headers
        ws.close()

    # MCP: the same rule for the session; tokens are unaffected.
    mcp = "/mcp/missions/shop/"
    assert _mcp_post(server, mcp, {"Cookie": cookie, "Origin": "https://evil.example"}) == 403
    assert _mcp_post(server, mcp, {"Cookie": cookie, "Origin": f"http://{SIBLING}:{server.port}"}) == 403
    assert _mcp_post(server, mcp, {"Cookie": cookie, "Origin": own}) == 200
    assert _mcp_post(server, mcp, {"Cookie": cookie}) == 200
    assert _mcp_post(server, mcp, {"Authorization": f"Bearer {alice.token}"}) == 200
    assert _mcp_post(server, mcp, {"Authorization": f"Bearer {alice.token}", "Origin": "https://evil.example"}) == 200


class SiblingPage(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the handler's protocol
        body = b"<!doctype html><html><body>a page on a sibling subdomain</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


OPEN_SOCKET = """
async ([url]) => await new Promise((resolve) => {
  const seen = [];
  const ws = new WebSocket(url);
  ws.onmessage = (e) => { seen.push(JSON.parse(e.data).event); };
  ws.onclose = (e) => resolve({closed: e.code, seen});
  setTimeout(() => { ws.close(); resolve({closed: null, seen}); }, 8000);
  window.__trigger = () => {};
})
"""


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")
def test_a_sibling_subdomain_page_cannot_read_the_stream_in_a_browser(serve, alice, shop):
    playwright_api = pytest.importorskip("playwright.sync_api")
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    # The server checks passwords with the project's hashers (the tests' fast one is not among them).
    hashed = PBKDF2PasswordHasher().encode(alice.password_text, PBKDF2PasswordHasher().salt())
    type(alice).objects.filter(pk=alice.pk).update(password=hashed)
    server = serve(ALLOWED_HOSTS=f"{SITE},127.0.0.1,localhost")
    site = f"http://{SITE}:{server.port}"
    ws_url = f"ws://{SITE}:{server.port}/ws/missions/{shop.mission.pk}/"
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop runs in this thread
    # The sibling subdomain's own page, served by its own server (same site: the cookie goes along).
    sibling = ThreadingHTTPServer(("127.0.0.1", 0), SiblingPage)
    threading.Thread(target=sibling.serve_forever, daemon=True).start()
    manager = playwright_api.sync_playwright().start()
    browser = manager.chromium.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=["--no-sandbox", "--disable-gpu", f"--host-resolver-rules=MAP {SITE} 127.0.0.1, MAP {SIBLING} 127.0.0.1"],
    )
    try:
        context = browser.new_context()
        page = context.new_page()
        page.goto(site + "/login/")
        page.fill("#id_username", "alice")
        page.fill("#id_password", alice.password_text)
        page.click("button[type=submit]")
        page.wait_for_url(site + "/")
        cookie = next(c for c in context.cookies() if c["name"] == settings.SESSION_COOKIE_NAME)
        assert cookie["sameSite"] == "Lax" and cookie["domain"] == SITE

        def read_stream(origin_url: str) -> dict:
            page.goto(origin_url + "/")
            handle = page.evaluate_handle(
                "([url]) => { const r = {seen: [], closed: null, open: false}; const ws = new WebSocket(url);"
                " ws.onopen = () => { r.open = true; }; ws.onmessage = (e) => r.seen.push(JSON.parse(e.data).event);"
                " ws.onclose = (e) => { r.closed = e.code; }; window.__r = r; return r; }",
                [ws_url],
            )
            deadline = time.monotonic() + 10
            while not page.evaluate("window.__r.open || window.__r.closed !== null") and time.monotonic() < deadline:
                page.wait_for_timeout(50)
            title = f"seen from {origin_url}"
            status, _ = api(
                server, "PATCH", f"/api/missions/{shop.mission.pk}/", token=alice.token, body={"title": title}
            )
            assert status == 200
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not page.evaluate("window.__r.seen.length || window.__r.closed"):
                page.wait_for_timeout(50)
            handle.dispose()
            return page.evaluate("window.__r")

        attack = read_stream(f"http://{SIBLING}:{sibling.server_address[1]}")
        assert attack["closed"] == 4403 and attack["seen"] == [], (attack, server.logs()[-3000:])
        own = read_stream(site)
        assert own["seen"] == ["mission:updated"] and own["closed"] is None, own
    finally:
        browser.close()
        manager.stop()
        sibling.shutdown()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous
