"""Scripted conversations: the same turns served by pydantic-ai's FunctionModel (in
process) or by `ScriptedOpenAIServer` (real HTTP, see openai_server.py).

A turn is ("tool", name, args), ("tools", [(name, args), ...]), ("verdict", document),
("text", content), or a callable (request_summary) -> one of those. The turn that answers
a request is chosen by the conversation itself, not by a counter: a request whose history
holds n model answers gets turn n. A resent request (after a crash) gets the same turn.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage


def resolve(turns: list, index: int, context: dict[str, Any]):
    if index >= len(turns):
        raise AssertionError(f"the script has {len(turns)} turns; request {index + 1} was not expected")
    turn = turns[index]
    return turn(context) if callable(turn) else turn


class ScriptedFunction:
    """A FunctionModel body: records every call, answers from the script."""

    def __init__(self, turns: list, usage: tuple[int, int] = (100, 20)):
        self.turns = turns
        self.usage = usage
        self.calls: list[dict[str, Any]] = []

    def __call__(self, messages, info: AgentInfo) -> ModelResponse:
        index = sum(1 for m in messages if m.kind == "response")
        context = {"index": index, "messages": messages, "text": _texts(messages)}
        self.calls.append(context)
        turn = resolve(self.turns, index, context)
        usage = RequestUsage(input_tokens=self.usage[0], output_tokens=self.usage[1])
        return ModelResponse(parts=_parts(turn, info, index), usage=usage)

    def model(self) -> FunctionModel:
        return FunctionModel(self, model_name="scripted")


def _texts(messages) -> str:
    out = []
    for m in messages:
        for part in m.parts:
            content = getattr(part, "content", None)
            if isinstance(content, str):
                out.append(content)
    return "\n".join(out)


def _parts(turn, info: AgentInfo, index: int) -> list:
    kind = turn[0]
    if kind == "tool":
        return [ToolCallPart(turn[1], turn[2], tool_call_id=f"call_{index}_0")]
    if kind == "tools":
        return [ToolCallPart(name, args, tool_call_id=f"call_{index}_{j}") for j, (name, args) in enumerate(turn[1])]
    if kind == "verdict":
        if info.output_tools:
            return [ToolCallPart(info.output_tools[0].name, turn[1], tool_call_id=f"call_{index}_v")]
        return [TextPart(json.dumps(turn[1]))]
    if kind == "text":
        return [TextPart(turn[1])]
    raise AssertionError(f"unknown turn {turn!r}")
