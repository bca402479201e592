"""A local forge for tests: one threaded HTTP server on 127.0.0.1 (a free port) that
speaks the parts of GitHub's, GitLab's and Gitea's REST APIs the product calls, with
their published request and response shapes, and fails on demand.

    with FakeForge() as forge:
        forge.api_url("github")                 # http://127.0.0.1:PORT/github
        forge.api_url("gitlab")                 # …/gitlab/api/v4
        forge.api_url("gitea")                  # …/gitea/api/v1
        forge.add_pull("github", "acme/shop", 7, head=sha, branch="f-1", title="[F-1] …")
        forge.fail_next(2, status=500)          # the next two requests answer 500
        forge.fail_next(1, status=429, headers={"Retry-After": "30"})
        forge.hang_next(1)                      # the next request is never answered
        forge.require_token("github", "s3cret") # a request without it answers 401

Endpoints (paths after the provider's API root):
- GitHub, Gitea: `POST /repos/{owner}/{name}/statuses/{sha}` (201, the status with its
  `id`), `GET` the same (the list, newest first); `POST
  /repos/{owner}/{name}/issues/{n}/comments` (201, `{id, body, html_url, …}`), `GET` the
  same (the list); `PATCH /repos/{owner}/{name}/issues/comments/{id}` (200, the comment);
  `GET /repos/{owner}/{name}/pulls/{n}` (`{number, title, state, head: {sha, ref},
  html_url}`).
- GitLab: `POST /projects/{id or url-encoded path}/statuses/{sha}` (201, `{id, sha,
  status, name, target_url, description}`); `POST
  /projects/{id}/merge_requests/{iid}/notes` (201, `{id, body, …}`), `GET` the same; `PUT
  /projects/{id}/merge_requests/{iid}/notes/{note_id}` (200, the note); `GET
  /projects/{id}/merge_requests/{iid}` (`{iid, title, state, sha, source_branch, web_url}`).

Every request is recorded (`requests`: method, path, headers, json); `statuses` and
`comments` hold what the forge keeps. The fixture `fake_forge` gives a started one."""

from __future__ import annotations

import itertools
import json
import re
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

ROOTS = {"github": "/github", "gitlab": "/gitlab/api/v4", "gitea": "/gitea/api/v1"}
STATES = {
    "github": {"pending", "success", "failure", "error"},
    "gitea": {"pending", "success", "failure", "error", "warning"},
    "gitlab": {"pending", "running", "success", "failed", "canceled"},
}
SHA = r"(?P<sha>[0-9a-fA-F]{7,64})"
REPO = r"(?P<repo>[^/]+/[^/]+)"
PROJECT = r"(?P<repo>[^/]+)"


@dataclass
class Recorded:
    provider: str
    method: str
    path: str  # after the provider's API root, as sent (percent-encoding kept)
    headers: dict[str, str]  # lower-cased names
    json: Any


@dataclass
class Failure:
    status: int = 500
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    hang: bool = False


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (its timeout, a request left hanging) closes its end while
        # the handler waits for its next request: expected here, not worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeForge:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.statuses: list[dict[str, Any]] = []  # every status created, with provider, repo, sha
        self.comments: dict[int, dict[str, Any]] = {}  # by id: provider, repo, number, body
        self.pulls: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.tokens: dict[str, str] = {}
        self.failures: deque[Failure] = deque()
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.released = threading.Event()
        self._ids = itertools.count(1001)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> FakeForge:
        forge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                forge._handle(self)

            do_POST = do_PATCH = do_PUT = do_DELETE = do_GET

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-forge", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()  # hanging requests end
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeForge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def api_url(self, provider: str) -> str:
        return self.base_url + ROOTS[provider]

    # --- what a test sets ---------------------------------------------------------------
    def add_pull(self, provider: str, repo: str, number: int, *, head: str, branch: str = "", title: str = "") -> None:
        with self.lock:
            self.pulls[(provider, repo, number)] = {"head": head, "branch": branch, "title": title}

    def fail_next(self, count: int = 1, *, status: int = 500, headers: dict[str, str] | None = None, body: Any = None):
        with self.lock:
            for _ in range(count):
                self.failures.append(Failure(status, dict(headers or {}), body))

    def hang_next(self, count: int = 1) -> None:
        """The next `count` requests are never answered (the client times out)."""
        with self.lock:
            for _ in range(count):
                self.failures.append(Failure(hang=True))

    def require_token(self, provider: str, token: str) -> None:
        self.tokens[provider] = token

    # --- what a test reads --------------------------------------------------------------
    def requests_to(self, method: str | None = None, contains: str = "") -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if (method is None or r.method == method) and contains in r.path]

    def statuses_of(self, sha: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.statuses if s["sha"] == sha]

    def wait_for_requests(self, count: int, timeout: float = 30) -> list[Recorded]:
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.requests) >= count, timeout=timeout):
                raise AssertionError(f"the forge received {len(self.requests)} requests, not {count}")
            return list(self.requests)

    # --- serving ------------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        raw_path = urlsplit(handler.path).path
        provider = next((p for p, root in ROOTS.items() if raw_path.startswith(root + "/")), None)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        path = raw_path[len(ROOTS[provider]) :] if provider else raw_path
        with self.arrived:
            self.requests.append(
                Recorded(
                    provider or "", handler.command, path, {k.lower(): v for k, v in handler.headers.items()}, payload
                )
            )
            self.arrived.notify_all()
            failure = self.failures.popleft() if self.failures else None
        if failure is not None and failure.hang:
            self.released.wait(120)
            return
        if failure is not None:
            self._reply(handler, failure.status, failure.body or {"message": "failure on demand"}, failure.headers)
            return
        if provider is None:
            self._reply(handler, 404, {"message": "Not Found"})
            return
        if not self._authorized(provider, handler):
            self._reply(handler, 401, {"message": "Bad credentials"})
            return
        status, body = self._route(provider, handler.command, path, payload)
        self._reply(handler, status, body)

    def _authorized(self, provider: str, handler: BaseHTTPRequestHandler) -> bool:
        expected = self.tokens.get(provider)
        if expected is None:
            return True
        given = {
            "github": handler.headers.get("Authorization") == f"Bearer {expected}",
            "gitea": handler.headers.get("Authorization") == f"token {expected}",
            "gitlab": handler.headers.get("PRIVATE-TOKEN") == expected,
        }
        return given[provider]

    def _route(self, provider: str, method: str, path: str, payload: Any) -> tuple[int, Any]:
        routes = GITLAB_ROUTES if provider == "gitlab" else GITHUB_ROUTES
        for verb, pattern, name in routes:
            match = re.fullmatch(pattern, path)
            if match and verb == method:
                parts = {k: unquote(v) for k, v in match.groupdict().items()}
                with self.lock:
                    return getattr(self, name)(provider, payload if isinstance(payload, dict) else {}, **parts)
        return 404, {"message": "Not Found"}

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    # --- the endpoints (called under the lock) ------------------------------------------
    def _now(self) -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _create_status(self, provider: str, body: dict, *, repo: str, sha: str) -> tuple[int, Any]:
        state = body.get("state")
        if state not in STATES[provider]:
            return (400 if provider == "gitlab" else 422), {"message": f"invalid state {state!r}"}
        status_id = next(self._ids)
        record = {"provider": provider, "repo": repo, "sha": sha, "id": status_id, **body}
        self.statuses.append(record)
        if provider == "gitlab":
            return 201, {
                "id": status_id,
                "sha": sha,
                "ref": None,
                "status": state,
                "name": body.get("name", "default"),
                "target_url": body.get("target_url"),
                "description": body.get("description"),
                "created_at": self._now(),
            }
        return 201, {
            "id": status_id,
            "url": f"{self.base_url}{ROOTS[provider]}/repos/{repo}/statuses/{sha}",
            "state": state,
            "description": body.get("description"),
            "target_url": body.get("target_url"),
            "context": body.get("context", "default"),
            "created_at": self._now(),
            "updated_at": self._now(),
        }

    def _list_statuses(self, provider: str, body: dict, *, repo: str, sha: str) -> tuple[int, Any]:
        return 200, [
            s for s in reversed(self.statuses) if s["provider"] == provider and s["repo"] == repo and s["sha"] == sha
        ]

    def _create_comment(self, provider: str, body: dict, *, repo: str, number: str) -> tuple[int, Any]:
        if "body" not in body:
            return (400 if provider == "gitlab" else 422), {"message": "body is missing"}
        comment_id = next(self._ids)
        self.comments[comment_id] = {"provider": provider, "repo": repo, "number": int(number), "body": body["body"]}
        return 201, self._comment_json(comment_id)

    def _list_comments(self, provider: str, body: dict, *, repo: str, number: str) -> tuple[int, Any]:
        return 200, [
            self._comment_json(cid)
            for cid, c in self.comments.items()
            if c["provider"] == provider and c["repo"] == repo and c["number"] == int(number)
        ]

    def _edit_comment(
        self, provider: str, body: dict, *, repo: str, comment_id: str, number: str = ""
    ) -> tuple[int, Any]:
        comment = self.comments.get(int(comment_id))
        if comment is None or comment["provider"] != provider or comment["repo"] != repo:
            return 404, {"message": "Not Found"}
        if "body" not in body:
            return (400 if provider == "gitlab" else 422), {"message": "body is missing"}
        comment["body"] = body["body"]
        return 200, self._comment_json(int(comment_id))

    def _comment_json(self, comment_id: int) -> dict[str, Any]:
        c = self.comments[comment_id]
        if c["provider"] == "gitlab":
            return {"id": comment_id, "body": c["body"], "noteable_iid": c["number"], "system": False}
        return {
            "id": comment_id,
            "body": c["body"],
            "html_url": f"{self.base_url}/{c['repo']}/pull/{c['number']}#issuecomment-{comment_id}",
            "user": {"login": "fusion-bot"},
            "created_at": self._now(),
            "updated_at": self._now(),
        }

    def _get_pull(self, provider: str, body: dict, *, repo: str, number: str) -> tuple[int, Any]:
        pull = self.pulls.get((provider, repo, int(number)))
        if pull is None:
            return 404, {"message": "Not Found"}
        if provider == "gitlab":
            return 200, {
                "iid": int(number),
                "title": pull["title"],
                "state": "opened",
                "sha": pull["head"],
                "source_branch": pull["branch"],
                "web_url": f"{self.base_url}/{repo}/-/merge_requests/{number}",
            }
        return 200, {
            "number": int(number),
            "title": pull["title"],
            "state": "open",
            "head": {"sha": pull["head"], "ref": pull["branch"]},
            "html_url": f"{self.base_url}/{repo}/pull/{number}",
        }


GITHUB_ROUTES = [
    ("POST", rf"/repos/{REPO}/statuses/{SHA}", "_create_status"),
    ("GET", rf"/repos/{REPO}/statuses/{SHA}", "_list_statuses"),
    ("POST", rf"/repos/{REPO}/issues/(?P<number>\d+)/comments", "_create_comment"),
    ("GET", rf"/repos/{REPO}/issues/(?P<number>\d+)/comments", "_list_comments"),
    ("PATCH", rf"/repos/{REPO}/issues/comments/(?P<comment_id>\d+)", "_edit_comment"),
    ("GET", rf"/repos/{REPO}/pulls/(?P<number>\d+)", "_get_pull"),
]
GITLAB_ROUTES = [
    ("POST", rf"/projects/{PROJECT}/statuses/{SHA}", "_create_status"),
    ("POST", rf"/projects/{PROJECT}/merge_requests/(?P<number>\d+)/notes", "_create_comment"),
    ("GET", rf"/projects/{PROJECT}/merge_requests/(?P<number>\d+)/notes", "_list_comments"),
    ("PUT", rf"/projects/{PROJECT}/merge_requests/(?P<number>\d+)/notes/(?P<comment_id>\d+)", "_edit_comment"),
    ("GET", rf"/projects/{PROJECT}/merge_requests/(?P<number>\d+)", "_get_pull"),
]


@pytest.fixture
def fake_forge():
    """A started local forge, stopped after the test (import it into a conftest)."""
    with FakeForge() as forge:
        yield forge
