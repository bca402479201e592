"""What a tool is (name, descriptions, schemas, handler), what a handler gets, and what it
answers.

Errors are in the API's words: `{"code", "detail", "fields"}` with the same stable codes
(`validation_already_running`, `unknown_revision`, `invalid_review_request`, ...). A
refusal is a tool result with `isError: true` (the protocol's tool error, which an agent
reads and acts on), never a protocol error: the agent did nothing wrong at the protocol
level. The JSON is both the text content and the structured content.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # ships no types; the SDK depends on it
import mcp_types as types
from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from mcp.shared.exceptions import MCPError
from rest_framework import exceptions as drf

from missions.errors import DomainError
from validation.mcp.context import Principal


def error_body(exc: BaseException) -> dict[str, Any] | None:
    """The API's error body for an exception it would answer, or None (a bug: re-raised)."""
    if isinstance(exc, DomainError):
        return {"code": exc.code, "detail": exc.detail, "fields": exc.fields, **exc.extra}
    if isinstance(exc, (Http404, ObjectDoesNotExist, drf.NotFound)):
        return {"code": "not_found", "detail": "not found", "fields": {}}
    if isinstance(exc, drf.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        fields: dict[str, Any] = json.loads(json.dumps(detail, default=str))
        first = next(iter(fields.items()), ("", [""]))
        return {"code": "validation_error", "detail": f"{first[0]}: {first[1]}", "fields": fields}
    if isinstance(exc, DjangoValidationError):
        messages = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return {"code": "validation_error", "detail": "; ".join(exc.messages), "fields": messages}
    if isinstance(exc, drf.PermissionDenied):
        return {"code": "permission_denied", "detail": str(exc.detail), "fields": {}}
    return None


def invalid_arguments(path: str, message: str) -> DomainError:
    return DomainError(f"{path or 'arguments'}: {message}", code="validation_error", fields={path or "": [message]})


def error_result(body: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body, default=str))],
        structured_content=body,
        is_error=True,
    )


def ok_result(body: dict[str, Any], *, text: str | None = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text if text is not None else json.dumps(body, default=str))],
        structured_content=body,
    )


def resource_not_found(uri: str) -> MCPError:
    """A resource the user may not read (or hear about): the protocol's error, never its content."""
    return MCPError(types.INVALID_PARAMS, f"not found: {uri}", {"code": "not_found"})


# A tool and its call.
@dataclass
class Call:
    """One tool call: its arguments, its principal and its way back to the client."""

    arguments: dict[str, Any]
    principal: Principal
    ctx: Any  # the SDK's ServerRequestContext: the session, progress, the HTTP request
    live: Any  # validation.mcp.live.Live (typed loosely: live imports this module)

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
