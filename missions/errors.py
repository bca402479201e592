"""Domain errors with a stable `code` and the HTTP status the API answers with.

Services raise these; the API's single exception handler renders them as
`{"code", "detail", "fields"}`; the CLI prints `detail`.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        fields: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if code:
            self.code = code
        self.fields = fields or {}
        self.extra = extra or {}


class Invalid(DomainError):
    status = 400
    code = "invalid"


class Forbidden(DomainError):
    status = 403
    code = "forbidden"


class StaffOnly(Forbidden):
    code = "staff_only"


class NotFound(DomainError):
    status = 404
    code = "not_found"


class Conflict(DomainError):
    status = 409
    code = "conflict"


class IllegalTransition(Conflict):
    code = "illegal_transition"
