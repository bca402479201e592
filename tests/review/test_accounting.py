"""Host rules as pure functions: candidate parsing (strict, the one fenced recovery) and
the evaluator's accounting."""

from __future__ import annotations

import copy
import json

import pytest

from tests.review.support import VIOLATIONS, candidate_answer, fenced, finding, good_evaluation
from validation.review.accounting import check_evaluation
from validation.review.candidates import MAX_PREAMBLE_BYTES, parse_candidate, source_findings

MAX = 48 * 1024
GOOD = candidate_answer([finding("Bug")], verified=["v"], limitations=["l"])


def test_strict_json_is_accepted_and_normalized():
    parsed = parse_candidate("  " + candidate_answer([finding("  Bug  ")]) + "\n", max_bytes=MAX)
    assert parsed.ok and not parsed.recovered
    assert parsed.report["findings"][0]["summary"] == "Bug"


@pytest.mark.parametrize(
    "text",
    [
        fenced(GOOD),
        fenced(GOOD, preamble=""),
        fenced(GOOD, preamble="x" * MAX_PREAMBLE_BYTES),
        "Here you go:\n```json\n" + GOOD + "\n```",
    ],
)
def test_one_fence_with_a_short_preamble_is_recovered(text):
    parsed = parse_candidate(text, max_bytes=MAX)
    assert parsed.ok and parsed.recovered
    assert parsed.recovery["rule"] == "single ```json fence"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (fenced(GOOD, preamble="x" * (MAX_PREAMBLE_BYTES + 1)), "more than 2000"),
        (fenced(GOOD) + "Anything after the fence.", "not a JSON document"),
        (fenced(GOOD) + fenced(GOOD), "not a JSON document"),
        ("```\n" + GOOD + "\n```", "not a JSON document"),  # not a json fence
        ("Intro ```python\nx\n```\n" + fenced(GOOD, preamble=""), "not a JSON document"),
        (fenced("{not json}"), "the fenced block"),
        ("I reviewed it, all fine.", "not a JSON document"),
        ('{"findings": [], "verified": [], "limitations": [], "findings": []}', "duplicate keys"),
        ('{"findings": [], "verified": [NaN], "limitations": []}', "NaN is not JSON"),
        ('{"findings": [], "verified": ["\\ud800"], "limitations": []}', "lone surrogate"),
    ],
)
def test_everything_else_is_unusable(text, problem):
    parsed = parse_candidate(text, max_bytes=MAX)
    assert not parsed.ok
    assert any(problem in p for p in parsed.problems), parsed.problems
    assert parsed.report == {"findings": [], "verified": [], "limitations": []}


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"findings": [], "verified": []}, "limitations is required"),
        ({"findings": [], "verified": [], "limitations": [], "notes": "x"}, "unknown key 'notes'"),
        (
            {"findings": [{**finding("x"), "severity": "major"}], "verified": [], "limitations": []},
            "findings[0].severity must be one of critical, high, minor",
        ),
        (
            {"findings": [{**finding("x"), "summary": " "}], "verified": [], "limitations": []},
            "findings[0].summary must be a non-blank string",
        ),
        ({"findings": [{**finding("x"), "line": 3}], "verified": [], "limitations": []}, "unknown key 'line'"),
        ({"findings": [], "verified": [""], "limitations": []}, "verified[0] must be a non-blank string"),
        ({"schema_version": "v0", "findings": [], "verified": [], "limitations": []}, "schema_version must be"),
        ([], "one JSON object"),
    ],
)
def test_the_candidate_contract_is_closed(doc, problem):
    parsed = parse_candidate(json.dumps(doc), max_bytes=MAX)
    assert not parsed.ok and any(problem in p for p in parsed.problems), parsed.problems


def test_an_answer_over_the_size_cap_is_unusable():
    parsed = parse_candidate(candidate_answer([finding("x" * 2000)]), max_bytes=1024)
    assert not parsed.ok and "more than 1024" in parsed.problems[0]


def test_source_ids_follow_position_per_label_in_label_order():
    reports = {
        "B": {"findings": [finding("b1"), finding("b2")]},
        "A": {"findings": [finding("a1")]},
        "C": {"findings": []},
    }
    assert [f["source_id"] for f in source_findings(reports)] == ["A-F001", "B-F001", "B-F002"]


def blind():
    findings = source_findings(
        {
            "A": {"findings": [finding("a1", location="x.py"), finding("a2", location="y.py")]},
            "B": {"findings": [finding("b1", location="x.py")]},
            "C": {"findings": []},
        }
    )
    return {"candidates": [{"candidate_id": c} for c in "ABC"], "validation_source_findings": findings}


def test_a_correct_accounting_passes():
    b = blind()
    assert check_evaluation(good_evaluation(b), b["validation_source_findings"]) == []


@pytest.mark.parametrize("rule", sorted(VIOLATIONS))
def test_each_rule_is_enforced(rule):
    mutate, message = VIOLATIONS[rule]
    b = blind()
    doc = good_evaluation(b)
    mutate(doc["validation_accounting"])
    errors = check_evaluation(doc, b["validation_source_findings"])
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["validation_accounting"]["findings"].pop(), "is missing source finding B-F001"),
        (lambda d: d["validation_accounting"]["groups"].pop(), "which is not in groups"),
        (lambda d: d["validation_accounting"]["groups"][0].update(severity="minor"), "the highest severity"),
        (
            lambda d: d["validation_accounting"]["groups"].append(
                copy.deepcopy(d["validation_accounting"]["groups"][0])
            ),
            "is used twice",
        ),
        (
            lambda d: d["validation_accounting"]["decisions"][0].update(decision="keep"),
            "must be 'include' or 'exclude'",
        ),
        (lambda d: d["validation_accounting"]["decisions"][0].update(source_id="Z-F001"), "unknown source finding"),
        (lambda d: d["validation_accounting"]["decisions"][0].update(rationale=""), "needs a non-blank rationale"),
        (lambda d: d.update(candidate_assessments=d["candidate_assessments"][:2]), "exactly once"),
        (lambda d: d.update(conflicts=[{"candidate_ids": ["A", "A"]}]), "at least two distinct candidates"),
        (lambda d: d.pop("validation_accounting"), "validation_accounting is required"),
    ],
)
def test_more_rules(mutate, message):
    b = blind()
    doc = good_evaluation(b)
    mutate(doc)
    errors = check_evaluation(doc, b["validation_source_findings"])
    assert any(message in e for e in errors), errors


def test_errors_are_bounded_in_count_and_length():
    b = blind()
    b["validation_source_findings"] = [
        {**finding("x" * 900, location=f"f{i}.py"), "source_id": f"A-F{i + 1:03d}"} for i in range(50)
    ]
    doc = good_evaluation(b)
    doc["validation_accounting"]["decisions"] = []
    errors = check_evaluation(doc, b["validation_source_findings"])
    assert len(errors) <= 25 and errors[-1].endswith("more violations")
    assert all(len(e) <= 500 for e in errors) and sum(len(e) for e in errors[:-1]) <= 4000
