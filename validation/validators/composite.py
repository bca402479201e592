"""`checks` alone, and `composite` (the default): checks judge the assertions that have a
check; an agent profile (option `agent`) judges the rest, or they are blocked."""

from __future__ import annotations

from validation import profiles
from validation.context import ValidationContext, ValidatorCrashed
from validation.validators import Judgement
from validation.validators.checks import blocked_without_check, run_checks
from validation.verdict import Verdict, normalize


def _document(items) -> dict:
    order = {a.key: i for i, a in enumerate(items)}
    verdict = normalize(Verdict(status="pass", assertions=sorted(items, key=lambda a: order[a.key])))
    counts = {v: sum(1 for a in verdict.assertions if a.verdict == v) for v in ("pass", "fail", "blocked")}
    summary = f"{counts['pass']} passed, {counts['fail']} failed, {counts['blocked']} blocked"
    return verdict.model_copy(update={"summary": summary}).model_dump()


def judge_checks_only(ctx: ValidationContext) -> Judgement:
    with_check = [a for a in ctx.assertions if a.check]
    results = {v.key: v for v in run_checks(ctx, with_check)}
    items = [results.get(a.key) or blocked_without_check(a) for a in ctx.assertions]
    return Judgement(_document(items))


def judge_composite(ctx: ValidationContext) -> Judgement:
    agent_name = ctx.profile.get("agent")
    rest = [a for a in ctx.assertions if not a.check]
    if not agent_name or not rest:
        return judge_checks_only(ctx)
    from validation.validators import judge as dispatch

    results = {v.key: v for v in run_checks(ctx, [a for a in ctx.assertions if a.check])}
    try:
        agent_profile = profiles.get_profile(agent_name)
    except profiles.ProfileError as exc:
        raise ValidatorCrashed(str(exc), code="misconfigured") from exc
    sub = ValidationContext(**{**ctx.__dict__, "assertions": rest, "profile": agent_profile})
    judged = dispatch(sub)
    from validation.verdict import AssertionVerdict

    for item in judged.candidate.get("assertions", []):
        results.setdefault(item["key"], AssertionVerdict.model_validate(item))
    items = [results.get(a.key) or blocked_without_check(a) for a in ctx.assertions]
    return Judgement(_document(items), judged.tokens_in, judged.tokens_out)
