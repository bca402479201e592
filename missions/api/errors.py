"""One exception handler: every API error is `{"code", "detail", "fields"}`."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation, TooManyFieldsSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from missions.errors import DomainError

_CODES = {
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    exceptions.ParseError: "parse_error",
    exceptions.ValidationError: "validation_error",
}


def _first_message(fields) -> str:
    if isinstance(fields, dict):
        for key, value in fields.items():
            return f"{key}: {_first_message(value)}"
    if isinstance(fields, list) and fields:
        return _first_message(fields[0])
    return str(fields)


def exception_handler(exc, context):
    if isinstance(exc, (RequestDataTooBig, TooManyFieldsSent)):
        # Raised while DRF reads the body: without this the request ends as Django's HTML 400.
        return Response(
            {"code": "request_too_large", "detail": str(exc), "fields": {}},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, SuspiciousOperation):
        return Response(
            {"code": "bad_request", "detail": "the request was refused as malformed", "fields": {}},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, DomainError):
        body = {"code": exc.code, "detail": exc.detail, "fields": exc.fields, **exc.extra}
        return Response(body, status=exc.status)
    if isinstance(exc, DjangoValidationError):
        fields = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(
            {"code": "validation_error", "detail": _first_message(fields), "fields": fields},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), "error")
    if isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = {"code": code, "detail": _first_message(errors), "fields": errors}
    else:
        response.data = {"code": code, "detail": str(getattr(exc, "detail", exc)), "fields": {}}
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        # DRF answers 403 when the first authenticator (session) offers no challenge;
        # a missing or bad credential is a 401, with the token scheme as its challenge.
        response.status_code = status.HTTP_401_UNAUTHORIZED
        response["WWW-Authenticate"] = "Token"
    return response


_STATUS_CODES = {
    400: "bad_request",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
}


class JsonApiErrorsMiddleware:
    """Errors under /api/ that never reach a DRF view (a URL no route matches, a body
    Django refuses before the view) are HTML pages by default; API clients get the same
    JSON shape as every other error instead."""

    prefix = "/api/"

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            request.path.startswith(self.prefix)
            and 400 <= response.status_code < 500
            and not response.get("Content-Type", "").startswith("application/json")
            and not getattr(response, "streaming", False)
        ):
            code = _STATUS_CODES.get(response.status_code, "error")
            replaced = JsonResponse(
                {"code": code, "detail": code.replace("_", " "), "fields": {}}, status=response.status_code
            )
            for header in ("Allow", "WWW-Authenticate"):
                if header in response:
                    replaced[header] = response[header]
            return replaced
        return response
