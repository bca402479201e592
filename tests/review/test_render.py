"""The host-rendered report: deterministic Markdown from the accounting."""

from __future__ import annotations

from validation.review.render import (
    NO_EXCLUSIONS,
    NO_FINDINGS,
    NO_LIMITATIONS,
    NO_VERIFIED,
    render_report,
    sanitize,
    sanitize_rationale,
)


def src(sid, summary, *, severity="high", location="app.py:1"):
    return {
        "source_id": sid,
        "severity": severity,
        "location": location,
        "evidence": f"evidence of {summary}",
        "impact": f"impact of {summary}",
        "summary": summary,
    }


def group(gid, ids, *, severity="high", location="app.py:1", summary="S", rationale="Confirmed."):
    return {
        "group_id": gid,
        "source_ids": ids,
        "severity": severity,
        "summary": summary,
        "location": location,
        "evidence": "Evidence.",
        "impact": "Impact.",
        "rationale": rationale,
    }


def include(sid, gid, rationale="Confirmed."):
    return {"source_id": sid, "decision": "include", "group_id": gid, "rationale": rationale}


def exclude(sid, rationale="Not reproducible."):
    return {"source_id": sid, "decision": "exclude", "rationale": rationale}


def test_two_findings_merged_in_one_group_give_one_block_with_the_group_severity():
    accounting = {
        "findings": [
            src("A-F001", "Minor wording", severity="minor"),
            src("B-F001", "Wrong greeting", severity="critical"),
        ],
        "decisions": [include("A-F001", "G1"), include("B-F001", "G1")],
        "groups": [group("G1", ["A-F001", "B-F001"], severity="critical", summary="Wrong greeting")],
    }
    report = render_report(accounting=accounting, verified=[], limitations=[])
    assert report.count("### ") == 1
    assert "### critical: Wrong greeting\n" in report
    assert "Minor wording" not in report


def test_the_whole_report_is_exact_and_deterministic():
    accounting = {
        "findings": [
            src("A-F001", "b"),
            src("B-F001", "dropped", severity="minor", location="z.py"),
            src("C-F001", "a"),
        ],
        "decisions": [
            include("A-F001", "G2"),
            exclude("B-F001", "Candidate A: duplicates A-F001."),
            include("C-F001", "G1"),
        ],
        "groups": [
            group("G2", ["A-F001"], location="b.py", summary="Second"),
            group("G1", ["C-F001"], severity="critical", location="z.py", summary="First"),
        ],
    }
    report = render_report(
        accounting=accounting, verified=["hello() exists"], limitations=["No CI."], revision="abc123"
    )
    assert report == (
        "# Validation report\n\n"
        "Advisory, read-only review of revision `abc123`.\n\n"
        "## Findings\n\n"
        "### critical: First\n\n"
        "- Location: z.py\n- Evidence: Evidence.\n- Impact: Impact.\n- Inclusion rationale: Confirmed.\n\n"
        "### high: Second\n\n"
        "- Location: b.py\n- Evidence: Evidence.\n- Impact: Impact.\n- Inclusion rationale: Confirmed.\n\n"
        "## Excluded source findings\n\n"
        "- minor: dropped (z.py). Excluded: duplicates source finding.\n\n"
        "## Verified\n\n- hello() exists\n\n"
        "## Limitations\n\n- No CI.\n"
    )
    reordered = {k: list(reversed(v)) for k, v in accounting.items()}
    assert (
        render_report(accounting=reordered, verified=["hello() exists"], limitations=["No CI."], revision="abc123")
        == report
    )


def test_groups_sort_by_severity_then_location_then_id_in_code_point_order():
    accounting = {
        "findings": [],
        "decisions": [],
        "groups": [
            group("g2", [], severity="high", location="a.py", summary="h-a-g2"),
            group("G9", [], severity="high", location="a.py", summary="h-a-G9"),
            group("G1", [], severity="high", location="B.py", summary="h-B"),
            group("G0", [], severity="minor", location="A.py", summary="m"),
            group("G5", [], severity="critical", location="z.py", summary="c"),
        ],
    }
    report = render_report(accounting=accounting, verified=[], limitations=[])
    order = [line.split(": ", 1)[1] for line in report.splitlines() if line.startswith("### ")]
    assert order == ["c", "h-B", "h-a-G9", "h-a-g2", "m"]  # "B" < "a" and "G" < "g" by code point


def test_everything_excluded():
    accounting = {
        "findings": [src("A-F002", "two"), src("A-F001", "one")],
        "decisions": [exclude("A-F002", "Out of scope."), exclude("A-F001", "Wrong.")],
        "groups": [],
    }
    report = render_report(accounting=accounting, verified=[], limitations=[])
    assert f"## Findings\n\n{NO_FINDINGS}\n" in report
    excluded = report.split("## Excluded source findings\n\n")[1].split("\n\n")[0].splitlines()
    assert excluded == ["- high: one (app.py:1). Excluded: Wrong.", "- high: two (app.py:1). Excluded: Out of scope."]


def test_empty_sections_have_fixed_sentences():
    report = render_report(accounting={"findings": [], "decisions": [], "groups": []}, verified=[], limitations=[])
    assert report == (
        f"# Validation report\n\nAdvisory, read-only review.\n\n## Findings\n\n{NO_FINDINGS}\n\n"
        f"## Excluded source findings\n\n{NO_EXCLUSIONS}\n\n## Verified\n\n{NO_VERIFIED}\n\n"
        f"## Limitations\n\n{NO_LIMITATIONS}\n"
    )


def test_labels_and_source_ids_are_sanitized_from_rationales():
    rationale = (
        "A: candidate B found it and Candidate C's report agrees; reviewers A and C disagree with "
        "B-F002. A and B overlap."
    )
    accounting = {
        "findings": [src("B-F002", "x")],
        "decisions": [include("B-F002", "G1", rationale)],
        "groups": [group("G1", ["B-F002"], rationale=rationale, summary="Seen by candidate A (A-F001)")],
    }
    report = render_report(accounting=accounting, verified=[], limitations=[])
    assert (
        "- Inclusion rationale: one reviewer found it and one reviewer's report agrees; several reviewers "
        "disagree with source finding. several reviewers overlap." in report
    )
    assert "### high: Seen by one reviewer (source finding)" in report
    for leaked in ("A-F001", "B-F002", "candidate B", "Candidate C", "A:"):
        assert leaked not in report


def test_sanitize_keeps_ordinary_text():
    text = "A list of values: see app.py:1 and B.py; A bug in C code."
    assert sanitize(text) == text
    assert sanitize_rationale("A bug in the code.") == "A bug in the code."


def test_multiline_text_stays_inside_its_bullet_and_headings_stay_one_line():
    accounting = {
        "findings": [],
        "decisions": [],
        "groups": [{**group("G1", []), "summary": "two\nlines", "evidence": "line 1\n## not a heading\nline 3"}],
    }
    report = render_report(accounting=accounting, verified=[], limitations=[])
    assert "### high: two lines\n" in report
    assert "- Evidence: line 1\n  ## not a heading\n  line 3\n" in report
