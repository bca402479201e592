"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 for tests.

It answers POST /v1/chat/completions from a script (see scripted_model.py) and records
every request it receives, so a test can prove what was (not) sent. A turn can be held:
the request that would get it waits until the test releases it (to kill a worker while a
call is in flight).

Like a real server it can refuse a `response_format` it does not take (`response_formats`:
the `type`s it accepts; any other is answered `refusal_status`, 400 by default, as
servers do; llama-cpp-python's answers 500),
and it can stand for a server that decodes under the schema it was sent (`enforce_schema`):
a scripted text answer that the schema does not admit is a broken test script (500).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.scripted_model import resolve

OUTPUT_TOOL = "submit_verdict"


class ScriptedOpenAIServer:
    def __init__(
        self,
        turns: list,
        *,
        model: str = "scripted-model",
        usage: tuple[int, int] | None = None,
        response_formats: tuple[str, ...] | None = None,
        enforce_schema: bool = False,
        refusal_status: int = 400,
    ):
        self.turns = turns
        self.model = model
        self.usage = usage
        self.response_formats = response_formats
        self.enforce_schema = enforce_schema
        self.refusal_status = refusal_status  # llama-cpp-python's server refuses with a 500
        self.requests: list[dict[str, Any]] = []
        self.holds: dict[int, threading.Event] = {}
        self.arrived = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> ScriptedOpenAIServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                server._handle(self)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})

            def _send(self, status: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        for event in self.holds.values():
            event.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    # --- scripting ---------------------------------------------------------------------
    def hold(self, turn: int) -> threading.Event:
        """The first request for `turn` waits until the returned event is set."""
        self.holds[turn] = threading.Event()
        return self.holds[turn]

    def wait_for(self, predicate, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not predicate(self.requests):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting; requests so far: {[r['turn'] for r in self.requests]}")
                self.arrived.wait(left)

    def turns_received(self) -> list[int]:
        return [r["turn"] for r in self.requests]

    # --- serving -------------------------------------------------------------------------
    def _handle(self, handler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"{}")
        if not handler.path.endswith("/chat/completions"):
            handler._send(404, {"error": {"message": f"no route {handler.path}"}})
            return
        turn_index = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        record = {
            "turn": turn_index,
            "body": body,
            "headers": {k.lower(): v for k, v in handler.headers.items()},
            "at": time.time(),
        }
        with self.arrived:
            first_time = turn_index not in {r["turn"] for r in self.requests}
            self.requests.append(record)
            self.arrived.notify_all()
        if body.get("stream"):
            handler._send(400, {"error": {"message": "this test server does not stream"}})
            return
        refusal = self._refusal(body.get("response_format"))
        if refusal:
            handler._send(self.refusal_status, {"error": {"message": refusal, "type": "invalid_request_error"}})
            return
        hold = self.holds.get(turn_index)
        if hold is not None and first_time:
            hold.wait(120)
        try:
            turn = resolve(self.turns, turn_index, {"index": turn_index, "body": body})
            completion = self._completion(turn, body, turn_index)
            self._check_schema(body.get("response_format"), completion["choices"][0]["message"])
            handler._send(200, completion)
        except AssertionError as exc:
            handler._send(500, {"error": {"message": str(exc)}})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client died while held

    def _refusal(self, response_format: Any) -> str:
        if self.response_formats is None or not isinstance(response_format, dict):
            return ""
        kind = response_format.get("type")
        if kind in self.response_formats:
            return ""
        return f"response_format type must be one of {', '.join(self.response_formats)}; got {kind!r}"

    def _check_schema(self, response_format: Any, message: dict[str, Any]) -> None:
        if not self.enforce_schema or not isinstance(response_format, dict) or message.get("tool_calls"):
            return
        schema = response_format.get("schema") or (response_format.get("json_schema") or {}).get("schema")
        if schema is None:
            return
        import jsonschema  # the test dependencies' (schemathesis's); only this mode needs it

        try:
            jsonschema.validate(json.loads(message["content"], strict=False), schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            raise AssertionError(f"the script answers outside the schema it was sent: {exc}") from exc

    def _completion(self, turn, body: dict, index: int) -> dict[str, Any]:
        message, finish = self._message(turn, body, index)
        prompt_tokens, completion_tokens = self.usage or (len(json.dumps(body)) // 4, len(json.dumps(message)) // 4)
        return {
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    @staticmethod
    def _message(turn, body: dict, index: int) -> tuple[dict[str, Any], str]:
        kind = turn[0]
        tool_names = {t["function"]["name"] for t in body.get("tools", [])}
        if kind in ("tool", "tools") or (kind == "verdict" and OUTPUT_TOOL in tool_names):
            calls = [(turn[1], turn[2])] if kind == "tool" else turn[1] if kind == "tools" else [(OUTPUT_TOOL, turn[1])]
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{index}_{j}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                    for j, (name, args) in enumerate(calls)
                ],
            }, "tool_calls"
        content = json.dumps(turn[1]) if kind == "verdict" else turn[1]
        return {"role": "assistant", "content": content}, "stop"
