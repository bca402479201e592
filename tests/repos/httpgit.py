"""A git server over HTTP that wants a password: `git http-backend` (the CGI git ships)
behind a small threaded HTTP server on 127.0.0.1, answering 401 to any request without
`Authorization: Basic base64(<user>:<token>)`.

    with HttpGit(base, user="x-access-token", token="s3cret") as server:
        url = server.url("shop.git")      # http://127.0.0.1:<port>/shop.git
        server.authorized, server.refused # requests let in and turned away

Plain HTTP, no TLS: the tests hand git a `Source` that takes the https path of
`fusion_site.repos.sources.git_env` (tests/repos/test_credentials.py says why).
"""

from __future__ import annotations

import base64
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


class HttpGit:
    def __init__(self, base: Path, *, user: str, token: str, echo: bool = False):
        self.base = Path(base)
        # `echo`: a chatty server that answers a wrong password with an error naming what it
        # got (git prints a server's `ERR` line): what git's output may carry back.
        self.echo = echo
        self.base.mkdir(parents=True, exist_ok=True)
        self.expected = "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()
        self.authorized = 0
        self.refused = 0
        self._lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def bare(self, name: str, *, source: Path) -> Path:
        path = self.base / name
        subprocess.run(["git", "clone", "--bare", "-q", str(source), str(path)], check=True)
        subprocess.run(["git", "-C", str(path), "config", "uploadpack.allowFilter", "true"], check=True)
        return path

    def _count(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.authorized += 1
            else:
                self.refused += 1

    def start(self) -> HttpGit:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 — the base class's name
                pass  # quiet: the test reads the counters, not a log

            def do_GET(self):
                self._serve()

            def do_POST(self):
                self._serve()

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _echo(self, got: str) -> None:
                decoded = base64.b64decode(got.split()[-1]).decode(errors="replace")
                lines = [b"# service=git-upload-pack\n", None, f"ERR refused {got} ({decoded})\n".encode()]
                body = b"".join(b"0000" if line is None else b"%04x%s" % (len(line) + 4, line) for line in lines)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-git-upload-pack-advertisement")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _serve(self):
                body = self._body() if self.command == "POST" else b""
                got = self.headers.get("Authorization")
                if got != owner.expected:
                    owner._count(False)
                    if owner.echo and got and self.path.endswith("/info/refs?service=git-upload-pack"):
                        self._echo(got)
                        return
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                owner._count(True)
                parts = urlsplit(self.path)
                env = {
                    "PATH": "/usr/bin:/bin",
                    "GIT_PROJECT_ROOT": str(owner.base),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": parts.path,
                    "QUERY_STRING": parts.query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_USER": "x",
                    "REMOTE_ADDR": "127.0.0.1",
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                }
                out = subprocess.run(
                    ["git", "http-backend"], input=body, capture_output=True, env=env, timeout=120
                ).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = out.partition(b"\n\n")
                status, headers = 200, []
                for line in head.decode("latin-1").splitlines():
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in ("content-length", "transfer-encoding"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="http-git", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> HttpGit:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
