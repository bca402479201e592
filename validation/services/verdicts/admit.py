"""Step 2, admit (the order: `verdicts/__init__.py`; docs/TRUTH.md).

Under the mission's lock and the feature's row lock, one request to judge a feature is
answered: a new run starts (`start.start_run`), an identical earlier pass is reused, or the
feature is blocked. Who asks decides what a refusal is:

- `admit` (`feature_admit` in a transaction of its own): the loop (a task's outcome,
  recovery, a fix's pass, a changed contract); a refusal is an answer: `already_running`,
  `refused`, `blocked`.
- `admit_or_raise`: a person's request (API, admin, command line, MCP); a refusal raises
  the `Conflict` or `Invalid` the person is told, and changes nothing.
- `rerun`: an operator's re-run; `admit_or_raise`, judged again even where an identical
  pass would be reused or identical failures block.

The run starts in `start.py` (step 3). A pass, reused here or judged (`complete.py`), is
applied by `apply_pass` at the end of this module: a fix's pass judges its root again,
which admits a run, so admission and a pass's consequences live in one module.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from fusion_site.repos.snapshots import SnapshotError
from missions.errors import Conflict, DomainError, Invalid
from missions.locks import assert_mission_locked, lock_mission
from missions.models import LoopState, MissionFeature, StopReason
from missions.outbox import publish_on_commit
from missions.services.verdict_settings import validators_of
from missions.transitions import feature_transition
from validation import fastpaths, profiles
from validation.models import RunStatus, ValidatorRun
from validation.services.fixes import cancel_running, close_lineage, lineage_root
from validation.services.follow_up import follow_up
from validation.services.queueing import autopilot_notify
from validation.services.run_input import RunInput, feature_assertion_specs, judged_revision, run_input, unpinned
from validation.services.runs import Admission, announce_completed, clone_run
from validation.services.verdicts.start import start_run

IDENTICAL_FAILURE_LIMIT = 3
# Only these leave `blocked` (docs/TRUTH.md): never a reuse, a task outcome or a fix.
UNBLOCKING_CAUSES = frozenset({"re_run", "resume", "source_available"})


@dataclass(frozen=True)
class _Request:
    """What one request asks: `revision` to judge instead of `judged_revision`'s choice
    (`revision_name`: the branch it was the head of, when an earlier run named one);
    `mission_id`: the feature's mission, when the caller has it (one query fewer)."""

    feature_id: int
    trigger: str
    cause: str
    actor_id: int | None = None
    profile_name: str | None = None
    revision: str | None = None
    revision_name: str = ""
    reason: str = ""
    mission_id: int | None = None


def admit(
    *,
    feature_id: int,
    trigger: str,
    cause: str,
    actor_id: int | None = None,
    profile_name: str | None = None,
    revision: str | None = None,
    revision_name: str = "",
    mission_id: int | None = None,
) -> Admission:
    """The loop's request, in the caller's transaction (which an exception dooms: a caller
    that goes on after one calls `feature_admit`)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("admit runs inside a transaction: call feature_admit")
    request = _Request(
        feature_id, trigger, cause, actor_id, profile_name, revision, revision_name, mission_id=mission_id
    )
    try:
        feature, judged = _prepare(request)
    except _NotStarted as stop:
        return stop.answer(actor_id)
    return _reuse_or_start(feature, judged, request)


# The loop's entry point: `admit` in a transaction of its own (a savepoint when nested).
feature_admit = transaction.atomic(admit)


@transaction.atomic
def admit_or_raise(
    *,
    feature_id: int,
    trigger: str,
    cause: str,
    actor_id: int | None = None,
    profile_name: str | None = None,
    revision: str | None = None,
) -> Admission:
    """A person's request: started or reused, or blocked by identical failures; any other
    refusal raises. `profile_name`: one of the mission's profiles (its `validator` when None)."""
    request = _Request(feature_id, trigger, cause, actor_id, profile_name, revision)
    feature, judged = _prepare_or_raise(request)
    return _reuse_or_start(feature, judged, request)


@transaction.atomic
def rerun(
    *,
    feature_id: int,
    trigger: str,
    cause: str,
    actor_id: int | None = None,
    revision: str | None = None,
    reason: str = "",
) -> Admission:
    """An operator's re-run: a new run starts, whatever earlier runs on the same input said;
    a refusal raises."""
    request = _Request(feature_id, trigger, cause, actor_id, revision=revision, reason=reason)
    feature, judged = _prepare_or_raise(request)
    return Admission("started", _start(feature, judged, request))


@dataclass
class _Block:
    """The loop's answer to a request that cannot be judged: the feature is blocked."""

    cause: str
    stop_reason: str
    detail: str


class _NotStarted(Exception):
    """No run may start: `refusal` is what a person's request is told; the loop's request
    is answered `answer` (a `_Block`: the feature is blocked first)."""

    def __init__(self, refusal: DomainError, feature: MissionFeature, answer: Admission | _Block) -> None:
        super().__init__(refusal.detail)
        self.refusal, self.feature, self.loop_answer = refusal, feature, answer

    def answer(self, actor_id: int | None) -> Admission:
        if isinstance(self.loop_answer, Admission):
            return self.loop_answer
        block = self.loop_answer
        return _block(self.feature, cause=block.cause, reason=block.stop_reason, detail=block.detail, actor_id=actor_id)


def _prepare_or_raise(request: _Request) -> tuple[MissionFeature, RunInput]:
    try:
        return _prepare(request)
    except _NotStarted as stop:
        raise stop.refusal from stop.__cause__


def _prepare(request: _Request) -> tuple[MissionFeature, RunInput]:
    """The feature, locked, and the input it is judged by; `_NotStarted` when no run may
    start. Refusals that no request answers otherwise raise at once."""
    feature = _locked(request.feature_id, request.mission_id)
    _require_allowed(feature, request.profile_name)
    running = _running(feature)
    if running is not None:
        busy = Conflict(
            "a validation of this feature is already running",
            code="validation_already_running",
            extra={"run": running.pk},
        )
        raise _NotStarted(busy, feature, Admission("already_running", running))
    refused = _refusal(feature, request.cause)
    if refused is not None:
        raise _NotStarted(refused, feature, Admission("refused", detail=refused.detail))
    profile = _profile(request.profile_name or feature.mission.validator)
    assertions = feature_assertion_specs(feature)
    try:
        revision, name = judged_revision(feature, request.revision, request.revision_name)
        judged = run_input(
            mission=feature.mission,
            milestone=feature.slice.milestone,
            profile=profile,
            assertions=assertions,
            revision=revision,
            revision_name=name,
        )
    except SnapshotError as exc:
        unavailable = _Block("workspace_unavailable", StopReason.WORKSPACE_UNAVAILABLE, str(exc)[:2000])
        raise _NotStarted(unpinned(exc), feature, unavailable) from exc
    if not revision:
        raise Invalid(
            "nothing to validate: the feature has no landed task revision and the mission no repository",
            code="no_revision",
        )
    if not assertions:
        unjudgeable = _Block(
            "no_assertions",
            StopReason.NO_ASSERTIONS,
            "no contract assertions are linked: a feature never passes without them",
        )
        none = Invalid("the feature has no contract assertions to judge it by", code="no_assertions")
        raise _NotStarted(none, feature, unjudgeable)
    return feature, judged


def _locked(feature_id: int, mission_id: int | None) -> MissionFeature:
    """The feature, locked after its mission's lock (one lock order for every step). A
    caller's stale mission id locked another mission: the feature's own is locked next,
    and the feature read again under it."""
    if mission_id is None:
        mission_id = MissionFeature.objects.values_list("mission_id", flat=True).get(pk=feature_id)
    lock_mission(mission_id)
    feature = fastpaths.feature_locked_for_admission(feature_id=feature_id)
    if feature.mission_id != mission_id:
        lock_mission(feature.mission_id)
        feature = fastpaths.feature_locked_for_admission(feature_id=feature_id)
    return feature


def _require_allowed(feature: MissionFeature, profile_name: str | None) -> None:
    """Only the mission's own profiles judge it, whoever asks (docs/TRUTH.md)."""
    if profile_name and profile_name not in (judges := validators_of(feature.mission)):
        _profile(profile_name)  # an unknown profile is told as such before it is told it is not allowed
        raise Invalid(
            f"validator {profile_name!r} may not judge this mission; it allows: {', '.join(judges)}",
            code="validator_not_allowed",
            fields={"validator": [f"not one of the mission's profiles ({', '.join(judges)})"]},
            extra={"allowed": judges},
        )


def _profile(name: str) -> dict:
    try:
        return profiles.get_profile(name)
    except profiles.ProfileError as exc:
        raise Invalid(str(exc), code="unknown_validator", fields={"validator": [str(exc)]}) from exc


def _running(feature: MissionFeature) -> ValidatorRun | None:
    # Its id first (a run row carries its frozen input and verdict: large, and rarely wanted).
    running_ids = fastpaths.running_run_ids(feature_id=feature.pk)
    return ValidatorRun.objects.get(pk=running_ids[0]) if running_ids else None


def _refusal(feature: MissionFeature, cause: str) -> Conflict | None:
    if feature.loop_state == LoopState.BLOCKED and cause not in UNBLOCKING_CAUSES:
        return Conflict(
            f"the feature is blocked ({feature.stop_reason or 'validator'}): clear or re-run it",
            code="feature_blocked",
            extra={"stop_reason": feature.stop_reason},
        )
    if feature.loop_state == LoopState.SUPERSEDED:
        return Conflict("the fix is superseded: its root passed", code="feature_superseded")
    return None


def _reuse_or_start(feature: MissionFeature, judged: RunInput, request: _Request) -> Admission:
    # Every judged run on this input, newest first (a handful), in one query: the newest
    # decides a reuse, the failed ones count towards the block.
    earlier = fastpaths.judged_runs(feature_id=feature.pk, fingerprint=judged.fingerprint)
    if earlier and earlier[0][1] == RunStatus.PASSED:
        return _reuse(feature, ValidatorRun.objects.get(pk=earlier[0][0]), judged=judged, request=request)
    if sum(1 for _pk, status in earlier if status == RunStatus.FAILED) >= IDENTICAL_FAILURE_LIMIT:
        return _block(
            feature,
            cause="fingerprint_failures",
            reason=StopReason.FINGERPRINT,
            actor_id=request.actor_id,
            detail=f"the same input failed {IDENTICAL_FAILURE_LIMIT} times; change the code or the assertions",
        )
    return Admission("started", _start(feature, judged, request))


def _block(feature: MissionFeature, *, cause: str, reason: str, detail: str, actor_id: int | None) -> Admission:
    feature_transition(
        feature=feature.pk,
        old=feature.loop_state,
        new=LoopState.BLOCKED,
        cause=cause,
        actor_id=actor_id,
        reason=detail,
        fields={"stop_reason": reason, "stop_detail": detail, "stopped_at": timezone.now()},
    )
    return Admission("blocked", detail=detail)


def _start(feature: MissionFeature, judged: RunInput, request: _Request) -> ValidatorRun:
    return start_run(
        feature=feature,
        judged=judged,
        trigger=request.trigger,
        cause=request.cause,
        actor_id=request.actor_id,
        reason=request.reason,
    )


def _reuse(feature: MissionFeature, reused: ValidatorRun, *, judged: RunInput, request: _Request) -> Admission:
    """A new run, already passed, over the reused run's input; `judged.revision_name`: the
    branch this request took the revision from (the reused run may have named none)."""
    now = timezone.now()
    run = clone_run(
        reused,
        feature=feature,
        milestone_id=feature.slice.milestone_id,
        trigger=request.trigger,
        revision_name=judged.revision_name,
        requested_by_id=request.actor_id,
        status=RunStatus.PASSED,
        validator_attempt=feature.validator_attempts,
        verdict=reused.verdict,
        reused_from=reused,
        completed_at=now,
        summary=f"reused the pass of run {reused.pk} (identical input; no validator call)",
    )
    MissionFeature.objects.filter(pk=feature.pk).update(last_run=run, updated_at=now)
    feature.refresh_from_db()
    if feature.loop_state != LoopState.PASSED:  # already passed on this input: recorded, nothing moves
        apply_pass(feature=feature, run=run, cause="fingerprint_reuse", old_state=feature.loop_state)
    announce_completed(run, reused_from=reused.pk)
    return Admission("reused", run)


def apply_pass(
    *, feature: MissionFeature, run: ValidatorRun, cause: str, old_state: str, fixes: list[int] | None = None
) -> None:
    """The feature passed (a judged pass, or a reused one), and what follows: a fix's root
    is judged again (`fix_passed`), a root's open fixes are closed (`fixes.close_lineage`),
    the autopilot looks again. `fixes`: the fixes of the feature's lineage
    (`lineage_fix_ids`) when the caller read them in this transaction: with none, there is
    no lineage to close."""
    feature_transition(
        feature=feature.pk,
        old=old_state,
        new=LoopState.PASSED,
        cause=cause,
        payload={"run": run.pk},
        fields={"stop_reason": "", "stop_detail": "", "stopped_at": None},
        mission_id=feature.mission_id,
    )
    if feature.generated_from_id:
        follow_up(feature.mission_id, "fix_passed", lambda: fix_passed(fix=feature, run=run))
    elif fixes is None or fixes:
        follow_up(feature.mission_id, "close_lineage", lambda: close_lineage(root=feature))
    autopilot_notify(feature.mission_id)


def fix_passed(*, fix: MissionFeature, run: ValidatorRun) -> str:
    """A fix passed: its root is judged again at the fix's revision (which is now the
    revision the root stands on, `feature_revision`). The outcome for every root state:
    passed at this revision: nothing to do; passed at an older one (the fix was worked on
    again after the root passed): judged again at the fix's; validating: that run is
    cancelled and a new one starts at the fix's revision; blocked: it stays blocked (only
    clear, re-run or resume leave it) and a re-run will judge the fix's revision;
    anything else: a new run at the fix's revision. Called while holding the mission lock."""
    assert_mission_locked(fix.mission_id)
    root = lineage_root(fix)
    if root.pk == fix.pk or root.loop_state == LoopState.SUPERSEDED:
        return "nothing"
    if root.loop_state == LoopState.PASSED and root.last_run is not None and root.last_run.revision == run.revision:
        return "nothing"  # the root already passed at this very revision
    if root.loop_state == LoopState.BLOCKED:
        publish_on_commit(
            root.mission_id,
            "fix-feature:root-blocked",
            {
                "mission": root.mission_id,
                "feature": root.pk,
                "fix": fix.pk,
                "run": run.pk,
                "reason": "the root is blocked: re-run it to judge it at the fix's revision",
            },
        )
        return "root_blocked"
    if root.loop_state == LoopState.VALIDATING:
        cancel_running(root, reason=f"superseded by the pass of fix {fix.key} (run {run.pk})")
    return feature_admit(feature_id=root.pk, trigger="fix", cause="root_revalidation", revision=run.revision).outcome
