"""`checks` alone, and `composite` (the default): checks judge the assertions that have a
check; an agent profile (option `agent`) judges the rest, or they are blocked. Whatever
the kind, the host runs every declared check itself (`with_declared_checks`)."""

from __future__ import annotations

from typing import Any

from validation import profiles
from validation.context import ValidationContext, ValidatorCrashed
from validation.validators import Judgement
from validation.validators.checks import blocked_without_check, run_checks, run_checks_last
from validation.verdict import AssertionVerdict, Verdict, normalize


def _document(items) -> dict:
    order = {a.key: i for i, a in enumerate(items)}
    verdict = normalize(Verdict(status="pass", assertions=sorted(items, key=lambda a: order[a.key])))
    counts = {v: sum(1 for a in verdict.assertions if a.verdict == v) for v in ("pass", "fail", "blocked")}
    summary = f"{counts['pass']} passed, {counts['fail']} failed, {counts['blocked']} blocked"
    return verdict.model_copy(update={"summary": summary}).model_dump()


def judge_checks_only(ctx: ValidationContext) -> Judgement:
    with_check = [a for a in ctx.assertions if a.check]
    verdicts, file_refs = run_checks_last(ctx, with_check)  # nothing but host validation reads the tree after
    results = {v.key: v for v in verdicts}
    items = [results.get(a.key) or blocked_without_check(a) for a in ctx.assertions]
    return Judgement(_document(items), file_refs=file_refs)


def judge_composite(ctx: ValidationContext) -> Judgement:
    agent_name = ctx.profile.get("agent")
    rest = [a for a in ctx.assertions if not a.check]
    if not agent_name or not rest:
        return judge_checks_only(ctx)
    # The package's dispatcher imports the kinds (this module among them) on use.
    from validation.validators import judge as dispatch

    results = {v.key: v for v in run_checks(ctx, [a for a in ctx.assertions if a.check])}
    try:
        agent_profile = profiles.get_profile(agent_name)
    except profiles.ProfileError as exc:
        raise ValidatorCrashed(str(exc), code="misconfigured") from exc
    sub = ValidationContext(**{**ctx.__dict__, "assertions": rest, "profile": agent_profile})
    judged = dispatch(sub)
    for item in judged.candidate.get("assertions", []):
        results.setdefault(item["key"], AssertionVerdict.model_validate(item))
    items = [results.get(a.key) or blocked_without_check(a) for a in ctx.assertions]
    return Judgement(_document(items), judged.tokens_in, judged.tokens_out)


def with_declared_checks(ctx: ValidationContext, judged: Judgement) -> Judgement:
    """An `agent` or `command` validator's verdict, with every declared check run by the
    host: a check that does not pass is final (no model answer turns it into a pass); on a
    passing check a model's fail still stands (the statement may say more than the check),
    a model's blocked does not (the check decided); the model's evidence is kept
    (docs/TRUTH.md). A candidate without an assertion list is left to host validation."""
    with_check = [a for a in ctx.assertions if a.check]
    items = judged.candidate.get("assertions") if isinstance(judged.candidate, dict) else None
    if not with_check or not isinstance(items, list):
        return judged
    checked = {v.key: v for v in run_checks(ctx, with_check)}

    def own_check(item: dict[str, Any]) -> AssertionVerdict | None:
        key = item.get("key")  # anything but a string: no check of ours; host validation rejects it
        return checked.pop(key, None) if isinstance(key, str) else None

    merged = [_merge(item, own_check(item)) if isinstance(item, dict) else item for item in items]
    merged += [v.model_dump() for v in checked.values()]  # checked assertions the model left out
    return Judgement({**judged.candidate, "assertions": merged}, judged.tokens_in, judged.tokens_out)


def _merge(item: dict, check) -> dict:
    if check is None:
        return item
    evidence = [e for e in item.get("evidence", []) if isinstance(e, dict)]
    if check.verdict == "pass" and item.get("verdict") == "fail":
        return {**item, "evidence": evidence + [e.model_dump() for e in check.evidence]}
    return {**check.model_dump(), "evidence": [e.model_dump() for e in check.evidence] + evidence}
