"""Static files served by the application itself.

The embedded server is Daphne alone (no web server in front), and Daphne does not serve
static files: without this, the dashboard's stylesheet and script (and the admin's)
would be missing whenever DEBUG is off. A deployment with a proxy may serve
`collectstatic`'s output itself and never reach this view. Files are small: they are
read whole (a streamed file response would make Django's ASGI handler iterate a
synchronous file in the event loop)."""

from __future__ import annotations

import mimetypes
import posixpath
from pathlib import Path

from django.contrib.staticfiles import finders
from django.http import Http404, HttpResponse, HttpResponseNotModified
from django.utils.http import http_date
from django.views.decorators.http import require_safe
from django.views.static import was_modified_since


@require_safe
def static_file(request, path: str):
    normalized = posixpath.normpath(path).lstrip("/")
    found = None if normalized.startswith("..") else finders.find(normalized)
    if not found:
        raise Http404("no such static file")
    file = Path(found)
    stat = file.stat()
    if not was_modified_since(request.META.get("HTTP_IF_MODIFIED_SINCE"), stat.st_mtime):
        return HttpResponseNotModified()
    content_type, encoding = mimetypes.guess_type(str(file))
    response = HttpResponse(file.read_bytes(), content_type=content_type or "application/octet-stream")
    response["Last-Modified"] = http_date(stat.st_mtime)
    response["Cache-Control"] = "public, max-age=300"
    if encoding:
        response["Content-Encoding"] = encoding
    return response
