"""The reviewers' model adapter: one pydantic-ai Agent run with text output.

All model I/O of the review goes through `run_text_agent`. It runs the agent on its own
event loop in a helper thread so that the calling actor can stop it *in flight*: the
caller polls `should_stop` (a cancelled review) and the deadline, and the agent task is
cancelled at once, even in the middle of an HTTP request. Every failure comes out as
`ModelFailure` with a code: `cancelled`, `timeout`, `unavailable` (misconfiguration, a
permanent error) or `model_error` (the call failed).

Tests register offline models (pydantic-ai `FunctionModel`) in `TEST_MODELS` under
names such as `"test:reviewer-1"` and name them in a review profile.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

TEST_MODELS: dict[str, Any] = {}
POLL_SECONDS = 0.2


class ModelFailure(Exception):
    def __init__(self, message: str, *, code: str = "model_error"):
        super().__init__(message)
        self.code = code


@dataclass
class AgentAnswer:
    text: str
    transcript: str  # the whole exchange (pydantic-ai messages as JSON)
    tokens_in: int = 0
    tokens_out: int = 0
    requests: int = 0


def build_model(spec: Any):
    """A pydantic-ai model from a profile's model spec."""
    if isinstance(spec, str):
        if spec in TEST_MODELS:
            return TEST_MODELS[spec]
        if spec.startswith("test:"):
            raise ModelFailure(f"no test model {spec!r} is registered", code="unavailable")
        # pydantic-ai's provider modules load on use: only the configured provider's client.
        from pydantic_ai.models import infer_model

        try:
            return infer_model(spec)
        except Exception as exc:  # noqa: BLE001 — any provider setup problem is a configuration error
            raise ModelFailure(f"model {spec!r} is unavailable: {exc}", code="unavailable") from exc
    # Loaded on use, like every provider client (pydantic-ai's are heavy).
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    key_env = spec.get("api_key_env")
    api_key = os.environ.get(key_env, "") if key_env else ""
    if key_env and not api_key:
        raise ModelFailure(
            f"the environment variable {key_env} (API key of {spec['model']!r}) is not set", code="unavailable"
        )
    provider = OpenAIProvider(base_url=spec["base_url"], api_key=api_key or "not-needed")
    return OpenAIChatModel(spec["model"], provider=provider)


def run_text_agent(
    spec: Any,
    *,
    instructions: str,
    prompt: str,
    tools: Sequence[Callable] = (),
    timeout: float,
    request_limit: int = 40,
    should_stop: Callable[[], bool] = lambda: False,
) -> AgentAnswer:
    """Run one agent to its text answer, stoppable from the calling thread."""
    # pydantic-ai loads only when a review calls a model (it is heavy; the API never needs it).
    from pydantic_ai import Agent
    from pydantic_ai.usage import UsageLimits

    agent = Agent(build_model(spec), instructions=instructions, tools=list(tools), output_type=str)
    stop = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        task = asyncio.ensure_future(agent.run(prompt, usage_limits=UsageLimits(request_limit=request_limit)))
        while not task.done():
            await asyncio.wait({task}, timeout=0.05)
            if stop.is_set() and not task.done():
                task.cancel()
        try:
            box["result"] = task.result()
        except asyncio.CancelledError:
            box["cancelled"] = True
        except BaseException as exc:  # noqa: BLE001 — handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="review-agent", daemon=True)
    deadline = time.monotonic() + timeout
    reason = ""
    thread.start()
    try:
        while thread.is_alive():
            thread.join(POLL_SECONDS)
            if not thread.is_alive() or reason:
                continue
            if should_stop():
                reason = "cancelled"
            elif time.monotonic() > deadline:
                reason = "timeout"
            if reason:
                stop.set()
    finally:
        stop.set()  # also when the actor itself is interrupted (time limit, shutdown)
        thread.join(10)
    return _answer(box, reason, timeout)


def _answer(box: dict[str, Any], reason: str, timeout: float) -> AgentAnswer:
    if reason == "cancelled":
        raise ModelFailure("the review was cancelled during the model call", code="cancelled")
    if reason == "timeout" or box.get("cancelled"):
        raise ModelFailure(f"the model did not answer within {timeout:g} s", code="timeout")
    if "error" in box:
        exc = box["error"]
        raise ModelFailure(f"{type(exc).__name__}: {str(exc)[:1000]}", code="model_error") from exc
    result = box["result"]
    usage = result.usage
    return AgentAnswer(
        text=result.output,
        transcript=_transcript(result),
        tokens_in=usage.input_tokens or 0,
        tokens_out=usage.output_tokens or 0,
        requests=usage.requests or 0,
    )


def _transcript(result) -> str:
    try:
        return result.all_messages_json().decode("utf-8")
    except Exception:  # noqa: BLE001 — e.g. a lone surrogate in a model's answer cannot be UTF-8
        from pydantic_ai.messages import ModelMessagesTypeAdapter  # loaded on use, as above

        return json.dumps(ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json"))
