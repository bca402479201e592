"""One lock order (docs/RELIABILITY.md, "Lock order"): every writer of a mission's rows
takes the mission's row lock first. An assertion edited while a verdict judging it is
recorded used to lock the assertion's row, then wait for the mission's lock, while the
verdict held the mission's lock and waited for the assertion's row: on PostgreSQL one of
them was killed as a deadlock.

Real threads, each with its own connection, released together by a barrier, many rounds
on one mission. Valid in both shapes: on SQLite the IMMEDIATE transactions serialize
the writers (the race cannot deadlock there, and both effects must land all the same);
on PostgreSQL the transactions interleave and the row locks decide."""

from __future__ import annotations

import os

import pytest

from missions.models import ContractAssertion, MissionEvent
from missions.services.hierarchy import assertion_update
from tests.validation.test_concurrency_pg import features, pass_verdict, race
from validation.models import RunStatus, ValidatorRun
from validation.services.verdicts.admit import feature_admit
from validation.services.verdicts.complete import run_complete

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = int(os.environ.get("FUSION_LOCK_ORDER_ROUNDS", "30"))


def test_an_assertion_edit_racing_the_verdict_that_judges_it_never_deadlocks(
    idle_broker, build_mission, git_repo, staff
):
    rounds = features(build_mission, git_repo, ROUNDS)
    for i, feature in enumerate(rounds):
        run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
        assert run is not None and run.status == RunStatus.RUNNING
        loaded = ValidatorRun.objects.select_related("mission").get(pk=run.pk)  # as the worker holds it
        assertion = ContractAssertion.objects.get(key=f"VAL-{i}")

        def edit(assertion=assertion, i=i):
            return assertion_update(user=staff, assertion=assertion, title=f"VAL-{i} holds, said again")

        def verdict(run=loaded, i=i):
            return run_complete(run_id=run.pk, verdict=pass_verdict(f"VAL-{i}"), run=run)

        edited, completed = race(edit, verdict)
        assert not isinstance(edited, BaseException), f"round {i}: the edit failed: {edited!r}"
        assert not isinstance(completed, BaseException), f"round {i}: the verdict failed: {completed!r}"
        assert completed is True
        # Both effects landed: the edit's title and event, the verdict's status and run.
        assertion.refresh_from_db()
        assert (assertion.title, assertion.status) == (f"VAL-{i} holds, said again", "passed")
        assert ValidatorRun.objects.get(pk=run.pk).status == RunStatus.PASSED
        updated = MissionEvent.objects.filter(type="assertion:updated", payload__assertion=assertion.pk)
        judged = MissionEvent.objects.filter(type="assertion:judged", payload__assertion=assertion.pk)
        assert (updated.count(), judged.count()) == (1, 1)
    seqs = list(MissionEvent.objects.filter(mission=rounds[0].mission).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))  # the audit log stays gapless
