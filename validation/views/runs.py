"""Validator run page (verdict, failures, journal timeline) and review page (progress,
then the verified report)."""

from __future__ import annotations

import hashlib

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render
from django.utils.html import escape
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_safe

from validation import selectors
from validation.journal import verify_chain
from validation.models import Review, ReviewState, ValidatorRun
from validation.views import common

# --- validator runs ----------------------------------------------------------------------


def _run(request, pk: int):
    qs = selectors.visible_runs(user=request.user).select_related(
        "mission", "feature", "milestone", "requested_by", "reused_from"
    )
    run = get_object_or_404(qs, pk=pk)
    run.duration_text = common.duration_text(run.duration_seconds)
    return run


def _verdict(run) -> dict:
    verdict = run.verdict if isinstance(run.verdict, dict) else {}
    items = [a for a in verdict.get("assertions", []) if isinstance(a, dict)]
    return {"verdict": verdict, "verdict_items": items, "failures": list(run.failures.select_related("assertion"))}


def _journal(run) -> dict:
    entries = selectors.run_journal(run=run)
    return {
        "journal": entries,
        "chain": verify_chain(run.pk) if entries else None,
        "replay_url": common.api_url("validatorrun-replay", run.pk),
    }


RUN_PARTS = {
    "summary": ("validation/_run_summary.html", lambda r: {}),
    "verdict": ("validation/_run_verdict.html", _verdict),
    "journal": ("validation/_run_journal.html", _journal),
}


def _mission_of_run(pk: int) -> int:
    return ValidatorRun.objects.filter(pk=pk).values_list("mission_id", flat=True).first() or 0


run_detail, run_part = common.object_pages(
    noun="run", template="validation/run_detail.html", parts=RUN_PARTS, load=_run, mission_of=_mission_of_run
)


# --- reviews -----------------------------------------------------------------------------

REPORT_NAME = "report.md"


def _review(request, pk: int):
    qs = selectors.visible_reviews(user=request.user).select_related("mission", "feature", "created_by")
    return get_object_or_404(qs, pk=pk)


def _render_markdown(text: str) -> str:
    """CommonMark with raw HTML disabled (escaped), so the report cannot inject markup."""
    # Imported on use: markdown-it-py is no declared dependency (it comes with rich), so
    # its absence falls back to escaped text instead of breaking the module's import.
    try:
        from markdown_it import MarkdownIt
    except ImportError:  # pragma: no cover - markdown-it-py comes with rich
        return f"<pre>{escape(text)}</pre>"
    return MarkdownIt("commonmark", {"html": False}).render(text)


def _artifacts(review) -> dict:
    artifacts = list(review.artifacts.order_by("id"))
    for a in artifacts:
        data = a.content.encode("utf-8")
        a.verified = len(data) == a.byte_length and hashlib.sha256(data).hexdigest() == a.sha256
    report = next((a for a in artifacts if a.name == REPORT_NAME), None)
    context = {"artifacts": artifacts, "report": report, "report_html": None}
    if review.state == "completed" and report is not None and report.verified:
        context["report_html"] = mark_safe(_render_markdown(report.content))  # noqa: S308 - html disabled above
    return context


def _review_context(review) -> dict:
    order = [s.value for s in ReviewState if s not in (ReviewState.FAILED, ReviewState.CANCELLED)]
    current = order.index(review.state) if review.state in order else None
    steps = [
        {
            "state": s,
            "label": common.label(s),
            "done": current is not None and (i < current or review.state == "completed"),
            "current": s == review.state,
        }
        for i, s in enumerate(order)
    ]
    return {"steps": steps, **_artifacts(review)}


@login_required
@require_safe
def review_detail(request, pk: int):
    mission_id = Review.objects.filter(pk=pk).values_list("mission_id", flat=True).first()
    live = common.mission_live(mission_id) if mission_id else {}
    review = _review(request, pk)
    return render(request, "validation/review_detail.html", {**live, "review": review, **_review_context(review)})


@login_required
@require_safe
def review_part(request, pk: int):
    review = _review(request, pk)
    return common.fragment(request, "validation/_review.html", {"review": review, **_review_context(review)})
