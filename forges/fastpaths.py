"""The forges floor's one fast path (docs/ARCHITECTURE.md, "Private internals"): the
mission's forge, read at every run's start and end, compiled once per process as the
loop's other per-feature reads are (docs/BENCHMARKS.md, "Loop throughput"). With
`FUSION_FAST_PATHS=off` it is the plain queryset."""

from __future__ import annotations

from typing import Any

from forges.models import Forge
from fusion_site.runtime.prepared import Prepared

FORGE_FIELDS = ("id", "provider", "api_url", "repository", "statuses", "comments", "context")
_FORGE: Prepared[tuple] = Prepared(
    lambda mission_id: Forge.objects.filter(mission_id=mission_id).values_list(*FORGE_FIELDS)
)


def forge_row(*, mission_id: int) -> dict[str, Any] | None:
    """The mission's forge as `FORGE_FIELDS`, or None: the one query a mission without a
    forge costs a run's start and end."""
    row = _FORGE.first(mission_id=mission_id)
    return dict(zip(FORGE_FIELDS, row, strict=True)) if row is not None else None
