"""`manage.py watch_mission MISSION`: print a mission's live events as they come.

It connects to a running server's WebSocket, `/ws/missions/<id>/`, the way any program
would: `--url ws://127.0.0.1:8000` (or wss://…) and a DRF token (`--token`, or the
`FUSION_TOKEN` environment variable; `manage.py drf_create_token USER` makes one).
MISSION is the mission's id or key (a key is looked up through the REST API).

The WebSocket client below is a small RFC 6455 client on asyncio (text frames, ping/pong,
close codes); it has no dependency beyond the standard library.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import ssl
import struct
import urllib.parse
import urllib.request
from datetime import datetime

from django.core.management.base import BaseCommand, CommandError

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
FORBIDDEN = 4403


class WebSocketClosed(Exception):
    def __init__(self, code: int | None, reason: str = ""):
        super().__init__(f"closed with code {code}{': ' + reason if reason else ''}")
        self.code = code
        self.reason = reason


class WebSocketClient:
    """A minimal WebSocket client: `await connect(url, headers)`, `await recv()` -> str."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, url: str, *, headers: dict[str, str] | None = None, timeout: float = 10) -> WebSocketClient:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("ws", "wss"):
            raise ValueError(f"not a WebSocket URL: {url}")
        secure = parts.scheme == "wss"
        port = parts.port or (443 if secure else 80)
        context = ssl.create_default_context() if secure else None
        reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port, ssl=context), timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        if " 101 " not in f"{status_line} ":
            writer.close()
            raise WebSocketClosed(None, f"handshake refused: {status_line.strip()}")
        received = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
        expected = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        if received.get("sec-websocket-accept") != expected:
            writer.close()
            raise WebSocketClosed(None, "handshake answer does not match its key")
        return cls(reader, writer)

    async def _send_frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(head + mask + masked)
        await self.writer.drain()

    async def send(self, text: str) -> None:
        await self._send_frame(0x1, text.encode("utf-8"))

    async def _read_frame(self) -> tuple[bool, int, bytes]:
        b1, b2 = await self.reader.readexactly(2)
        n = b2 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
        mask = await self.reader.readexactly(4) if b2 & 0x80 else None
        payload = await self.reader.readexactly(n)
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return bool(b1 & 0x80), b1 & 0x0F, payload

    async def recv(self) -> str:
        """The next text message; raises WebSocketClosed when the server closes."""
        parts: list[bytes] = []
        while True:
            try:
                fin, opcode, payload = await self._read_frame()
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise WebSocketClosed(1006, "connection lost") from exc
            if opcode == 0x8:  # close
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                await self.close(code)
                raise WebSocketClosed(code, payload[2:].decode("utf-8", "replace"))
            if opcode == 0x9:  # ping
                await self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:  # pong
                continue
            parts.append(payload)
            if fin:
                return b"".join(parts).decode("utf-8")

    async def close(self, code: int = 1000) -> None:
        if self.writer.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._send_frame(0x8, struct.pack("!H", code))
        self.writer.close()


def http_base(ws_url: str) -> str:
    parts = urllib.parse.urlsplit(ws_url)
    return f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"


def resolve_mission(mission: str, *, url: str, token: str | None) -> int:
    if mission.isdigit():
        return int(mission)
    query = urllib.parse.urlencode({"key": mission})
    request = urllib.request.Request(
        f"{http_base(url)}/api/missions/?{query}",
        headers={"Accept": "application/json", **({"Authorization": f"Token {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            results = json.load(response).get("results", [])
    except OSError as exc:
        raise CommandError(f"could not look up mission {mission!r}: {exc}") from exc
    if not results:
        raise CommandError(f"no mission with key {mission!r} that this token may see")
    return int(results[0]["id"])


def format_event(message: dict) -> str:
    data = dict(message.get("data") or {})
    for key in ("type", "mission", "seq"):
        data.pop(key, None)
    details = " ".join(
        f"{k}={json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}" for k, v in data.items()
    )
    return f"{datetime.now().strftime('%H:%M:%S')} #{message.get('id')} {message.get('event')} {details}".rstrip()


class Command(BaseCommand):
    help = "Print a mission's live events as they come (a WebSocket client of a running server)."

    def add_arguments(self, parser):
        parser.add_argument("mission", help="mission id or key")
        parser.add_argument(
            "--url",
            default=os.environ.get("FUSION_URL", "ws://127.0.0.1:8000"),
            help="the server's WebSocket base URL (default ws://127.0.0.1:8000, or $FUSION_URL)",
        )
        parser.add_argument("--token", default=os.environ.get("FUSION_TOKEN"), help="DRF API token (or $FUSION_TOKEN)")
        parser.add_argument("--json", dest="as_json", action="store_true", help="print each event as one line of JSON")
        parser.add_argument("--count", type=int, default=0, help="exit after this many events (0: never)")
        parser.add_argument("--timeout", type=float, default=0, help="exit after this many seconds (0: never)")

    def handle(
        self, *args, mission: str, url: str, token: str | None, as_json: bool, count: int, timeout: float, **options
    ):
        url = url.rstrip("/")
        if not token:
            raise CommandError(
                "a token is needed: --token KEY or FUSION_TOKEN (manage.py drf_create_token USER makes one)"
            )
        mission_id = resolve_mission(mission, url=url, token=token)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(
                self._watch(f"{url}/ws/missions/{mission_id}/", token, as_json=as_json, count=count, timeout=timeout)
            )

    async def _watch(self, ws_url: str, token: str, *, as_json: bool, count: int, timeout: float) -> None:
        try:
            client = await WebSocketClient.connect(ws_url, headers={"Authorization": f"Token {token}"})
        except (TimeoutError, OSError) as exc:
            raise CommandError(f"cannot connect to {ws_url}: {exc}") from exc
        except WebSocketClosed as exc:
            raise CommandError(f"{ws_url}: {exc.reason}") from exc
        self.stderr.write(f"watching {ws_url} (Ctrl-C to stop)")
        seen = 0
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        try:
            while not count or seen < count:
                remaining = deadline - asyncio.get_running_loop().time() if deadline else None
                if remaining is not None and remaining <= 0:
                    break
                try:
                    text = await asyncio.wait_for(client.recv(), remaining)
                except TimeoutError:
                    break
                self.stdout.write(text if as_json else format_event(json.loads(text)))
                self.stdout.flush()
                seen += 1
        except WebSocketClosed as exc:
            if exc.code == FORBIDDEN:
                raise CommandError("refused (4403): this token's user may not see the mission") from exc
            raise CommandError(f"the server closed the stream: {exc}") from exc
        finally:
            await client.close()
