"""Host validation with bounded repair, shared by the `agent` and `command` validators.

Every candidate goes through the schema check and all host validators (§5.4). The verdict
on it is ONE journaled decision keyed by its call id: `accepted`, `repair` (the reasons go
back to the model and it tries again) or `rejected` (the repair bound is spent: the run
ends `error`). A resumed run rolls a journaled decision forward instead of judging the
same candidate twice; a replay judges it again and must reach the same decision.

A host validator that raises is a defect of the host: `HostValidatorDefect` propagates,
no decision is journaled and no repair is granted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from validation import journal
from validation.context import ValidatorCrashed
from validation.verdict import FrozenContext, Verdict, parse_candidate, run_host_validators

POLICIES = ("transcript", "hash-only")
DEFAULT_MAX_REPAIRS = 2


class RepairsExhausted(ValidatorCrashed):
    """The last candidate was rejected and no repair remains."""

    def __init__(self, decision: Decision):
        reasons = "; ".join(decision.reasons())[:3000]
        super().__init__(
            f"the verdict stayed invalid after {decision.repairs_used} of {decision.max_repairs} repairs: {reasons}",
            code="invalid_verdict",
        )
        self.decision = decision


class ReplayDivergence(Exception):
    """Judging a journaled candidate again reached a different decision."""


@dataclass
class Decision:
    call_id: str
    verdict: str  # accepted | repair | rejected
    stage: str  # schema | host | "" when accepted
    failed: dict[str, list[str]]
    repairs_used: int
    max_repairs: int
    candidate_sha256: str
    candidate_size: int
    parse: str = "json"  # how the candidate was read: json | fenced | text
    extra: dict[str, Any] = field(default_factory=dict)

    def reasons(self) -> list[str]:
        return [f"{name}: {reason}" for name, items in self.failed.items() for reason in items]

    def offending_keys(self) -> list[str]:
        """Host validators start each reason with the assertion key (schema reasons with a
        location instead, which the reason itself names)."""
        keys = {
            reason.split(":", 1)[0].strip()
            for name, items in self.failed.items()
            if name != "schema"
            for reason in items
        }
        return sorted(k for k in keys if k and k != "summary")

    def core(self) -> dict[str, Any]:
        """What a replay must reproduce exactly."""
        return {
            "call_id": self.call_id,
            "verdict": self.verdict,
            "stage": self.stage,
            "failed": self.failed,
            "repairs_used": self.repairs_used,
            "max_repairs": self.max_repairs,
            "candidate_sha256": self.candidate_sha256,
            "candidate_size": self.candidate_size,
            "parse": self.parse,
        }

    def payload(self, candidate: Any, policy: str) -> dict[str, Any]:
        data = {
            "decision_type": "host_validation",
            **self.core(),
            "failed_validators": sorted(self.failed),
            "policy": policy,
            **self.extra,
        }
        if self.verdict != "accepted":
            if policy == "transcript":
                data["candidate"] = candidate
            else:
                data["bytes_unavailable_reason"] = "hash-only-persistence"
        return data

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> Decision:
        return cls(
            call_id=data["call_id"],
            verdict=data["verdict"],
            stage=data["stage"],
            failed=data["failed"],
            repairs_used=data["repairs_used"],
            max_repairs=data["max_repairs"],
            candidate_sha256=data["candidate_sha256"],
            candidate_size=data["candidate_size"],
            parse=data.get("parse", "json"),
        )

    def feedback(self) -> str:
        """The repair turn: which validators failed, the offending keys, what remains."""
        remaining = self.max_repairs - self.repairs_used
        lines = [
            f"Your verdict was rejected by host validation. Repairs remaining, this one included: {remaining} "
            f"of {self.max_repairs}. Fix every problem below and submit the COMPLETE verdict again "
            "(every linked assertion, not only the ones named here).",
            "Failed validators:",
        ]
        lines += [f"- {name}: {reason}" for name, items in self.failed.items() for reason in items]
        keys = self.offending_keys()
        if keys:
            lines.append("Offending keys: " + ", ".join(keys))
        return "\n".join(lines)


def candidate_identity(candidate: Any) -> tuple[str, int]:
    """(sha256 of the JCS form, its size in bytes): the same recipe as every journal hash."""
    value = journal._jsonable(candidate)
    return journal.sha256_of(value), len(journal.canonical(value))


def assess(candidate: Any, frozen: FrozenContext) -> tuple[Verdict | None, str, dict[str, list[str]]]:
    """(parsed verdict or None, failing stage, failed validators → reasons)."""
    if not isinstance(candidate, dict):
        return (
            None,
            "schema",
            {"schema": ["(document): the verdict must be one JSON object (no JSON document was found)"]},
        )
    verdict, problems = parse_candidate(candidate)
    if verdict is None:
        return None, "schema", {"schema": problems}
    report = run_host_validators(verdict, frozen)  # raises HostValidatorDefect: not caught here
    if not report.ok:
        return verdict, "host", report.problems
    return verdict, "", {}


def decide(
    *,
    log: journal.CallLog,
    candidate: Any,
    frozen: FrozenContext,
    call_id: str,
    repairs_used: int,
    max_repairs: int,
    policy: str,
    parse: str = "json",
    extra: dict | None = None,
) -> tuple[Decision, Verdict | None]:
    """Judge one candidate and journal the decision (or roll a journaled one forward)."""
    key = f"decision:{call_id}"
    stored = log.answer("decision", key)
    if stored is not None and log.live:
        verdict, _stage, _failed = assess(candidate, frozen) if stored["verdict"] == "accepted" else (None, "", {})
        return Decision.from_payload(stored), verdict
    verdict, stage, failed = assess(candidate, frozen)
    digest, size = candidate_identity(candidate)
    if not failed:
        outcome = "accepted"
    else:
        outcome = "repair" if repairs_used < max_repairs else "rejected"
    decision = Decision(
        call_id=call_id,
        verdict=outcome,
        stage=stage,
        failed=failed,
        repairs_used=repairs_used,
        max_repairs=max_repairs,
        candidate_sha256=digest,
        candidate_size=size,
        parse=parse,
        extra=dict(extra or {}),
    )
    if stored is not None:  # replay: the same candidate must draw the same decision
        if journal._jsonable(decision.core()) != {k: stored.get(k) for k in decision.core()}:
            raise ReplayDivergence(
                f"decision {call_id}: judged {decision.verdict} now, journaled {stored['verdict']} "
                f"(failed now: {sorted(failed)}; journaled: {sorted(stored.get('failed', {}))})"
            )
    else:
        log.record("decision", key, decision.payload(journal._jsonable(candidate), policy))
    return decision, verdict if outcome == "accepted" else None
