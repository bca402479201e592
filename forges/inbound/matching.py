"""A delivery's event matched by the mission's rules (docs/FORGES.md, "What is matched"):

- a push to the executor's branch of a task, `refs/heads/fusion/<mission>/<feature>-<task>`,
  completes that task at the pushed head;
- a pull request whose branch or title names a feature key (the forge's
  `feature_pattern`) completes that feature's open task at its head, creating one as a
  manual task would when none is open; a done task stays done, so a new head is a new task.

A completion goes through `task_complete`, which pins the revision (an unknown commit is
fetched through the mirror cache) and hands the task to validation; its refusal (an
unknown revision, a task that ended) is the delivery's `failed` reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from forges.inbound.parsing import Event, PullRequestChange, Push
from forges.models import DEFAULT_FEATURE_PATTERN, DeliveryState, Forge, PullRequest
from missions.errors import DomainError
from missions.models import MissionFeature, Task, TaskStatus
from missions.services.executor import result_branch
from missions.services.tasks import task_complete, task_create
from missions.transitions import TASK

ALREADY_JUDGED = "revision already judged"
NOT_A_TASK_BRANCH = "not a task branch"
_TASK_ID = re.compile(r"-([0-9]{1,18})\Z")


@dataclass
class Outcome:
    state: str
    reason: str = ""
    ref: str = ""
    head: str = ""
    pull_number: int | None = None
    task: Task | None = None


def outcome_of(*, forge: Forge, event: Event) -> Outcome:
    if isinstance(event, Push):
        return _push(forge, event)
    if isinstance(event, PullRequestChange):
        return _pull_request(forge, event)
    return Outcome(DeliveryState.IGNORED, event.reason)


def _complete(outcome: Outcome, task: Task) -> Outcome:
    outcome.task = task
    try:
        task_complete(user=None, task=task, revision=outcome.head)
    except DomainError as exc:  # the service's refusal is the delivery's answer, not an error
        outcome.state, outcome.reason = DeliveryState.FAILED, exc.detail
        return outcome
    outcome.state = DeliveryState.MATCHED
    return outcome


# ---------------------------------------------------------------- pushes


def branch_task(forge: Forge, ref: str) -> Task | None:
    """The task whose executor branch `ref` is, if it is one of this mission's."""
    if not ref.startswith("refs/heads/fusion/") or not (found := _TASK_ID.search(ref)):
        return None
    task = Task.objects.select_related("mission", "feature").filter(pk=int(found[1]), mission=forge.mission_id).first()
    # The branch as the executor names it: the feature's key (`task` for a task of no feature).
    if task is None or f"refs/heads/{result_branch(task)}" != ref:
        return None
    return task


def _push(forge: Forge, push: Push) -> Outcome:
    outcome = Outcome(DeliveryState.IGNORED, ref=push.ref[:300], head=push.head[:80])
    if set(push.head) == {"0"}:
        outcome.reason = "branch deleted"
        return outcome
    task = branch_task(forge, push.ref)
    if task is None:
        outcome.reason = NOT_A_TASK_BRANCH
        return outcome
    if task.status == TaskStatus.DONE and task.revision == push.head:
        outcome.reason, outcome.task = ALREADY_JUDGED, task
        return outcome
    return _complete(outcome, task)


# ---------------------------------------------------------------- pull requests


def named_feature(forge: Forge, *texts: str) -> MissionFeature | None:
    """The first feature key the pattern finds in `texts` (in order): its first group, or
    the whole match, compared case-insensitively with the mission's feature keys."""
    try:
        pattern = re.compile(forge.feature_pattern or DEFAULT_FEATURE_PATTERN, re.IGNORECASE)
    except re.error:  # validated when set; a stored one that no longer compiles names nothing
        return None
    features = {f.key.casefold(): f for f in MissionFeature.objects.filter(mission=forge.mission_id)}
    for text in texts:
        for found in pattern.finditer(text):
            key = found.group(1) if pattern.groups else found.group(0)
            if key and (feature := features.get(key.casefold())) is not None:
                return feature
    return None


def _pull_request(forge: Forge, change: PullRequestChange) -> Outcome:
    outcome = Outcome(DeliveryState.IGNORED, ref=change.branch[:300], head=change.head[:80], pull_number=change.number)
    stored = PullRequest.objects.filter(forge=forge, number=change.number).first()
    if change.only_if_head_moved and stored is not None and stored.head == change.head:
        outcome.reason = "the merge request's head did not move"
        return outcome
    feature = named_feature(forge, change.branch, change.title)
    _upsert(forge, change, feature)
    if feature is None:
        outcome.reason = "the pull request's branch and title name no feature of the mission"
        return outcome
    done = Task.objects.filter(feature=feature, status=TaskStatus.DONE, revision=change.head).order_by("-id").first()
    if done is not None:
        outcome.reason, outcome.task = ALREADY_JUDGED, done
        return outcome
    task = Task.objects.filter(feature=feature, status__in=TASK.open_states).order_by("id").first()
    if task is None:
        try:
            task = task_create(user=None, feature=feature)
        except DomainError as exc:
            outcome.state, outcome.reason = DeliveryState.FAILED, exc.detail
            return outcome
    return _complete(outcome, task)


def _upsert(forge: Forge, change: PullRequestChange, feature: MissionFeature | None) -> None:
    values = {
        "branch": change.branch,
        "title": change.title,
        "head": change.head[:80],
        "url": change.url,
        "feature_id": feature.pk if feature is not None else None,
    }
    PullRequest.objects.update_or_create(forge=forge, number=change.number, defaults=values)
