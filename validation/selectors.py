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


JUDGED = (RunStatus.PASSED, RunStatus.FAILED, RunStatus.BLOCKED)


def newest_judged_run(*, feature_id: int, fingerprint: str) -> ValidatorRun | None:
    """The newest run on exactly this input that reached a verdict (errors and
    cancellations say nothing about the code)."""
    return (
        ValidatorRun.objects.filter(feature_id=feature_id, input_fingerprint=fingerprint, status__in=JUDGED)
        .order_by("-id")
        .first()
    )


def feature_revision(feature) -> str:
    """The revision a feature stands on: the newest of its own tasks' landed revisions and
    the revisions at which its fixes passed. Every path that judges a feature uses this
    (docs/TRUTH.md): a root whose fix passed is never re-judged on its pre-fix code."""
    from missions.models import TaskStatus
    from validation.models import FixLineage

    candidates = []
    task = feature.tasks.filter(status=TaskStatus.DONE).exclude(revision="").order_by("-finished_at", "-id").first()
    if task is not None:
        candidates.append((task.finished_at, task.revision))
    fixes = FixLineage.objects.filter(root=feature).values_list("fix_id", flat=True)
    fixed = (
        ValidatorRun.objects.filter(feature_id__in=fixes, status=RunStatus.PASSED)
        .exclude(revision="")
        .order_by("-completed_at", "-id")
        .first()
    )
    if fixed is not None:
        candidates.append((fixed.completed_at, fixed.revision))
    if not candidates:
        return ""
    return max(candidates, key=lambda c: c[0])[1]
