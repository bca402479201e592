"""The stages of the review pipeline, as plain functions of a review id (the actors in
`validation.review.pipeline` call them; `manage.py review --sync` and tests call them in
process). Each re-fetches the review, bails out when it is not in the state the stage
expects, and resumes from stored artifacts when it is delivered again.
"""

from __future__ import annotations

import secrets
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.db.models import F

from fusion_site.repos.snapshots import SnapshotError, snapshot
from validation.models import Review
from validation.review import artifacts
from validation.review.accounting import check_evaluation, parse_evaluation
from validation.review.candidates import LABELS, parse_candidate, source_findings
from validation.review.llm import (
    CANDIDATE_INSTRUCTIONS,
    EVALUATOR_INSTRUCTIONS,
    REPAIR_INSTRUCTIONS,
    TOOL_NAMES,
    ModelFailure,
    candidate_prompt,
    evaluator_prompt,
    make_tools,
    repair_prompt,
    run_text_agent,
)
from validation.review.render import render_report, unique
from validation.review.state import S, enqueue_on_commit, is_cancelled, progress, review_fail, transition

SLOTS = (1, 2, 3)


def _review(review_id: int) -> Review | None:
    return Review.objects.select_related("mission").filter(pk=review_id).first()


def _profile(review: Review) -> dict[str, Any]:
    return artifacts.load_json(review.pk, "profile.json")


def _canonical_input(review: Review) -> dict[str, Any]:
    return artifacts.load_json(review.pk, "canonical_input.json")


def _add_usage(review_id: int, tokens_in: int, tokens_out: int) -> None:
    Review.objects.filter(pk=review_id).update(
        tokens_in=F("tokens_in") + tokens_in, tokens_out=F("tokens_out") + tokens_out
    )


@contextmanager
def _repository(review: Review):
    """A read-only snapshot of the pinned revision, or None without a repository."""
    if not review.revision or review.mission is None or not review.mission.repository:
        yield None
        return
    mission = review.mission
    with snapshot(
        mission.source(), review.revision, label=f"review-{review.pk}", submodules=mission.submodules
    ) as root:
        yield root


# --- start ------------------------------------------------------------------------------------


def stage_start(review_id: int) -> str:
    with transaction.atomic():
        if not transition(review_id, old=S.INITIALIZING, new=S.CANDIDATES_RUNNING):
            return "stale"
        for slot in SLOTS:
            enqueue_on_commit("candidate", review_id, slot)
    return "started"


# --- candidates -------------------------------------------------------------------------------


def outcome_name(slot: int) -> str:
    return f"candidate-{slot}.outcome.json"


def stage_candidate(review_id: int, slot: int) -> str:
    review = _review(review_id)
    if review is None or review.state != S.CANDIDATES_RUNNING:
        return "stale"
    if not artifacts.exists(review_id, outcome_name(slot)):
        outcome = _run_candidate(review, slot)
        if outcome is None:
            return "cancelled"
        artifacts.store_json(review_id, kind="event", name=outcome_name(slot), value=outcome)
        progress(review, "candidate_completed", slot=slot, usable_answer=outcome["status"] == "answered")
    _complete_candidates(review_id)
    return "done"


def _run_candidate(review: Review, slot: int) -> dict[str, Any] | None:
    if artifacts.exists(review.pk, f"candidate-{slot}.response.txt"):
        return {"status": "answered", "resumed": True}  # answered before a crash: never paid twice
    profile = _profile(review)
    spec = profile["candidates"][slot - 1]
    progress(review, "candidate_started", slot=slot)
    try:
        with _repository(review) as root:
            prompt = candidate_prompt(_canonical_input(review), has_repository=root is not None)
            artifacts.store_json(
                review.pk,
                kind="prompt",
                name=f"candidate-{slot}.prompt.json",
                value={
                    "model": spec,
                    "instructions": CANDIDATE_INSTRUCTIONS,
                    "prompt": prompt,
                    "tools": list(TOOL_NAMES) if root is not None else [],
                },
            )
            answer = run_text_agent(
                spec,
                instructions=CANDIDATE_INSTRUCTIONS,
                prompt=prompt,
                tools=make_tools(root) if root is not None else (),
                timeout=profile["timeout"],
                request_limit=profile["request_limit"],
                should_stop=lambda: is_cancelled(review.pk),
            )
    except ModelFailure as exc:
        if exc.code == "cancelled":
            return None
        return {"status": "error", "code": exc.code, "message": str(exc)}
    except SnapshotError as exc:
        return {"status": "error", "code": "workspace_unavailable", "message": str(exc)}
    artifacts.store(review.pk, kind="transcript", name=f"candidate-{slot}.transcript.json", content=answer.transcript)
    artifacts.store(review.pk, kind="response", name=f"candidate-{slot}.response.txt", content=answer.text)
    _add_usage(review.pk, answer.tokens_in, answer.tokens_out)
    return {
        "status": "answered",
        "requests": answer.requests,
        "tokens_in": answer.tokens_in,
        "tokens_out": answer.tokens_out,
    }


def _complete_candidates(review_id: int) -> None:
    names = [outcome_name(slot) for slot in SLOTS]
    with transaction.atomic():
        if Review.objects.get(pk=review_id).artifacts.filter(name__in=names).count() < len(SLOTS):
            return
        if transition(review_id, old=S.CANDIDATES_RUNNING, new=S.CANDIDATES_COMPLETE):
            enqueue_on_commit("evaluate", review_id)


# --- evaluation -------------------------------------------------------------------------------


def anonymize(review_id: int) -> dict[str, str]:
    """Slots -> labels by a CSPRNG shuffle, committed before any answer is parsed."""
    review = Review.objects.get(pk=review_id)
    if review.label_map:
        return review.label_map
    labels = list(LABELS)
    secrets.SystemRandom().shuffle(labels)
    label_map = {str(slot): label for slot, label in zip(SLOTS, labels, strict=True)}
    with transaction.atomic():
        if Review.objects.filter(pk=review_id, label_map={}).update(label_map=label_map):
            artifacts.store_json(review_id, kind="event", name="anonymous_map.json", value=label_map)
    return Review.objects.get(pk=review_id).label_map


def parse_candidates(review: Review, label_map: dict[str, str]) -> dict[str, Any]:
    """Parse every answer under its label; record recoveries and unusable answers."""
    max_bytes = _profile(review)["max_output_bytes"]
    reports, unusable, recovered = {}, [], []
    for slot, label in sorted(label_map.items(), key=lambda kv: kv[1]):
        parsed = parse_candidate(artifacts.text(review.pk, f"candidate-{slot}.response.txt"), max_bytes=max_bytes)
        outcome = artifacts.load_json(review.pk, outcome_name(int(slot))) or {}
        if outcome.get("status") == "error":
            parsed.problems = [f"the model call failed ({outcome['code']}): {outcome['message']}"]
        reports[label] = parsed.report
        if parsed.recovered:
            recovered.append(label)
            artifacts.store_json(
                review.pk,
                kind="recovery",
                name=f"candidate-{label}.recovery.json",
                value={"candidate_id": label, **parsed.recovery},
            )
        if not parsed.ok:
            unusable.append(label)
            artifacts.store_json(
                review.pk,
                kind="event",
                name=f"candidate-{label}.unusable.json",
                value={"candidate_id": label, "problems": parsed.problems[:24]},
            )
        artifacts.store_json(review.pk, kind="candidate", name=f"candidate-{label}.json", value=parsed.report)
    limitations = []
    if unusable:
        limitations.append(
            f"{_count(len(unusable))} of the three reviewers returned no usable report; "
            "it was replaced by an empty report."
        )
    if recovered:
        limitations.append(
            f"{_count(len(recovered))} reviewer report(s) had to be recovered from a fenced JSON "
            "block instead of a bare JSON answer."
        )
    if not review.revision:
        limitations.append("No repository was attached to this review: the reviewers saw only the request.")
    return {"reports": reports, "unusable": unusable, "recovered": recovered, "host_limitations": limitations}


def _count(n: int) -> str:
    return {1: "One", 2: "Two", 3: "Three"}[n]


def stage_evaluate(review_id: int) -> str:
    if not transition(review_id, old=S.CANDIDATES_COMPLETE, new=S.EVALUATING):
        review = _review(review_id)
        if review is None or review.state != S.EVALUATING:  # EVALUATING: a redelivery resumes
            return "stale"
    review = _review(review_id)
    if review is None:  # deleted since the transition
        return "stale"
    label_map = anonymize(review_id)
    candidates = parse_candidates(review, label_map)
    artifacts.store_json(review_id, kind="candidates", name="candidates.json", value=candidates)
    if len(candidates["unusable"]) >= 2:
        first = artifacts.load_json(review_id, f"candidate-{candidates['unusable'][0]}.unusable.json")["problems"]
        review_fail(
            review_id,
            code="evaluation_invalid",
            stage="candidate",
            reason=f"{len(candidates['unusable'])} of the three reviewers returned no usable report "
            f"(for example: {'; '.join(first)[:500]})",
        )
        return "failed"
    findings = source_findings(candidates["reports"])
    artifacts.store_json(review_id, kind="findings", name="source_findings.json", value=findings)
    blind = {
        "canonical_input": _canonical_input(review),
        "candidates": [{"candidate_id": label, "response": candidates["reports"][label]} for label in LABELS],
        "validation_source_findings": findings,
    }
    artifacts.store_json(review_id, kind="input", name="evaluator.input.json", value=blind)
    return _evaluate(review, blind, findings)


def _evaluate(review: Review, blind: dict[str, Any], findings: list[dict]) -> str:
    profile = _profile(review)
    spec, timeout = profile["evaluator"], profile["timeout"]
    progress(review, "evaluation_started")
    prompts = {1: (EVALUATOR_INSTRUCTIONS, evaluator_prompt(blind))}
    errors: list[str] = []
    for attempt in (1, 2):
        instructions, prompt = prompts[attempt]
        try:
            text = _evaluator_call(review, attempt, spec, instructions, prompt, timeout)
        except ModelFailure as exc:
            if exc.code == "cancelled":
                return "cancelled"
            review_fail(review.pk, code="evaluator_unavailable", stage="evaluation", reason=str(exc))
            return "failed"
        Review.objects.filter(pk=review.pk).update(evaluator_attempts=attempt)
        doc, errors = parse_evaluation(text)
        errors = errors or check_evaluation(doc, findings)
        if not errors:
            artifacts.store_json(review.pk, kind="evaluation", name="evaluation.json", value=doc)
            with transaction.atomic():
                if transition(review.pk, old=S.EVALUATING, new=S.EVALUATION_COMPLETE):
                    enqueue_on_commit("render", review.pk)
            return "evaluated"
        artifacts.store_json(review.pk, kind="event", name=f"evaluator.errors-{attempt}.json", value=errors)
        if attempt == 1:
            if is_cancelled(review.pk):
                return "cancelled"
            progress(review, "evaluation_retry", attempt=2, violations=len(errors))
            prompts[2] = (REPAIR_INSTRUCTIONS, repair_prompt(blind, text, errors))
    review_fail(
        review.pk,
        code="evaluation_invalid",
        stage="evaluation",
        reason="the evaluator's accounting was still invalid after one repair: " + "; ".join(errors)[:3000],
    )
    return "failed"


def _evaluator_call(review: Review, attempt: int, spec: Any, instructions: str, prompt: str, timeout: int) -> str:
    """One evaluator call (no tools), served from its stored answer when there is one."""
    stored = artifacts.text(review.pk, f"evaluator.response-{attempt}.txt")
    if stored is not None:
        return stored
    artifacts.store_json(
        review.pk,
        kind="prompt",
        name=f"evaluator.prompt-{attempt}.json",
        value={"model": spec, "instructions": instructions, "prompt": prompt, "tools": []},
    )
    answer = run_text_agent(
        spec, instructions=instructions, prompt=prompt, timeout=timeout, should_stop=lambda: is_cancelled(review.pk)
    )
    artifacts.store(
        review.pk, kind="transcript", name=f"evaluator.transcript-{attempt}.json", content=answer.transcript
    )
    _add_usage(review.pk, answer.tokens_in, answer.tokens_out)
    return artifacts.store(
        review.pk, kind="response", name=f"evaluator.response-{attempt}.txt", content=answer.text
    ).content


# --- rendering --------------------------------------------------------------------------------


def stage_render(review_id: int) -> str:
    if not transition(review_id, old=S.EVALUATION_COMPLETE, new=S.RENDERING):
        review = _review(review_id)
        if review is None or review.state != S.RENDERING:
            return "stale"
    review = _review(review_id)
    if review is None:  # deleted since the transition
        return "stale"
    evaluation = artifacts.load_json(review_id, "evaluation.json")
    candidates = artifacts.load_json(review_id, "candidates.json")
    accounting = evaluation["validation_accounting"]
    verified = unique([v for label in LABELS for v in candidates["reports"][label]["verified"]])
    limitations = unique(
        candidates["host_limitations"]
        + [item for label in LABELS for item in candidates["reports"][label]["limitations"]]
    )
    report = render_report(accounting=accounting, verified=verified, limitations=limitations, revision=review.revision)
    report_row = artifacts.store(review_id, kind="report", name=artifacts.REPORT, content=report)
    accounting_row = artifacts.store_json(
        review_id,
        kind="accounting",
        name=artifacts.ACCOUNTING,
        value={
            "review": review_id,
            "revision": review.revision,
            "request_sha256": review.request_sha256,
            "evaluator_attempts": review.evaluator_attempts,
            "findings": accounting["findings"],
            "decisions": accounting["decisions"],
            "groups": accounting["groups"],
            "verified": verified,
            "limitations": limitations,
        },
    )
    listed = [artifacts.ref(a) for a in review.artifacts.exclude(name=artifacts.MANIFEST).order_by("name")]
    artifacts.store_json(
        review_id,
        kind="manifest",
        name=artifacts.MANIFEST,
        value={
            "review": review_id,
            "request_sha256": review.request_sha256,
            "revision": review.revision,
            "report": artifacts.ref(report_row),
            "accounting": artifacts.ref(accounting_row),
            "artifacts": listed,
        },
    )
    transition(review_id, old=S.RENDERING, new=S.COMPLETED)
    return "completed"
