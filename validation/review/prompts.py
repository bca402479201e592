"""What the reviewers and the evaluator are told. Fixed texts plus canonical JSON: the
same review always sends the same prompts (they are stored and hashed as artifacts)."""

from __future__ import annotations

from typing import Any

from validation.journal import canonical
from validation.review.accounting import CANDIDATE_SCHEMA

CANDIDATE_INSTRUCTIONS = f"""\
You are one of several independent reviewers of a completed code change. This is an
advisory, read-only review: never modify anything, and do not run builds, tests or
linters. Inspect the repository with the tools read, grep, find and ls (paths are
relative to the repository root) and check the change against the request: its
objective, scope and acceptance criteria. Respect the exclusions.

Answer with exactly one JSON object and nothing else:
{{"schema_version": "{CANDIDATE_SCHEMA}",
 "findings": [{{"severity": "critical" | "high" | "minor", "location": "path:line or area",
   "evidence": "what you saw in the repository", "impact": "why it matters",
   "summary": "one line"}}],
 "verified": ["statements you checked and found to hold"],
 "limitations": ["what you could not check, and why"]}}
Every string is non-blank. Use [] for an empty list. No other keys."""

EVALUATOR_INSTRUCTIONS = """\
You evaluate the reports of several anonymous reviewers (candidates A, B and C) of one
change. You have no tools and see only the input. Decide which source findings belong in
the final report, merging duplicates into groups.

Answer with exactly one JSON object and nothing else:
{"candidate_assessments": [{"candidate_id": "A", "assessment": "..."}, ...one per candidate],
 "agreements": ["..."],
 "conflicts": [{"candidate_ids": ["A", "B"], "topic": "...", "resolution": "..."}],
 "synthesis_plan": "...",
 "validation_accounting": {
   "findings": [...every object of validation_source_findings, copied exactly, unchanged...],
   "decisions": [{"source_id": "A-F001", "decision": "include", "group_id": "G1", "rationale": "..."},
                 {"source_id": "B-F001", "decision": "exclude", "rationale": "..."}],
   "groups": [{"group_id": "G1", "source_ids": ["A-F001"], "severity": "critical" | "high" | "minor",
               "summary": "...", "location": "...", "evidence": "...", "impact": "...",
               "rationale": "why this is included"}]}}
Rules the host checks: findings is an exact copy of validation_source_findings; every
source finding has exactly one decision; an included finding names a group_id, an
excluded one has no group_id; each group's source_ids are exactly the included findings
that name it; a group's severity is the highest severity of its findings; each conflict
names at least two distinct candidates. Write rationales about the findings, not about
the reviewers."""

REPAIR_INSTRUCTIONS = (
    EVALUATOR_INSTRUCTIONS
    + """

Your previous answer broke these rules. You get the original input, your invalid output
and the list of violations: answer again with one corrected JSON object."""
)


def json_text(value: Any) -> str:
    return canonical(value).decode("utf-8")


def candidate_prompt(canonical_input: dict[str, Any], *, has_repository: bool) -> str:
    where = (
        "The repository at the pinned revision is available through the tools."
        if has_repository
        else "No repository is attached to this review: judge from the request alone."
    )
    return f"{where}\n\nReview input (canonical JSON):\n{json_text(canonical_input)}"


def evaluator_prompt(blind_input: dict[str, Any]) -> str:
    return f"Evaluation input (canonical JSON):\n{json_text(blind_input)}"


def repair_prompt(blind_input: dict[str, Any], invalid_output: str, errors: list[str]) -> str:
    payload = {"original_blind_input": blind_input, "invalid_output": invalid_output, "validation_errors": errors}
    return f"Repair input (canonical JSON):\n{json_text(payload)}"
