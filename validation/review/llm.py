"""The reviewers' model side: what they are told, the tools they may use, and the call.

Prompts: fixed texts plus canonical JSON, so the same review always sends the same
prompts (they are stored and hashed as artifacts).

Tools: `read`, `grep`, `find`, `ls` on the review's snapshot, for candidate reviewers.
The confinement, bounds and secret redaction are the agent validator's
(`validation.validators.tools`); `make_tools` only binds them to one snapshot directory
as typed functions that pydantic-ai can offer to a model. Nothing there writes or runs
anything.

The call: one pydantic-ai Agent run with text output. All model I/O of the review goes
through `run_text_agent`. It runs the agent on its own event loop in a helper thread so
that the calling actor can stop it *in flight*: the caller polls `should_stop` (a
cancelled review) and the deadline, and the agent task is cancelled at once, even in the
middle of an HTTP request. Every failure comes out as `ModelFailure` with a code:
`cancelled`, `timeout`, `unavailable` (misconfiguration, a permanent error) or
`model_error` (the call failed).

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
from pathlib import Path
from typing import Any

from validation.journal import canonical
from validation.review.candidates import CANDIDATE_SCHEMA
from validation.validators import tools as confined

# What the reviewers and the evaluator are told.
CANDIDATE_INSTRUCTIONS = f"""\
You are one of several independent reviewers of a completed code change. This is an
advisory, read-only review: never modify anything, and do not run builds, tests or
linters. Inspect the repository with the tools read, grep, find and ls (paths are
relative to the repository root) and check the change against the request: its
objective, scope and acceptance criteria. Respect the exclusions.

Answer with exactly one JSON object and nothing else:
{{"schema_version": "{CANDIDATE_SCHEMA}",
 "findings": [{{"severity": "critical" | "high" | "minor", "location": "path:line or area",
   "evidence": "what you saw in the repository", "impact": "why it matters",
   "summary": "one line"}}],
 "verified": ["statements you checked and found to hold"],
 "limitations": ["what you could not check, and why"]}}
Every string is non-blank. Use [] for an empty list. No other keys."""

EVALUATOR_INSTRUCTIONS = """\
You evaluate the reports of several anonymous reviewers (candidates A, B and C) of one
change. You have no tools and see only the input. Decide which source findings belong in
the final report, merging duplicates into groups.

Answer with exactly one JSON object and nothing else:
{"candidate_assessments": [{"candidate_id": "A", "assessment": "..."}, ...one per candidate],
 "agreements": ["..."],
 "conflicts": [{"candidate_ids": ["A", "B"], "topic": "...", "resolution": "..."}],
 "synthesis_plan": "...",
 "validation_accounting": {
   "findings": [...every object of validation_source_findings, copied exactly, unchanged...],
   "decisions": [{"source_id": "A-F001", "decision": "include", "group_id": "G1", "rationale": "..."},
                 {"source_id": "B-F001", "decision": "exclude", "rationale": "..."}],
   "groups": [{"group_id": "G1", "source_ids": ["A-F001"], "severity": "critical" | "high" | "minor",
               "summary": "...", "location": "...", "evidence": "...", "impact": "...",
               "rationale": "why this is included"}]}}
Rules the host checks: findings is an exact copy of validation_source_findings; every
source finding has exactly one decision; an included finding names a group_id, an
excluded one has no group_id; each group's source_ids are exactly the included findings
that name it; a group's severity is the highest severity of its findings; each conflict
names at least two distinct candidates. Write rationales about the findings, not about
the reviewers."""

REPAIR_INSTRUCTIONS = (
    EVALUATOR_INSTRUCTIONS
    + """

Your previous answer broke these rules. You get the original input, your invalid output
and the list of violations: answer again with one corrected JSON object."""
)


def json_text(value: Any) -> str:
    return canonical(value).decode("utf-8")


def candidate_prompt(canonical_input: dict[str, Any], *, has_repository: bool) -> str:
    where = (
        "The repository at the pinned revision is available through the tools."
        if has_repository
        else "No repository is attached to this review: judge from the request alone."
    )
    return f"{where}\n\nReview input (canonical JSON):\n{json_text(canonical_input)}"


def evaluator_prompt(blind_input: dict[str, Any]) -> str:
    return f"Evaluation input (canonical JSON):\n{json_text(blind_input)}"


def repair_prompt(blind_input: dict[str, Any], invalid_output: str, errors: list[str]) -> str:
    payload = {"original_blind_input": blind_input, "invalid_output": invalid_output, "validation_errors": errors}
    return f"Repair input (canonical JSON):\n{json_text(payload)}"


# The candidates' read-only tools.
TOOL_NAMES = ("read", "grep", "find", "ls")


def make_tools(root: Path) -> list[Callable[..., str]]:
    root = Path(root).resolve()

    def read(path: str, offset: int = 1, limit: int = 200) -> str:
        """Read a text file of the repository (paths relative to its root); lines are numbered from `offset`."""
        return confined.read(root, path, offset, limit)

    def grep(pattern: str, path: str = ".", glob: str = "*") -> str:
        """Search the files under `path` whose name matches `glob` for a Python regular expression."""
        return confined.grep(root, pattern, path, glob)

    def find(pattern: str = "*", path: str = ".") -> str:
        """List the files under `path` whose relative path or name matches the glob `pattern`."""
        return confined.find(root, pattern, path)

    def ls(path: str = ".") -> str:
        """List one directory of the repository (directories end with /)."""
        return confined.ls(root, path)

    return [read, grep, find, ls]


# The call.
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
