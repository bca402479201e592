"""The report, rendered by the host from the accepted accounting: deterministic Markdown.

Same accounting in, same bytes out. Groups are sorted by severity, location and group
id (code-point order); excluded findings by source id; empty sections get fixed
sentences. Reviewer labels and host source ids never reach the reader: the evaluator's
text is sanitized (ids -> "source finding", "candidate A" -> "one reviewer", "A:"
prefixes removed from rationales).
"""

from __future__ import annotations

import re
from typing import Any

from validation.review.candidates import LABELS, SEVERITY_RANK

TITLE = "# Validation report"
NO_FINDINGS = "No findings were included."
NO_EXCLUSIONS = "No source findings were excluded."
NO_VERIFIED = "No statement was reported as verified."
NO_LIMITATIONS = "No limitations were reported."

_L = "".join(LABELS)
_SOURCE_ID = re.compile(rf"\b[{_L}]-F\d{{3,}}\b")
_SEVERAL = re.compile(rf"\b(?:candidates|reviewers)\s+[{_L}](?:\s*(?:,|and|&)\s*[{_L}])+\b", re.IGNORECASE)
_ONE = re.compile(rf"\b(?:candidate|reviewer)(?:\s+report)?\s+[{_L}]\b('s)?", re.IGNORECASE)
_BARE_LABELS = re.compile(rf"(?<![\w-])[{_L}](?:\s*(?:,|and|&|/)\s*[{_L}])+(?![\w-])")
_PREFIX = re.compile(rf"(?m)(^|(?<=[.;]\s))(?:(?i:candidate|reviewer)\s+)?[{_L}]:\s*")


def sanitize(text: str) -> str:
    """Remove reviewer labels and source ids from free text written about them."""
    text = _SOURCE_ID.sub("source finding", text)
    text = _SEVERAL.sub("several reviewers", text)
    text = _ONE.sub(lambda m: "one reviewer" + (m.group(1) or ""), text)
    return text


def sanitize_rationale(text: str) -> str:
    text = sanitize(_PREFIX.sub(lambda m: m.group(1), text))
    return _BARE_LABELS.sub("several reviewers", text)


def _line(text: str) -> str:
    """One-line fields (headings, locations) must not break the Markdown structure."""
    return " ".join(text.split())


def _block(text: str) -> str:
    """Multi-line fields are indented under their bullet."""
    lines = text.strip().splitlines() or [""]
    return "\n".join([lines[0], *("  " + line if line.strip() else "" for line in lines[1:])])


def _group_key(group: dict[str, Any]):
    return SEVERITY_RANK[group["severity"]], group["location"], group["group_id"]


def render_report(
    *, accounting: dict[str, Any], verified: list[str], limitations: list[str], revision: str = ""
) -> str:
    out = [TITLE, ""]
    out.append("Advisory, read-only review" + (f" of revision `{revision}`." if revision else "."))
    out += ["", "## Findings", ""]
    groups = sorted(accounting["groups"], key=_group_key)
    if not groups:
        out += [NO_FINDINGS, ""]
    for group in groups:
        out += [
            f"### {group['severity']}: {_line(sanitize(group['summary']))}",
            "",
            f"- Location: {_line(sanitize(group['location']))}",
            f"- Evidence: {_block(sanitize(group['evidence']))}",
            f"- Impact: {_block(sanitize(group['impact']))}",
            f"- Inclusion rationale: {_block(sanitize_rationale(group['rationale']))}",
            "",
        ]
    out += ["## Excluded source findings", ""]
    findings = {f["source_id"]: f for f in accounting["findings"]}
    excluded = sorted((d for d in accounting["decisions"] if d["decision"] == "exclude"), key=lambda d: d["source_id"])
    if not excluded:
        out += [NO_EXCLUSIONS, ""]
    else:
        for decision in excluded:
            finding = findings[decision["source_id"]]
            out.append(
                f"- {finding['severity']}: {_line(sanitize(finding['summary']))} "
                f"({_line(sanitize(finding['location']))}). "
                f"Excluded: {_block(sanitize_rationale(decision['rationale']))}"
            )
        out.append("")
    out += _bullets("## Verified", verified, NO_VERIFIED)
    out += _bullets("## Limitations", limitations, NO_LIMITATIONS)
    return "\n".join(out).rstrip("\n") + "\n"


def _bullets(heading: str, items: list[str], empty: str) -> list[str]:
    out = [heading, ""]
    if not items:
        return out + [empty, ""]
    return out + [f"- {_block(sanitize(item))}" for item in items] + [""]


def unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))  # first occurrences, in order
