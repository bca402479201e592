"""The `checks` validator (docs/TRUTH.md, docs/MISSION_FILES.md): deterministic, offline, zero tokens.

Each assertion with a check is judged by running it inside the snapshot; checks of one
run execute in parallel (bounded by FUSION_CHECK_PARALLELISM). Every result is journaled.
"""

from __future__ import annotations

import contextlib
import posixpath
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from django.conf import settings

from fusion_site.repos import snapshot_reuse
from fusion_site.repos.snapshots import is_whole_snapshot, private_copy
from fusion_site.repos.tree_index import TreeFacts, facts_of
from fusion_site.runtime import sandbox
from missions.checks_spec import check_spec_problems
from validation import environments, journal, protect, subversion, unfetched, witness
from validation.context import AssertionSpec, ValidationContext
from validation.validators.check_kinds import (
    NO_CHECK,
    RunPlace,
    assertion_verdict,
    confined_path,
    judge_assertion,
    shown,
)
from validation.verdict import (
    AssertionVerdict,
    Evidence,
    file_refs_of,
)


def _journal(ctx: ValidationContext, judged: list[tuple[AssertionSpec, AssertionVerdict]]) -> None:
    """Each check's final verdict, protection rule applied (a replay serves exactly this),
    all of a run's at once when they are in: held for the run's completion to journal with
    its decision, when the runner holds them (`journal.held`), else in one transaction now.
    A check is never served from the journal to a live run, so one that ends before a
    crash is only run again."""
    journal.append_many(
        run_id=ctx.run_id,
        entries=[("check", a.key, {"check": a.check, "result": v.model_dump()}) for a, v in judged],
        hold=True,
    )


def judge_isolated(ctx: ValidationContext, assertion: AssertionSpec, *, in_place: bool = False) -> AssertionVerdict:
    """Judge one check against the revision alone, with its protected files restored.
    `in_place`: a run check runs in the snapshot itself (`run_checks_last`)."""
    spec = assertion.check
    if check_spec_problems(spec):  # judge_assertion blocks it without running anything
        return judge_assertion(ctx.checkout, assertion)
    assert spec is not None  # check_spec_problems has a problem for anything but an object
    if "run" in spec and ctx.environment is not None:
        return environments.judged_with(ctx.environment, assertion, lambda: _judge_protected(ctx, assertion, in_place))
    return _judge_protected(ctx, assertion, in_place)


def _judge_protected(ctx: ValidationContext, assertion: AssertionSpec, in_place: bool) -> AssertionVerdict:
    spec = assertion.check
    assert spec is not None  # judge_isolated judges only a check without problems
    protection = ctx.protection
    own = spec.get("protect") or []
    if own and not protection.base:
        message = "the check protects paths but the mission has no base revision to restore them from"
        return assertion_verdict(
            assertion.key, "blocked", message, "other", f"{assertion.key}: protect {', '.join(own)}"
        )
    guarded = protection.guard(own) if own else protect.Guard()
    expected = witness.plan(ctx, spec)
    # A run check's process runs the implementation: known ways to subvert it ask a person.
    # Scanned before the check runs: one that runs in the snapshot itself could change it.
    findings = subversion.run_findings(ctx) if "run" in spec else []
    with _check_root(ctx.checkout, spec, protection, guarded, in_place=in_place) as (root, restored, layered):
        place = RunPlace(root=root, layered=layered, toolchain=ctx.toolchain)
        verdict = _content_rule(
            judge_assertion(place, assertion, expected=expected), spec, root, facts_of(ctx.checkout)
        )
    if restored:
        verdict = _outside_checkout(verdict)
    changed = sorted({*protection.changed, *guarded.changed})
    verdict = _protection_rule(verdict, changed, sorted({*protection.added, *guarded.added}), protection)
    return subversion.blocked_by(verdict, findings)


@contextlib.contextmanager
def _check_root(
    checkout: Path, spec: dict[str, Any], protection: protect.Protection, guarded: protect.Guard, *, in_place: bool
):
    """(folder, whether the checked file was restored in it, whether a run check writes to
    a private layer over it). A run check sees no other check's writes: in the sandbox it
    runs over the pristine snapshot with a private writable layer (docs/SANDBOX.md);
    without an overlay, in a private copy of the snapshot (or, the last reader, in the
    snapshot itself). A file check reads the snapshot itself, unless its own `protect`
    covers its file and the implementation changed or added it: then the base is judged."""
    if "run" not in spec and not guarded.touches(posixpath.normpath(spec["file"])):
        yield checkout, False, False
        return
    restore = guarded.changed or guarded.added
    layered = "run" in spec and sandbox.layers_work()
    if layered and not restore:
        yield checkout, False, True
        return
    if in_place and "run" in spec:
        if not layered:  # the check writes into the snapshot itself
            snapshot_reuse.mark_written(checkout)
        if restore:
            protect.apply(checkout, protection.diff(), guarded)
        yield checkout, False, layered
        return
    with private_copy(checkout) as root:
        if restore:
            protect.apply(root, protection.diff(), guarded)
        yield root, "run" not in spec, layered


def _content_rule(
    verdict: AssertionVerdict, spec: dict[str, Any], root: Path, facts: TreeFacts | None
) -> AssertionVerdict:
    """Blocked when the check read what the snapshot could not hold (validation/unfetched.py)."""
    if "run" in spec:
        return unfetched.run_rule(verdict, facts)
    target = confined_path(root, spec["file"])
    rel = target.relative_to(root.resolve()).as_posix() if target is not None else spec["file"]
    return unfetched.file_rule(verdict, spec, target, rel, facts)


def _outside_checkout(verdict: AssertionVerdict) -> AssertionVerdict:
    # The file judged is the base version, not the checkout's: a `file` evidence would name
    # a line of a file the checkout holds differently, or not at all.
    evidence = [e.model_copy(update={"kind": "other"}) if e.kind == "file" else e for e in verdict.evidence]
    return verdict.model_copy(update={"evidence": evidence})


def _protection_rule(
    verdict: AssertionVerdict, changed: list[str], added: list[str], protection: protect.Protection
) -> AssertionVerdict:
    """A check whose protected files the implementation changed says so (evidence); it
    fails unless the mission judges against the restored files (`restore`). Files it
    added under protection were set aside: said too, never a reason to fail."""
    evidence = [*verdict.evidence, *([Evidence(kind="other", text=shown(protect.added_note(added)))] if added else [])]
    if not changed:
        return verdict.model_copy(update={"evidence": evidence}) if added else verdict
    note = protect.changed_note(changed)
    evidence.append(Evidence(kind="other", text=shown(note)))
    if protection.on_change == "restore":
        return verdict.model_copy(update={"evidence": evidence})
    outcome = "passed" if verdict.verdict == "pass" else "failed" if verdict.verdict == "fail" else "was blocked"
    return AssertionVerdict(
        key=verdict.key,
        verdict="fail",
        message=shown(note, 2000),
        expected=f"no protected file changed since the base revision {protection.base[:12]}",
        actual=f"{len(changed)} protected file{'s' if len(changed) != 1 else ''} changed; with them restored, the "
        f"check itself {outcome}",
        evidence=evidence,
    )


def run_checks(
    ctx: ValidationContext, assertions: list[AssertionSpec], *, record: bool = True
) -> list[AssertionVerdict]:
    """Every check judged, in parallel threads, and journaled by this thread (the check
    threads never touch the database: no connection each). `record=False`: the caller
    journals them with others (`run_checks_last`)."""
    judged = _judge_all(ctx, assertions) if assertions and ctx.replay is None else []
    if record:
        _journal(ctx, judged)
    if ctx.replay is not None:
        return [AssertionVerdict.model_validate(ctx.replay.answer("check", a.key)) for a in assertions]
    return [verdict for _a, verdict in judged]


def _judge_all(ctx: ValidationContext, assertions: list[AssertionSpec]) -> list[tuple[AssertionSpec, AssertionVerdict]]:
    """Each check judged (in parallel threads when there are several); when one fails to
    run, the verdicts of the others are journaled before its exception is raised."""
    workers = max(1, min(settings.FUSION_CHECK_PARALLELISM, len(assertions)))
    results: list[AssertionVerdict | None] = [None] * len(assertions)
    failed: BaseException | None = None
    if workers == 1:
        for i, a in enumerate(assertions):
            try:
                results[i] = judge_isolated(ctx, a)
            except BaseException as exc:  # noqa: BLE001 — raised below, once the others are journaled
                failed = exc
                break
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(judge_isolated, ctx, a): i for i, a in enumerate(assertions)}
            for future in as_completed(futures):
                try:
                    results[futures[future]] = future.result()
                except BaseException as exc:  # noqa: BLE001 — raised below, once the others are journaled
                    failed = failed or exc
    judged = [(a, v) for a, v in zip(assertions, results, strict=True) if v is not None]
    if failed is not None:
        _journal(ctx, judged)
        raise failed
    return judged


def run_checks_last(
    ctx: ValidationContext, assertions: list[AssertionSpec]
) -> tuple[list[AssertionVerdict], dict[str, str | None] | None]:
    """`run_checks` for a validator after which nothing but host validation reads the
    snapshot (`checks` alone), and the file references of the result as that validation
    must see them (`Judgement.file_refs`; None: read the checkout).

    With exactly one run check, the file checks are judged first, their file evidence is
    judged against the pristine snapshot, and then the run check runs in the snapshot
    itself, not in a copy: nothing reads the tree after it (docs/TRUTH.md, "Checks see the
    revision and nothing else"), and one tree fewer per run is most of a run's disk work
    (bench/loop_throughput.py). With several, each has its copy and they run in parallel.
    A mission in a sub-folder of its repository keeps the copy: the snapshot around the
    folder holds the rest of the repository, which a copy of the folder leaves out and a
    check's tools would find by walking up (a `conftest.py`, a `pytest.ini` above it)."""
    runs = [
        a for a in assertions if isinstance(a.check, dict) and "run" in a.check and not check_spec_problems(a.check)
    ]
    if len(runs) != 1 or ctx.replay is not None or ctx.checkout is None or not is_whole_snapshot(ctx.checkout):
        return run_checks(ctx, assertions), None
    last = runs[0]
    others = [a for a in assertions if a is not last]
    before = run_checks(ctx, others, record=False)
    judged = {v.key: v for v in before}
    try:
        file_refs = file_refs_of(before, ctx.checkout)
        judged[last.key] = judge_isolated(ctx, last, in_place=True)
    finally:  # the file checks' verdicts are journaled even when the run check fails to run
        _journal(ctx, [(a, judged[a.key]) for a in (*others, last) if a.key in judged])
    return [judged[a.key] for a in assertions], file_refs


def blocked_without_check(assertion: AssertionSpec) -> AssertionVerdict:
    return assertion_verdict(
        assertion.key, "blocked", NO_CHECK, "other", f"{assertion.key} has no check and no agent profile is configured"
    )
