"""What every dashboard page shows: a warning while checks run unsandboxed (docs/SANDBOX.md)."""

from typing import Any

from django.http import HttpRequest

from fusion_site.runtime import sandbox


def sandbox_status(request: HttpRequest) -> dict[str, Any]:
    current = sandbox.status()
    return {"sandbox_status": current}
