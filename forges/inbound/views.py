"""`/hooks/<provider>/<mission key>/`: no session, no token, no CSRF token; the signature
is the authentication (`receive`)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from forges.inbound.receive import delivery_receive


def _content_length(request: HttpRequest) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None


@csrf_exempt
@require_POST
def hook(request: HttpRequest, provider: str, mission_key: str) -> JsonResponse:
    answer = delivery_receive(
        provider=provider,
        mission_key=mission_key,
        headers=request.headers,
        stream=request,  # read once, bounded: never `request.body`
        content_length=_content_length(request),
    )
    return JsonResponse(answer.body, status=answer.status)
