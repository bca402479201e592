"""Step 4, execute (the order: `verdicts/__init__.py`): one validator run judged by the
`run_validator` actor: context, snapshot, judge, host validation, then its completion
(`verdicts/complete.py`, step 5)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from fusion_site.repos.snapshots import SnapshotError, bounded_diff, snapshot
from fusion_site.runtime.lease import renewing
from missions.models import AssertionScope, MissionFeature
from missions.selectors import done_tasks
from missions.services.verdict_settings import mission_base
from validation import environments, fastpaths, journal, profiles, protect
from validation.context import AssertionSpec, ValidationContext, ValidatorCrashed
from validation.models import RunStatus, ValidatorRun
from validation.services.verdicts.complete import RUN_STATUS, run_complete, run_error
from validation.validators import judge
from validation.verdict import (
    FrozenContext,
    HostValidatorDefect,
    Verdict,
    normalize,
    parse_candidate,
    run_host_validators,
)

logger = logging.getLogger(__name__)


def run_assertions(run: ValidatorRun) -> list[AssertionSpec]:
    """Exactly the set frozen on the run at admission: an assertion unlinked or edited
    meanwhile changes nothing about what this run judges (docs/TRUTH.md)."""
    return [
        AssertionSpec(
            key=a["key"],
            title=a.get("title", a["key"]),
            statement=a["statement"],
            check=a.get("check"),
            scope=a.get("scope", AssertionScope.FEATURE),
        )
        for a in run.assertions
    ]


def _task_context(feature: MissionFeature | None) -> tuple[str, str]:
    if feature is None:
        return "", ""
    task = done_tasks(features=feature).values_list("summary", "log").first()
    if task is None:
        return "", ""
    summary, log = task
    return summary[:4000], log[-4000:]


def build_context(
    run: ValidatorRun, checkout, *, replay=None, protection: protect.Protection | None = None
) -> ValidationContext:
    mission, feature = run.mission, run.feature
    profile = {"name": run.validator, **run.validator_config}
    # The task's words and the diff are for a model or a command to read (validators/prompt.py):
    # checks alone never read them, and the diff is a git call of its own.
    reads = profile.get("kind") in ("agent", "command") or bool(profile.get("agent"))
    summary, log_tail = _task_context(feature) if reads else ("", "")
    return ValidationContext(
        run_id=run.pk,
        mission_key=mission.key,
        feature_key=feature.key if feature else f"milestone:{run.milestone.key}",
        feature_title=feature.title if feature else run.milestone.title,
        feature_description=feature.description if feature else run.milestone.description,
        assertions=run_assertions(run),
        revision=run.revision,
        checkout=checkout,
        profile=profile,
        task_summary=summary,
        log_tail=log_tail,
        diff=bounded_diff(mission.source(), _diff_base(run), run.revision) if reads else "",
        replay=replay,
        protection=protection or protect.Protection(),
    )


def _diff_base(run: ValidatorRun) -> str:
    """The base the diff is read from: the run's frozen one, else the mission's pinned base
    (never where its branch points now: the judged work may have moved it)."""
    frozen = (run.protection or {}).get("base") or ""
    if frozen:
        return frozen
    try:
        return mission_base(run.mission)
    except SnapshotError:
        return ""  # the agent works without a diff, as when there is no base


def _lease() -> timedelta:
    return timedelta(seconds=settings.FUSION_RUN_LEASE_SECONDS)


def _claim(run_id: int) -> tuple[ValidatorRun | None, str]:
    """Take a running run by compare-and-swap: unclaimed, or its holder's lease has passed
    (the holder died). Two deliveries of one message never both judge it."""
    now, token = timezone.now(), uuid.uuid4().hex
    if not fastpaths.run_claim(run_id=run_id, now=now, token=token, until=now + _lease()):
        return None, ""
    # A milestone run (rare) reads its milestone when it builds its context; `decided`
    # (`_complete_from_journal` reads the journal only then) comes with the run.
    return fastpaths.claimed_run(run_id=run_id), token


def heartbeat(run_id: int, token: str) -> contextlib.AbstractContextManager[None]:
    """Renew the run's lease while it is being judged, so that a long check is never
    reaped; a dead worker stops renewing and its run is reaped after one lease."""
    held = ValidatorRun.objects.filter(pk=run_id, claim_token=token, status=RunStatus.RUNNING)
    return renewing(held, every=settings.FUSION_RUN_HEARTBEAT_SECONDS, lease=_lease(), name=f"run-{run_id}")


def _complete_from_journal(run_id: int) -> str | None:
    """A run whose journal holds an accepted verdict but which is still running: complete
    from the journal, judge nothing again. The accepted decision is journaled in the run's
    completion (`run_complete`), so only a journal written before that was so leaves this
    gap. Safe while another delivery holds the run: completion is a compare-and-swap."""
    accepted = _accepted_earlier(run_id)
    if accepted is None:
        return None
    tokens = accepted.get("tokens", {})
    run_complete(
        run_id=run_id,
        verdict=Verdict.model_validate(accepted["accepted_verdict"]),
        tokens_in=tokens.get("in", 0),
        tokens_out=tokens.get("out", 0),
    )
    return ValidatorRun.objects.filter(pk=run_id).values_list("status", flat=True).get()


def execute_run(run_id: int) -> str:
    """Judge one run and record its outcome. Returns the final run status (or 'stale')."""
    run, token = _claim(run_id)
    if run is None:
        return _complete_from_journal(run_id) or "stale"
    # `decided`: read with the run (`fastpaths.claimed_run`); a run with no final decision has none to complete from.
    if getattr(run, "decided", True) and (done := _complete_from_journal(run.pk)) is not None:
        return done
    with heartbeat(run.pk, token):
        try:
            return _judge_and_record(run)
        except BaseException:
            # The actor fails (the database went away, the time limit struck): its retry
            # may claim the run at once and resume from the journal.
            with contextlib.suppress(Exception):
                ValidatorRun.objects.filter(pk=run.pk, claim_token=token).update(claim_token="")
            raise


def _judge_and_record(run: ValidatorRun) -> str:
    try:
        # The check results wait for the completion below, journaled with its decision in
        # its transaction; an exception journals them as it leaves (`journal.held`).
        with journal.held(run.pk) as held:
            profiles.get_profile(run.validator)
            source = run.mission.source()
            with snapshot(
                source, run.revision, label=f"run-{run.pk}", submodules=run.mission.submodules, reuse=True
            ) as checkout:
                # Protected files go back to the base revision before anything reads the snapshot.
                protection = protect.prepare(checkout, source=source, revision=run.revision, frozen=run.protection)
                ctx = build_context(run, checkout, protection=protection)
                with environments.provided(run, ctx):  # built or reused, held while it judges
                    judgement = judge(ctx)
                verdict = host_accept(
                    run.pk,
                    judgement.candidate,
                    FrozenContext(keys=ctx.keys, checkout=checkout, file_refs=judgement.file_refs),
                )
                tokens = {"tokens_in": judgement.tokens_in, "tokens_out": judgement.tokens_out}
                decision = accepted_decision(verdict, **tokens)
    except SnapshotError as exc:
        # Unreachable, or the commit not pushed yet: retried with backoff, then blocked (and
        # judged again once the source has it). Refused (the mission's folder is a symlink at
        # the revision, a submodule URL the rules refuse): blocked at once, for a person.
        code = "workspace_unavailable" if exc.retry else "workspace_refused"
        run_error(run_id=run.pk, message=str(exc), code=code, retry=exc.retry)
        return RunStatus.ERROR
    except profiles.ProfileError as exc:
        run_error(run_id=run.pk, message=str(exc), code="misconfigured", retry=False)
        return RunStatus.ERROR
    except (ValidatorCrashed, HostValidatorDefect) as exc:
        code = getattr(exc, "code", "host_defect")
        # A spent token budget or a broken profile stops the same way on every retry.
        retry = getattr(exc, "retry", True) and code not in ("misconfigured", "sandbox_unavailable")
        run_error(run_id=run.pk, message=str(exc), code=code, retry=retry)
        return RunStatus.ERROR
    except Exception as exc:  # noqa: BLE001 — a defect of ours: end the run now instead of leaving it running
        logger.exception("validator run %s crashed with an unexpected error", run.pk)
        run_error(run_id=run.pk, message=f"unexpected {type(exc).__name__}: {exc}", code="host_defect")
        return RunStatus.ERROR
    if run_complete(run_id=run.pk, verdict=verdict, decision=decision, run=run, journal_first=held.take(), **tokens):
        return str(RUN_STATUS[verdict.status])  # what it just wrote
    return ValidatorRun.objects.filter(pk=run.pk).values_list("status", flat=True).get()


def _accepted_earlier(run_id: int) -> dict | None:
    payload = (
        journal.entries(run_id, kind="decision", key="final").order_by("-seq").values_list("payload", flat=True).first()
    )
    if payload is None or payload.get("verdict") != "accepted" or "accepted_verdict" not in payload:
        return None
    return payload


def host_accept(run_id: int, candidate: dict, frozen: FrozenContext) -> Verdict:
    """Schema and host validators on the final candidate; a rejection here is journaled and
    is an error (the agent and command validators repair before they hand a candidate
    over). The accepted verdict's decision is journaled with the run's completion
    (`accepted_decision`, `run_complete`): one transaction, never one without the other."""
    verdict, problems = parse_candidate(candidate)
    if verdict is None:
        journal.append(
            run_id=run_id, kind="decision", key="final", payload=_decision(candidate, "rejected", {"schema": problems})
        )
        raise ValidatorCrashed(
            "the verdict does not follow the contract: " + "; ".join(problems), code="invalid_verdict"
        )
    report = run_host_validators(verdict, frozen)
    if not report.ok:
        payload = _decision(candidate, "rejected", report.problems)
        journal.append(run_id=run_id, kind="decision", key="final", payload=payload)
        raise ValidatorCrashed("the verdict was rejected: " + "; ".join(report.reasons()), code="invalid_verdict")
    return normalize(verdict)


def accepted_decision(verdict: Verdict, *, tokens_in: int, tokens_out: int) -> dict:
    """The journal's `decision final` of an accepted verdict (`_complete_from_journal` reads it)."""
    accepted = verdict.model_dump()
    return _decision(accepted, "accepted", {}, accepted_verdict=accepted, tokens={"in": tokens_in, "out": tokens_out})


def _decision(candidate: dict, verdict: str, failed: dict, **extra: object) -> dict:
    blob = journal.canonical(candidate)  # once: its hash and its size
    return {
        "verdict": verdict,
        "failed_validators": failed,
        "candidate_sha256": hashlib.sha256(blob).hexdigest(),
        "candidate_size": len(blob),
        **extra,
    }
