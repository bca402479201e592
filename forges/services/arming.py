"""What a run's start and end arm in its mission's outbox, in the run's own transaction
(`validation/hooks.py`, received by `forges/receivers.py`): the outbox row commits with
the verdict, and is sent after commit (docs/FORGES.md, "Statuses and comments out").

A commit status for the run's judged revision: `pending` when it starts, its end's state
when it ends (one row per revision and state, `status:<sha>:<state>`, never posted twice
in a row: armed anew only when another state came since);
and, for a verdict, the comment of each pull request that follows the run's feature (or
whose head is the judged revision) armed again (`comment:<number>`, one row per pull
request, its `version` bumped), rendered from the database when it is sent."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from forges import fastpaths
from forges.models import Outbox, OutboxKind, OutboxState, PullRequest
from forges.providers import ADAPTERS
from fusion_site.repos.mirrors import FULL_COMMIT
from fusion_site.runtime.queue import send_on_commit
from validation.models import FixLineage, RunStatus, ValidatorRun

DELIVER = "deliver_outbox"
DESCRIPTION_LIMIT = 140
# The run's end as a commit status. A blocked verdict is a `failure`: the validator
# decided this revision does not pass as it stands (a suspected tampering, content it
# could not read) and a person must act; `error` is for a judgement that did not happen
# (the validator failed, or newer evidence cancelled the run) and is retried or replaced.
END_STATES = {
    RunStatus.PASSED: "success",
    RunStatus.FAILED: "failure",
    RunStatus.BLOCKED: "failure",
    RunStatus.ERROR: "error",
    RunStatus.CANCELLED: "error",
}
VERDICTS = (RunStatus.PASSED, RunStatus.FAILED, RunStatus.BLOCKED)


def _forge_of(run: ValidatorRun) -> dict[str, Any] | None:
    """The run's mission's forge when it answers on the forge: the one query a mission
    without a forge costs a run's start and end."""
    forge = fastpaths.forge_row(mission_id=run.mission_id)
    if forge is None or forge["provider"] not in ADAPTERS or not forge["api_url"] or not forge["repository"]:
        return None
    return forge


def _judges_a_commit(run: ValidatorRun) -> bool:
    # A milestone run judges the mission's branch, not a head someone pushed for review.
    return run.feature_id is not None and bool(FULL_COMMIT.match(run.revision or ""))


def run_url(run_id: int) -> str:
    return f"{settings.FUSION_PUBLIC_URL}{reverse('dashboard-run', args=[run_id])}"


def arm_run_started(*, run: ValidatorRun) -> None:
    if not _judges_a_commit(run):
        return
    forge = _forge_of(run)
    if forge is not None and forge["statuses"]:
        count = len(run.assertions or [])
        _arm_status(forge, run, "pending", f"Validating {count} assertion{'s' if count != 1 else ''}")


def arm_run_ended(*, run: ValidatorRun) -> None:
    if not _judges_a_commit(run) or run.status not in END_STATES:
        return
    forge = _forge_of(run)
    if forge is None:
        return
    if forge["statuses"]:
        _arm_status(forge, run, END_STATES[RunStatus(run.status)], describe_end(run))
    if forge["comments"] and run.status in VERDICTS:
        for pull in _pull_requests_of(forge["id"], run):
            arm_comment(forge_id=forge["id"], pull=pull, run_id=run.pk)


def describe_end(run: ValidatorRun) -> str:
    """The status's short description: the count of assertions passed, or why not judged."""
    items = (run.verdict or {}).get("assertions") or []
    passed = sum(1 for item in items if item.get("verdict") == "pass")
    if run.status == RunStatus.BLOCKED:
        text = f"Blocked: {run.blocked_reason or run.summary}"
    elif run.status == RunStatus.ERROR:
        text = f"Not judged (validator error): {(run.error or '').split(':', 1)[0]}"
    elif run.status == RunStatus.CANCELLED:
        text = f"Cancelled: {run.summary}"
    else:
        text = f"{passed}/{len(items)} assertions passed" if items else str(run.status)
        if run.reused_from_id:
            text += f" (the pass of run {run.reused_from_id}, same input)"
    text = " ".join(text.split())
    return text if len(text) <= DESCRIPTION_LIMIT else text[: DESCRIPTION_LIMIT - 1] + "…"


def _arm_status(forge: dict[str, Any], run: ValidatorRun, state: str, description: str) -> None:
    payload = {
        "sha": run.revision,
        "state": state,
        "description": description,
        "target_url": run_url(run.pk),
        "context": forge["context"],
        "run": run.pk,
        "run_status": run.status,
    }
    key = f"status:{run.revision}:{state}"
    statuses = Outbox.objects.filter(forge_id=forge["id"], key__startswith=f"status:{run.revision}:")
    latest = statuses.order_by("-pk").values_list("key", flat=True).first()
    if latest == key:
        return  # the forge shows (or is about to show) this state already: never posted twice in a row
    # Another state came since (a re-judged revision: passed, failed, passed again): the
    # forge shows the last status posted, so this one is armed anew, after it.
    statuses.filter(key=key).delete()
    row = Outbox.objects.create(
        forge_id=forge["id"], key=key, kind=OutboxKind.STATUS, payload=payload, next_attempt_at=timezone.now()
    )
    send_on_commit(DELIVER, row.pk)


def _pull_requests_of(forge_id: int, run: ValidatorRun) -> list[PullRequest]:
    """The pull requests that follow the run's feature (or the root of its fix lineage), or
    whose head is the judged revision."""
    features = {run.feature_id, *FixLineage.objects.filter(fix_id=run.feature_id).values_list("root_id", flat=True)}
    return list(PullRequest.objects.filter(forge_id=forge_id).filter(Q(feature_id__in=features) | Q(head=run.revision)))


def arm_comment(*, forge_id: int, pull: PullRequest, run_id: int) -> Outbox:
    """The pull request's one comment row, armed to say what run `run_id` decided: created
    at its first verdict, then a new `version` (to edit the comment) at each next one; a
    row being sent meanwhile stays pending and is sent again."""
    now = timezone.now()
    payload = {"run": run_id, "pull_request": pull.pk, "number": pull.number}
    row, created = Outbox.objects.get_or_create(
        forge_id=forge_id,
        key=f"comment:{pull.number}",
        defaults={"kind": OutboxKind.COMMENT, "payload": payload, "next_attempt_at": now},
    )
    if not created:
        Outbox.objects.filter(pk=row.pk).update(
            payload=payload,
            version=F("version") + 1,
            state=OutboxState.PENDING,
            next_attempt_at=now,
            last_error="",
            updated_at=now,
        )
    send_on_commit(DELIVER, row.pk)
    return row
