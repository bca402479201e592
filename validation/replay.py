"""Replay (docs/validators.md, "Journal, resume, replay"): re-execute a run's validator with every model, tool, command and
check answer served from its journal, then prove the outcome is the recorded one.

A replay never calls out and writes nothing to the database (it reads a temporary
snapshot of the revision, removed afterwards): a request that is not journaled stops it with
`JournalMiss`; a journal whose hash chain does not verify stops it before anything runs,
naming the first bad entry. The verdict is accepted by the same pure steps as a live run
(schema, host validators, normalization) and its hash must equal the hash journaled by
the accepted decision and the hash of the verdict stored on the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from fusion_site.repos.snapshots import SnapshotError, snapshot
from validation import journal, protect
from validation.context import ValidationContext, ValidatorCrashed
from validation.journal import JournalIntegrityError, JournalMiss
from validation.models import JournalEntry, RunStatus, ValidatorRun
from validation.services.run_input import feature_assertion_specs, input_fingerprint, run_environment
from validation.services.runner import run_assertions
from validation.validators import judge
from validation.validators.repair import ReplayDivergence
from validation.verdict import FrozenContext, HostValidatorDefect, normalize, parse_candidate, run_host_validators

OUTCOME: dict[str, str] = {
    RunStatus.PASSED: "pass",
    RunStatus.FAILED: "fail",
    RunStatus.BLOCKED: "blocked",
    RunStatus.ERROR: "error",
}


class Replayer:
    """`ValidationContext.replay`: journaled answers only."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.log = journal.CallLog(run_id, live=False)

    def answer(self, kind: str, key: str) -> Any:
        payload = self.log.answer(kind, key)
        if payload is None:
            raise JournalMiss(f"{kind} {key} is not in the journal of run {self.run_id}; a replay never runs it live")
        return payload["result"] if kind == "check" else payload


@dataclass
class ReplayReport:
    run: int
    ok: bool
    recorded_status: str
    replayed: str = ""  # pass | fail | blocked | error
    error_code: str = ""
    verdict_sha256: str = ""
    recorded_sha256: str = ""  # of the accepted decision ("final")
    stored_verdict_sha256: str = ""  # of ValidatorRun.verdict
    chain_entries: int = 0
    tokens: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _recorded_final(run_id: int) -> dict[str, Any] | None:
    entry = JournalEntry.objects.filter(run_id=run_id, kind="decision", key="final").order_by("-seq").first()
    return entry.payload if entry is not None else None


@contextlib.contextmanager
def _checkout(run: ValidatorRun, notes: list[str]) -> Iterator[Any]:
    """The run's revision when its workspace is still there (file evidence is re-checked);
    otherwise no checkout, and the report says so."""
    stack = contextlib.ExitStack()
    try:
        path = stack.enter_context(
            snapshot(run.mission.source(), run.revision, label=f"replay-{run.pk}", submodules=run.mission.submodules)
        )
        # The run judged its snapshot with the protected files restored: so does the replay.
        protect.prepare(path, source=run.mission.source(), revision=run.revision, frozen=run.protection)
    except SnapshotError as exc:
        notes.append(f"no checkout ({exc}); file evidence is not re-checked")
        path = None
    with stack:
        yield path


def _context(run: ValidatorRun, checkout, replayer: Replayer) -> ValidationContext:
    feature = run.feature
    return ValidationContext(
        run_id=run.pk,
        mission_key=run.mission.key,
        feature_key=feature.key if feature else f"milestone:{run.milestone.key}",
        feature_title=feature.title if feature else run.milestone.title,
        feature_description="",
        assertions=run_assertions(run),
        revision=run.revision,
        checkout=checkout,
        profile={"name": run.validator, **run.validator_config},
        replay=replayer,
    )


def _accept(candidate: dict, frozen: FrozenContext):
    verdict, problems = parse_candidate(candidate)
    if verdict is None:
        raise ValidatorCrashed(
            "the verdict does not follow the contract: " + "; ".join(problems), code="invalid_verdict"
        )
    report = run_host_validators(verdict, frozen)
    if not report.ok:
        raise ValidatorCrashed("the verdict was rejected: " + "; ".join(report.reasons()), code="invalid_verdict")
    return normalize(verdict)


def _fingerprint_note(run: ValidatorRun, ctx: ValidationContext, notes: list[str]) -> None:
    if run.feature is None or not run.input_fingerprint:
        return
    profile = {"name": run.validator, **run.validator_config}
    now = input_fingerprint(
        revision=run.revision,
        assertions=feature_assertion_specs(run.feature),
        profile=profile,
        protection=run.protection,
        sandbox_kind=(run.sandbox or "none").split()[0],
        environment=run_environment(run.mission, run.milestone),
    )
    if now != run.input_fingerprint:
        notes.append(
            "the feature's assertions or environment changed since the run; the replay judges the run's own frozen set"
        )


def replay_run(run_id: int) -> ReplayReport:
    """Raises JournalIntegrityError when the chain does not verify; otherwise reports."""
    run = ValidatorRun.objects.select_related("mission", "feature", "milestone").get(pk=run_id)
    chain = journal.verify_chain(run_id)
    if not chain.ok:
        raise JournalIntegrityError(chain.message, seq=chain.first_bad_seq)
    report = ReplayReport(run=run.pk, ok=False, recorded_status=run.status, chain_entries=chain.entries)
    if run.reused_from_id:
        report.notes.append(f"this run reused the pass of run {run.reused_from_id}; nothing was judged")
        report.ok, report.replayed = run.status == RunStatus.PASSED, "pass"
        return report
    if not run.validator_config.get("kind"):
        report.problems.append(f"the run records no validator profile to replay ({run.validator or 'none'})")
        return report
    replayer = Replayer(run_id)
    with _checkout(run, report.notes) as checkout:
        ctx = _context(run, checkout, replayer)
        _fingerprint_note(run, ctx, report.notes)
        try:
            judgement = judge(ctx)
            verdict = _accept(judgement.candidate, FrozenContext(keys=ctx.keys, checkout=checkout))
        except JournalMiss as exc:
            return _unanswered(run, report, exc)
        except ReplayDivergence as exc:
            report.problems.append(str(exc))
            return report
        except (ValidatorCrashed, HostValidatorDefect) as exc:
            return _compare_error(run, report, getattr(exc, "code", "host_defect"), str(exc))
    report.tokens = {"in": judgement.tokens_in, "out": judgement.tokens_out}
    final = _recorded_final(run.pk)
    accepted = final is not None and final.get("verdict") == "accepted"
    if run.status == RunStatus.ERROR and run.error.split(":", 1)[0] == "timeout" and not accepted:
        return _clock_ran_out(run, report, verdict.model_dump())
    return _compare_verdict(run, report, verdict.model_dump(), final)


def _clock_ran_out(run: ValidatorRun, report: ReplayReport, verdict: dict[str, Any]) -> ReplayReport:
    """The run's time ran out after its last answer was journaled, before the host decided
    on it. The timeout is the wall clock's decision, which no journal holds: the replay
    checks everything the journal does hold and reports the recorded error."""
    report.replayed, report.error_code = "error", "timeout"
    report.verdict_sha256 = journal.sha256_of(verdict)
    report.notes.append(
        f"the run timed out after its last answer was journaled; the journal replays on to a "
        f"{verdict['status']} verdict that was never accepted"
    )
    report.ok = run.verdict is None
    if not report.ok:
        report.problems.append("a run that timed out before its decision holds a verdict")
    return report


def _unanswered(run: ValidatorRun, report: ReplayReport, miss: JournalMiss) -> ReplayReport:
    """A call the run never got answered ends the replay. That is the recorded outcome
    when the run ended in error on it (its timeout, an unreachable model); for a run that
    is still running (its worker died) it is as far as the journal goes."""
    code = run.error.split(":", 1)[0] if run.status == RunStatus.ERROR else ""
    # A timeout can strike before the next request is even journaled (a repair turn being
    # built); an unreachable model leaves its request journaled without an answer. A miss
    # in the middle of the journal is a divergence whatever the run's error.
    if (code == "timeout" and (miss.in_flight or miss.past_end)) or (code == "model_unavailable" and miss.in_flight):
        report.replayed, report.error_code = "error", code
        report.notes.append(f"the run ended in error while this call was unanswered: {miss}")
        report.ok = True
    else:
        report.problems.append(str(miss))
    return report


def _compare_error(run: ValidatorRun, report: ReplayReport, code: str, message: str) -> ReplayReport:
    report.replayed, report.error_code = "error", code
    recorded_code = run.error.split(":", 1)[0] if run.error else ""
    if run.status != RunStatus.ERROR:
        report.problems.append(f"the replay ended in error ({code}: {message[:300]}) but the run is {run.status}")
    elif recorded_code != code:
        report.problems.append(f"the replay ended in error {code}, the run in error {recorded_code}")
    report.ok = not report.problems
    return report


def _compare_verdict(
    run: ValidatorRun, report: ReplayReport, verdict: dict[str, Any], final: dict[str, Any] | None
) -> ReplayReport:
    report.replayed = verdict["status"]
    report.verdict_sha256 = journal.sha256_of(verdict)
    report.recorded_sha256 = (final or {}).get("candidate_sha256", "")
    report.stored_verdict_sha256 = journal.sha256_of(run.verdict) if run.verdict is not None else ""
    if OUTCOME.get(run.status) != report.replayed:
        report.problems.append(f"the replay judged {report.replayed}, the run is {run.status}")
    if not final or final.get("verdict") != "accepted":
        report.problems.append("the journal holds no accepted final decision")
    elif report.recorded_sha256 != report.verdict_sha256:
        report.problems.append("the replayed verdict hash differs from the journaled accepted candidate hash")
    if run.verdict is not None and report.stored_verdict_sha256 != report.verdict_sha256:
        report.problems.append("the replayed verdict hash differs from the verdict stored on the run")
    if report.tokens and (run.tokens_in, run.tokens_out) != (report.tokens["in"], report.tokens["out"]):
        report.notes.append(
            f"tokens on the run {run.tokens_in}/{run.tokens_out}, journaled "
            f"{report.tokens['in']}/{report.tokens['out']}"
        )
    report.ok = not report.problems
    return report
