"""The pull request's one comment, rendered from the database when it is sent (so a fix
feature made in the verdict's transaction is in it): the verdict per assertion, the
failures' expected, actual and evidence (bounded and redacted as the product redacts), the
fix feature's "Validation cause" (what an agent told "fix this" reads), and a link to the
run (docs/FORGES.md, "The comment")."""

from __future__ import annotations

import re

from forges.models import PullRequest
from forges.services.arming import run_url
from fusion_site.runtime.redact import bounded
from validation.models import FixLineage, RunStatus, ValidatorFailure, ValidatorRun

# Marks our comment among the pull request's: a creation attempted again finds it
# (`delivery._ours_already`) instead of posting a second one.
MARKER = "<!-- fusion-missions:pull-request-comment -->"
# GitHub refuses a comment past 65,536 characters; GitLab's and Gitea's limits are larger.
COMMENT_LIMIT = 60_000
FIELD_LIMIT = 1_000
EVIDENCE_LIMIT = 1_500
EVIDENCE_ITEMS = 3
CAUSE_LIMIT = 8_000
MARKS = {"pass": "✅", "fail": "❌", "blocked": "⛔"}
HEADLINES = {RunStatus.PASSED: "✅ passed", RunStatus.FAILED: "❌ failed", RunStatus.BLOCKED: "⛔ blocked"}
CAUSE_HEADING = "## Validation cause"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")[:200]


def _fenced(text: str) -> str:
    """`text` in a code block whose fence no run of backticks inside it closes."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def render(*, run_id: int, pull: PullRequest) -> str:
    run = ValidatorRun.objects.select_related("feature").get(pk=run_id)
    feature = run.feature
    headline = HEADLINES.get(RunStatus(run.status), str(run.status))
    items = (run.verdict or {}).get("assertions") or []
    passed = sum(1 for item in items if item.get("verdict") == "pass")
    lines = [
        MARKER,
        f"### Fusion Missions: `{feature.key if feature else '-'}` {headline} at `{run.revision[:12]}`",
        "",
        f"{passed}/{len(items)} assertions passed · [run {run.pk}]({run_url(run.pk)})",
        "",
    ]
    if run.status == RunStatus.BLOCKED and run.blocked_reason:
        lines += [f"**Blocked:** {bounded(run.blocked_reason, FIELD_LIMIT)}", ""]
    lines += _verdict_table(run, items)
    lines += _failures(run)
    lines += _fix_causes(run)
    text = "\n".join(lines).rstrip() + "\n"
    return text if len(text) <= COMMENT_LIMIT else text[: COMMENT_LIMIT - 40] + "\n\n[… cut: see the run page]\n"


def _verdict_table(run: ValidatorRun, items: list[dict]) -> list[str]:
    if not items:
        return []
    titles = {a.get("key"): a.get("title", "") for a in run.assertions or []}
    lines = ["| | assertion | |", "|---|---|---|"]
    for item in items:
        key = item.get("key", "")
        note = item.get("message", "") if item.get("verdict") != "pass" else ""
        lines.append(
            f"| {MARKS.get(item.get('verdict', ''), '?')} | `{_cell(key)}` {_cell(titles.get(key, ''))} "
            f"| {_cell(bounded(note, 200))} |"
        )
    return [*lines, ""]


def _failures(run: ValidatorRun) -> list[str]:
    lines: list[str] = []
    for failure in ValidatorFailure.objects.filter(run=run).order_by("id"):
        lines += [f"#### ❌ `{_cell(failure.assertion_key)}`", ""]
        if failure.message:
            lines += [bounded(failure.message, FIELD_LIMIT), ""]
        lines += [
            f"- **expected:** {_cell(bounded(failure.expected, FIELD_LIMIT)) if failure.expected else '-'}",
            f"- **actual:** {_cell(bounded(failure.actual, FIELD_LIMIT)) if failure.actual else '-'}",
            "",
        ]
        for evidence in (failure.evidence or [])[:EVIDENCE_ITEMS]:
            text = bounded(str(evidence.get("text", "")), EVIDENCE_LIMIT)
            lines += [
                f"<details><summary>evidence ({_cell(evidence.get('kind', ''))})</summary>",
                "",
                _fenced(text),
                "",
                "</details>",
                "",
            ]
    return lines


def _fix_causes(run: ValidatorRun) -> list[str]:
    """Each fix feature made from this run, with its description's "Validation cause"."""
    lines: list[str] = []
    for lineage in FixLineage.objects.filter(run=run).select_related("fix").order_by("id"):
        fix = lineage.fix
        description = fix.description or ""
        at = description.find(CAUSE_HEADING)
        cause = description[at + len(CAUSE_HEADING) :] if at >= 0 else description
        lines += [
            f"### Fix feature `{fix.key}`: {_cell(fix.title)}",
            "",
            "#### Validation cause",
            "",
            bounded(cause.strip(), CAUSE_LIMIT),
            "",
        ]
    return lines
