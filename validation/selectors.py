"""Reads over validator runs."""

from __future__ import annotations

from django.db.models import QuerySet

from validation.models import RunStatus, ValidatorRun


def consecutive_errors(runs: QuerySet[ValidatorRun], *, window: int = 10) -> int:
    """How many of the newest runs in `runs` ended in `error`, back to the last one that did not."""
    count = 0
    for status in runs.order_by("-id").values_list("status", flat=True)[:window]:
        if status != RunStatus.ERROR:
            break
        count += 1
    return count
