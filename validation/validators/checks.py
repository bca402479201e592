"""The `checks` validator (DESIGN §5.1): deterministic, offline, zero tokens.

Each assertion with a check is judged by running it inside the snapshot; checks of one
run execute in parallel (bounded by FUSION_CHECK_PARALLELISM). Every result is journaled.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from validation import journal
from validation.context import AssertionSpec, ValidationContext
from validation.proc import CommandError, run_command
from validation.redact import bounded, redact
from validation.verdict import AssertionVerdict, Evidence

NO_CHECK = "no check and no agent configured"
EVIDENCE_LIMIT = 4000  # what `bounded` keeps of one evidence text


def _confined(root: Path, rel: str) -> Path | None:
    try:
        target = (root / rel).resolve()
    except (ValueError, OSError):  # e.g. an embedded NUL: refuse, never crash the run
        return None
    return target if target.is_relative_to(root.resolve()) else None


def judge_file(root: Path, spec: dict[str, Any]) -> tuple[str, str, str, str]:
    """(verdict, expected, actual, evidence text)"""
    rel = spec["file"]
    target = _confined(root, rel)
    if target is None:
        return "fail", f"{rel} inside the checkout", "the path leaves the checkout; refused", f"{rel}: path escapes the checkout"
    if "exists" in spec:
        exists = target.is_file()
        want = bool(spec["exists"])
        verdict = "pass" if exists == want else "fail"
        return verdict, f"{rel} {'exists' if want else 'does not exist'}", f"{rel} {'exists' if exists else 'does not exist'}", rel
    if not target.is_file():
        return "fail", f"{rel} exists", f"{rel} does not exist", rel
    text = target.read_text(errors="replace")
    pattern = spec.get("contains", spec.get("not_contains"))
    match = re.search(pattern, text, re.M)
    if "contains" in spec:
        if match:
            line = text.count("\n", 0, match.start()) + 1
            return "pass", f"{rel} matches /{pattern}/", f"match at line {line}", f"{rel}:{line}"
        return "fail", f"{rel} matches /{pattern}/", "no match", rel
    if match:
        line = text.count("\n", 0, match.start()) + 1
        return "fail", f"{rel} has no match for /{pattern}/", f"match at line {line}: {match.group(0)[:200]}", f"{rel}:{line}"
    return "pass", f"{rel} has no match for /{pattern}/", "no match", rel


def _output_tail(output: str, limit: int) -> str:
    # Cut from the front: the end of a failing run (a test summary, a traceback) explains it.
    text = redact(output)
    if len(text) <= limit:
        return text
    return f"[… output truncated, last {limit} characters shown]\n" + text[-limit:]


def judge_run(root: Path, spec: dict[str, Any]) -> tuple[str, str, str, str]:
    timeout = min(float(spec.get("timeout", settings.FUSION_CHECK_TIMEOUT)), 3600)
    expect_exit = int(spec.get("expect_exit", 0))
    try:
        result = run_command(spec["run"], cwd=root, timeout=timeout, max_output=settings.FUSION_CHECK_OUTPUT_BYTES,
                             shell=bool(spec.get("shell", False)))
    except CommandError as exc:
        return "fail", f"`{spec['run']}` runs", str(exc), str(exc)
    tail = _output_tail(result.output, min(settings.FUSION_CHECK_OUTPUT_BYTES, EVIDENCE_LIMIT - 500))
    if result.timed_out:
        return ("fail", f"`{spec['run']}` finishes within {timeout:g}s with exit {expect_exit}",
                f"timed out after {timeout:g}s and was killed", f"timed out after {timeout:g}s (killed)\n{tail}")
    expected = f"`{spec['run']}` exits {expect_exit}"
    if result.exit_code != expect_exit:
        return "fail", expected, f"exit {result.exit_code}", f"exit {result.exit_code}\n{tail}"
    pattern = spec.get("expect_output")
    if pattern and not re.search(pattern, result.output, re.M):
        return "fail", f"{expected} and output matches /{pattern}/", f"exit {result.exit_code}; output does not match", tail
    return "pass", expected, f"exit {result.exit_code}", f"exit {result.exit_code}\n{tail}"


def judge_assertion(root: Path, assertion: AssertionSpec) -> AssertionVerdict:
    spec = assertion.check or {}
    kind = "command" if "run" in spec else "file"
    verdict, expected, actual, evidence = (judge_run if kind == "command" else judge_file)(root, spec)
    message = f"check {'passed' if verdict == 'pass' else 'failed'}: {assertion.title}"
    evidence_kind = "test-output" if kind == "command" else "file"
    if kind == "file" and (_confined(root, spec["file"]) is None or not (root / spec["file"]).is_file()):
        evidence_kind = "other"  # a `file` evidence must name a file that exists in the checkout
    return AssertionVerdict(key=assertion.key, verdict=verdict, message=message, expected=bounded(expected, 2000),
                            actual=bounded(actual, 2000),
                            evidence=[Evidence(kind=evidence_kind, text=bounded(evidence) or "(no output)")])


def _judge_journaled(ctx: ValidationContext, assertion: AssertionSpec) -> AssertionVerdict:
    if ctx.replay is not None:
        return AssertionVerdict.model_validate(ctx.replay.answer("check", assertion.key))
    close_old_connections()
    try:
        verdict = judge_assertion(ctx.checkout, assertion)
        journal.append(run_id=ctx.run_id, kind="check", key=assertion.key,
                       payload={"check": assertion.check, "result": verdict.model_dump()})
        return verdict
    finally:
        close_old_connections()


def run_checks(ctx: ValidationContext, assertions: list[AssertionSpec]) -> list[AssertionVerdict]:
    if not assertions:
        return []
    workers = max(1, min(settings.FUSION_CHECK_PARALLELISM, len(assertions)))
    if workers == 1:
        return [_judge_journaled(ctx, a) for a in assertions]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda a: _judge_journaled(ctx, a), assertions))


def blocked_without_check(assertion: AssertionSpec) -> AssertionVerdict:
    return AssertionVerdict(key=assertion.key, verdict="blocked", message=NO_CHECK,
                            evidence=[Evidence(kind="other", text=f"{assertion.key} has no check and no agent profile is configured")])
