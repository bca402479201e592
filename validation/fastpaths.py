"""Validation's fast paths: the judging loop's hot statements, each behind a named function.

Every judged feature runs each of these once or more (its task read, its admission's locked
feature and earlier runs, its run's claim, the revision it stands on, its frozen assertion
set, its journal's head and rows, its completion's locked feature): the same statement
each time, only the ids change. Building and compiling a queryset costs about ten times as
much interpreter time as running its SQL, so each is compiled once per process
(`fusion_site/runtime/prepared.py`) or written once (`fusion_site/runtime/inserts.py`):
the worker's steps went from about 52,200 to 20,600 Python calls per feature
(docs/BENCHMARKS.md, "Loop throughput": "Statements compiled once per process").

This module is the only one of the floor that imports those two: domain code calls the
functions below like any selector. With `FUSION_FAST_PATHS=off`
(`fusion_site/runtime/fast_paths.py`) each of them evaluates the plain queryset,
`.update()` or `bulk_create` it describes: the same rows and return values, through the ORM.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Exists, OuterRef, Q

from fusion_site.runtime import inserts
from fusion_site.runtime.prepared import Prepared, PreparedUpdate
from missions.models import AssertionScope, MissionFeature, Task
from missions.selectors import done_tasks
from validation.models import JUDGED, FixLineage, JournalEntry, RunStatus, ValidatorRun

# --- step 1, a completed task (verdicts/task.py).

_TASK: Prepared[Task] = Prepared(lambda pk: Task.objects.select_related("mission", "feature").filter(pk=pk))
_JUDGING: Prepared[int] = Prepared(
    lambda feature, revision, attempt: (
        ValidatorRun.objects.filter(feature_id=feature, revision=revision, implementation_attempt=attempt)
        .exclude(status=RunStatus.ERROR)
        .values_list("pk", flat=True)[:1]
    ),
    revision=str,
)


def task_with_feature(*, task_id: int) -> Task:
    """The task with its mission and feature; `Task.DoesNotExist`."""
    return _TASK.get(pk=task_id)


def judging_run_id(*, feature_id: int, revision: str, attempt: int) -> int | None:
    """A run of this revision and attempt that did not end in error (judged, or being judged)."""
    return _JUDGING.first(feature=feature_id, revision=revision, attempt=attempt)


# --- step 2, admission (verdicts/admit.py).


def _locked_for_admission(pk: int) -> Any:
    """The feature locked, with its mission and slice. `of`: the feature row is the one
    locked (the mission's is, by `lock_mission`; the slice's need not be)."""
    of = connections[MissionFeature.objects.db].features.has_select_for_update_of
    locked = MissionFeature.objects.select_for_update(of=("self",)) if of else MissionFeature.objects
    return locked.select_related("mission", "slice__milestone").filter(pk=pk)


_ADMITTED_FEATURE: Prepared[MissionFeature] = Prepared(_locked_for_admission)
_RUNNING: Prepared[int] = Prepared(
    lambda feature: ValidatorRun.objects.filter(feature_id=feature, status=RunStatus.RUNNING).values_list(
        "pk", flat=True
    )[:1]
)
# Every judged run on one input, newest first (a handful).
_JUDGED: Prepared[tuple[int, str]] = Prepared(
    lambda feature, fingerprint: (
        ValidatorRun.objects.filter(feature_id=feature, input_fingerprint=fingerprint, status__in=JUDGED)
        .order_by("-id")
        .values_list("pk", "status")
    ),
    fingerprint=str,
)


def feature_locked_for_admission(*, feature_id: int) -> MissionFeature:
    """The feature row locked, read with its mission, slice and milestone; `DoesNotExist`."""
    return _ADMITTED_FEATURE.get(pk=feature_id)


def running_run_ids(*, feature_id: int) -> list[int]:
    """The feature's running run's id (at most one)."""
    return _RUNNING.all(feature=feature_id)


def judged_runs(*, feature_id: int, fingerprint: str) -> list[tuple[int, str]]:
    """(id, status) of every judged run of the feature on this input, newest first."""
    return _JUDGED.all(feature=feature_id, fingerprint=fingerprint)


# --- step 4, the run (services/runner.py, services/run_input.py, selectors.py).

# `now` and `at` take the same value: a prepared parameter stands in one place only.
_CLAIM = PreparedUpdate(
    lambda pk, now, token, until, at: (
        ValidatorRun.objects.filter(
            Q(claim_token="") | Q(lease_until__isnull=True) | Q(lease_until__lt=now), pk=pk, status=RunStatus.RUNNING
        ),
        {"claim_token": token, "lease_until": until, "updated_at": at},
    ),
    now=datetime,
    token=str,
    until=datetime,
    at=datetime,
)
# With whether its journal holds a final decision (`decided`): a run judged for the first
# time has no journal, and this costs no round trip of its own.
_CLAIMED: Prepared[ValidatorRun] = Prepared(
    lambda pk: (
        ValidatorRun.objects.select_related("mission", "feature", "milestone")
        .annotate(decided=Exists(JournalEntry.objects.filter(run=OuterRef("pk"), kind="decision", key="final")))
        .filter(pk=pk)
    )
)


def run_claim(*, run_id: int, now: datetime, token: str, until: datetime) -> bool:
    """Claim a running run by compare-and-swap: unclaimed, or its holder's lease ended
    before `now`. True: claimed, with `token`, leased until `until`."""
    return bool(_CLAIM.run(pk=run_id, now=now, token=token, until=until, at=now))


def claimed_run(*, run_id: int) -> ValidatorRun:
    """The run with its mission, feature and milestone, and `decided`: whether its journal
    holds a final decision; `DoesNotExist`."""
    return _CLAIMED.get(pk=run_id)


_LINEAGE: Prepared[int] = Prepared(
    lambda root: FixLineage.objects.filter(root_id=root).values_list("fix_id", flat=True)
)
_LANDED: Prepared[tuple[datetime | None, str]] = Prepared(
    lambda feature: done_tasks(features=MissionFeature(pk=feature)).values_list("finished_at", "revision")[:1]
)


def lineage_fix_ids(*, root_id: int) -> list[int]:
    """The fixes of the lineage whose root is `root_id`."""
    return _LINEAGE.all(root=root_id)


def last_landed(*, feature_id: int) -> tuple[datetime | None, str] | None:
    """(finished_at, revision) of the task that landed last on the feature."""
    return _LANDED.first(feature=feature_id)


@functools.cache
def _assertion_values(fields: tuple[str, ...]) -> Prepared[tuple]:
    return Prepared(
        lambda feature: (
            MissionFeature(pk=feature)
            .assertions.filter(scope=AssertionScope.FEATURE)
            .order_by("order", "id")
            .values_list(*fields)
        )
    )


def feature_assertion_values(*, feature_id: int, fields: tuple[str, ...]) -> list[tuple]:
    """The `fields` of the feature's own assertions, in their order."""
    return _assertion_values(fields).all(feature=feature_id)


# --- the journal (validation/journal.py).

_RUN_LOCK: Prepared[int] = Prepared(
    lambda pk: ValidatorRun.objects.select_for_update().filter(pk=pk).values_list("pk", flat=True)
)
# The chain's head: its last entry's seq and hash.
_HEAD: Prepared[tuple[int, str]] = Prepared(
    lambda run: JournalEntry.objects.filter(run_id=run).order_by("-seq").values_list("seq", "sha256")[:1]
)


def run_lock(*, run_id: int) -> None:
    """`SELECT … FOR UPDATE` of the run's row (PostgreSQL: it orders a run's appenders)."""
    _RUN_LOCK.all(pk=run_id)


def journal_head(*, run_id: int) -> tuple[int, str] | None:
    """The run's journal's last entry: (seq, sha256); None for an empty journal."""
    return _HEAD.first(run=run_id)


def journal_insert(*, entries: list[JournalEntry]) -> list[JournalEntry]:
    """The unsaved journal rows inserted in one statement; returns them saved."""
    return inserts.insert(entries)


# --- step 5, the completion (verdicts/complete.py).

_LOCKED_FEATURE: Prepared[MissionFeature] = Prepared(
    lambda pk: MissionFeature.objects.select_for_update().filter(pk=pk)
)


def feature_locked(*, feature_id: int) -> MissionFeature:
    """The feature row locked `FOR UPDATE`; `DoesNotExist`."""
    return _LOCKED_FEATURE.get(pk=feature_id)
