"""`journal.held`: a checks-only run journals its check results with its decision, in the
completion's transaction; whatever else happens, nothing held is lost or reordered."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from tests.support.agent_env import hello_feature, start_run  # noqa: F401
from tests.support.verdicts import passing
from validation import journal
from validation.context import ValidatorCrashed
from validation.models import JournalEntry, RunStatus, ValidatorRun
from validation.services import runner
from validation.services.runner import execute_run
from validation.verdict import Verdict

pytestmark = pytest.mark.django_db(transaction=True)

CHECKS = [("VAL-1", {"file": "hello.py", "contains": "def hello"}), ("VAL-2", {"run": "python hello.py"})]


def _chain(run) -> list[tuple[str, str]]:
    return list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("kind", "key"))


def _journal_inserts(queries) -> int:
    return sum(1 for q in queries if q["sql"].lstrip().upper().startswith("INSERT") and "journalentry" in q["sql"])


def test_a_checks_run_writes_its_checks_and_decision_in_one_insert(hello_feature):
    run = start_run(hello_feature(CHECKS, validator="checks"))
    with CaptureQueriesContext(connection) as queries:
        assert execute_run(run.pk) == RunStatus.PASSED
    assert _journal_inserts(queries.captured_queries) == 1
    # A run judged for the first time has no final decision to read back: none is read.
    assert not [
        q for q in queries.captured_queries if q["sql"].startswith('SELECT "validation_journalentry"."payload"')
    ]
    assert _chain(run) == [("check", "VAL-1"), ("check", "VAL-2"), ("decision", "final")]
    assert journal.verify_chain(run.pk).ok


def test_a_running_run_whose_journal_holds_its_accepted_decision_completes_from_it(hello_feature, monkeypatch):
    """The decision was journaled, its completion never happened (a journal written so by
    an earlier release): the redelivered message completes the run from the journal and
    judges nothing again."""
    run = start_run(hello_feature(CHECKS, validator="checks"))
    accepted = Verdict.model_validate(passing("VAL-1", "VAL-2"))
    journal.append(
        run_id=run.pk,
        kind="decision",
        key="final",
        payload=runner.accepted_decision(accepted, tokens_in=3, tokens_out=4),
    )

    def judged_again(*_args, **_kwargs):
        raise AssertionError("the run was judged a second time")

    monkeypatch.setattr(runner, "judge", judged_again)
    assert execute_run(run.pk) == RunStatus.PASSED
    run.refresh_from_db()
    assert (run.status, run.tokens_in, run.tokens_out) == (RunStatus.PASSED, 3, 4)


def test_a_run_that_fails_after_its_checks_still_journals_them(hello_feature, monkeypatch):
    """The checks ran, then the host's acceptance broke: the run ends in error and its
    journal holds the check results, written as the exception left the held block."""

    def broken(*_args, **_kwargs):
        raise ValidatorCrashed("the host could not accept it", code="host_defect")

    monkeypatch.setattr("validation.services.runner.host_accept", broken)
    run = start_run(hello_feature(CHECKS, validator="checks"))
    assert execute_run(run.pk) == RunStatus.ERROR
    assert _chain(run) == [("check", "VAL-1"), ("check", "VAL-2")]
    assert journal.verify_chain(run.pk).ok


def test_held_entries_wait_for_the_caller_and_keep_their_order(hello_feature):
    run = start_run(hello_feature(CHECKS, validator="checks"))
    with journal.held(run.pk) as held:
        assert journal.append_many(run_id=run.pk, entries=[("check", "A", {"n": 1})], hold=True) == []
        assert _chain(run) == []  # nothing written yet
    assert _chain(run) == []  # a normal exit hands them over
    journal.append_many(run_id=run.pk, entries=[*held.take(), ("decision", "final", {"verdict": "accepted"})])
    assert _chain(run) == [("check", "A"), ("decision", "final")]
    assert held.take() == []


def test_another_append_in_the_block_writes_the_held_ones_first(hello_feature):
    run = start_run(hello_feature(CHECKS, validator="checks"))
    with journal.held(run.pk) as held:
        journal.append_many(run_id=run.pk, entries=[("check", "A", {})], hold=True)
        with CaptureQueriesContext(connection) as queries:
            journal.append(run_id=run.pk, kind="model_request", key="1", payload={"ordinal": 1})
        assert _journal_inserts(queries.captured_queries) == 1
        assert _chain(run) == [("check", "A"), ("model_request", "1")]
        assert held.entries == []
    assert journal.verify_chain(run.pk).ok


def test_an_exception_writes_the_held_entries_before_it_goes_on(hello_feature):
    run = start_run(hello_feature(CHECKS, validator="checks"))
    with pytest.raises(RuntimeError, match="the check tool broke"), journal.held(run.pk):
        journal.append_many(run_id=run.pk, entries=[("check", "A", {}), ("check", "B", {})], hold=True)
        raise RuntimeError("the check tool broke")
    assert _chain(run) == [("check", "A"), ("check", "B")]
    assert journal.verify_chain(run.pk).ok


def append_in_another_thread(run_id: int) -> None:
    try:
        journal.append_many(run_id=run_id, entries=[("check", "T", {})], hold=True)
    finally:
        connections.close_all()  # this thread's own connection


def test_only_this_run_in_this_thread_is_held(hello_feature):
    run = start_run(hello_feature(CHECKS, validator="checks"))
    other = ValidatorRun.objects.get(pk=run.pk)
    other.pk, other.status = None, RunStatus.ERROR  # another run of the feature (one runs at a time)
    other.save()
    with journal.held(run.pk):
        journal.append_many(run_id=other.pk, entries=[("check", "X", {})], hold=True)
        thread = threading.Thread(target=append_in_another_thread, args=(run.pk,))
        thread.start()
        thread.join()
        assert _chain(other) == [("check", "X")]  # another run: written at once
        assert _chain(run) == [("check", "T")]  # another thread: written at once
    assert journal.append_many(run_id=run.pk, entries=[("check", "Y", {})], hold=True)  # no block: written
    assert _chain(run) == [("check", "T"), ("check", "Y")]
