"""Scripted reviewers and evaluators for the review pipeline tests.

Candidates and the evaluator are pydantic-ai `FunctionModel`s registered under
`test:<name>` in `validation.review.llm.TEST_MODELS` (the profile names them). An
evaluator reads the blind input out of its prompt and builds its answer from it, so the
tests do not depend on the random label assignment.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Callable
from typing import Any

from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from validation.review.candidates import SEVERITY_RANK

BASE_REQUEST = {
    "objective": "Add a greeting function",
    "background": ["The app greets users."],
    "changeSummary": "Added hello() in app.py",
    "scope": ["app.py"],
    "acceptanceCriteria": ["hello() returns 'hi'"],
    "verification": {"status": "provided", "evidence": [{"check": "pytest -q", "outcome": "3 passed"}]},
}


def request_body(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(BASE_REQUEST)
    body.update(changes)
    return body


def finding(
    summary: str,
    *,
    severity: str = "high",
    location: str = "app.py:1",
    evidence: str = "seen in app.py",
    impact: str = "users are affected",
) -> dict[str, str]:
    return {"severity": severity, "location": location, "evidence": evidence, "impact": impact, "summary": summary}


def candidate_answer(findings=(), verified=(), limitations=()) -> str:
    return json.dumps({"findings": list(findings), "verified": list(verified), "limitations": list(limitations)})


def fenced(answer: str, preamble: str = "Here is my review.\n") -> str:
    return f"{preamble}```json\n{answer}\n```\n"


def _user_text(messages) -> str:
    for message in messages:
        for part in message.parts:
            if part.part_kind == "user-prompt" and isinstance(part.content, str):
                return part.content
    return ""


class Reviewer:
    """A candidate: optional tool calls first, then its answer. `gate` holds the answer
    until it is set (an async wait, so a cancel stops it at once)."""

    def __init__(self, answer: str, *, tools: list[tuple[str, dict]] = (), gate: threading.Event | None = None):
        self.answer = answer
        self.tools = list(tools)
        self.gate = gate
        self.started = threading.Event()
        self.calls = 0
        self.tool_results: list[str] = []
        self.prompts: list[str] = []
        self.tool_names: list[str] = []

    async def __call__(self, messages, info: AgentInfo) -> ModelResponse:
        self.calls += 1
        self.prompts.append(_user_text(messages))
        self.tool_names = [t.name for t in info.function_tools]
        for part in messages[-1].parts:
            if part.part_kind == "tool-return":
                self.tool_results.append(str(part.content))
        step = sum(1 for m in messages if m.kind == "response")
        if step < len(self.tools):
            name, args = self.tools[step]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"t{step}")])
        self.started.set()
        while self.gate is not None and not self.gate.is_set():
            await asyncio.sleep(0.02)
        return ModelResponse(parts=[TextPart(self.answer)])

    def model(self) -> FunctionModel:
        return FunctionModel(self, model_name="reviewer")


def blind_input(prompt: str) -> dict[str, Any]:
    return json.loads(prompt.split("\n", 1)[1])


def good_evaluation(
    blind: dict[str, Any],
    *,
    group_by: Callable[[dict], str] = lambda f: f["location"],
    exclude: Callable[[dict], bool] = lambda f: False,
    rationale: str = "Confirmed in the code.",
) -> dict[str, Any]:
    findings = blind["validation_source_findings"]
    decisions, members = [], {}
    for f in findings:
        if exclude(f):
            decisions.append({"source_id": f["source_id"], "decision": "exclude", "rationale": "Not reproducible."})
        else:
            gid = "G-" + group_by(f)
            decisions.append(
                {"source_id": f["source_id"], "decision": "include", "group_id": gid, "rationale": rationale}
            )
            members.setdefault(gid, []).append(f)
    groups = []
    for gid, fs in members.items():
        worst = min(fs, key=lambda f: SEVERITY_RANK[f["severity"]])
        groups.append(
            {
                "group_id": gid,
                "source_ids": [f["source_id"] for f in fs],
                "severity": worst["severity"],
                "summary": worst["summary"],
                "location": worst["location"],
                "evidence": worst["evidence"],
                "impact": worst["impact"],
                "rationale": rationale,
            }
        )
    labels = [c["candidate_id"] for c in blind["candidates"]]
    return {
        "candidate_assessments": [{"candidate_id": label, "assessment": "useful"} for label in labels],
        "agreements": [],
        "conflicts": [],
        "synthesis_plan": "merge by location",
        "validation_accounting": {"findings": copy.deepcopy(findings), "decisions": decisions, "groups": groups},
    }


class Evaluator:
    """Answers each attempt with `plans[attempt - 1](blind_input)` (a dict is sent as JSON)."""

    def __init__(self, *plans: Callable[[dict], Any], gate: threading.Event | None = None):
        self.plans = plans or (good_evaluation,)
        self.gate = gate
        self.started = threading.Event()
        self.attempts: list[dict[str, Any]] = []
        self.tool_names: list[list[str]] = []

    async def __call__(self, messages, info: AgentInfo) -> ModelResponse:
        prompt = _user_text(messages)
        payload = blind_input(prompt)
        repair = prompt.startswith("Repair input")
        self.attempts.append({"repair": repair, "payload": payload})
        self.tool_names.append([t.name for t in info.function_tools])
        self.started.set()
        while self.gate is not None and not self.gate.is_set():
            await asyncio.sleep(0.02)
        blind = payload["original_blind_input"] if repair else payload
        plan = self.plans[min(len(self.attempts), len(self.plans)) - 1]
        answer = plan(blind)
        return ModelResponse(parts=[TextPart(answer if isinstance(answer, str) else json.dumps(answer))])

    def model(self) -> FunctionModel:
        return FunctionModel(self, model_name="evaluator")


def violating(mutate: Callable[[dict], None]) -> Callable[[dict], dict]:
    def plan(blind: dict) -> dict:
        doc = good_evaluation(blind)
        mutate(doc["validation_accounting"])
        return doc

    return plan


# One breach of each accounting rule, and the message the host answers it with.
def _change_copy(acc):
    acc["findings"][0]["summary"] += " (reworded)"


def _duplicate_decision(acc):
    acc["decisions"].append(copy.deepcopy(acc["decisions"][0]))


def _missing_decision(acc):
    acc["decisions"].pop()


def _include_without_group(acc):
    acc["decisions"][0].pop("group_id")


def _exclude_with_group(acc):
    acc["decisions"][0]["decision"] = "exclude"


def _members_mismatch(acc):
    acc["groups"][0]["source_ids"] = (
        acc["groups"][0]["source_ids"] + [acc["groups"][-1]["source_ids"][0]] if len(acc["groups"]) > 1 else []
    )


VIOLATIONS = {
    "exact_copy": (_change_copy, "is not an exact copy of the source finding"),
    "duplicate_decision": (_duplicate_decision, "a second time"),
    "missing_decision": (_missing_decision, "has no decision for"),
    "include_without_group": (_include_without_group, "is included without a group_id"),
    "exclude_with_group": (_exclude_with_group, "is excluded but names group"),
    "group_members": (_members_mismatch, "must be exactly the included findings that name this group"),
}
