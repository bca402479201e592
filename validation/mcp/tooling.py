"""What a tool is (name, descriptions, schemas, handler) and what a handler gets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # ships no types; the SDK depends on it

from validation.mcp.context import Principal
from validation.mcp.errors import invalid_arguments


@dataclass
class Call:
    """One tool call: its arguments, its principal and its way back to the client."""

    arguments: dict[str, Any]
    principal: Principal
    ctx: Any  # the SDK's ServerRequestContext: the session, progress, the HTTP request
    live: Any  # validation.mcp.live.Live (typed loosely: live imports nothing of the tools)

    async def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        await self.ctx.session.report_progress(done, total, message)


Handler = Callable[[Call], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    handler: Handler
    read_only: bool = True
    # fusion_validate's arguments are judged by the review request's own rules (their
    # messages are the contract's); every other tool's by its input schema.
    check_arguments: bool = True
    annotations: dict[str, Any] = field(default_factory=dict)

    def checked(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.check_arguments:
            problems = sorted(
                jsonschema.Draft202012Validator(self.input_schema).iter_errors(arguments), key=lambda e: list(e.path)
            )
            if problems:
                first = problems[0]
                path = ".".join(str(p) for p in first.path)
                raise invalid_arguments(path, first.message)
        return arguments
