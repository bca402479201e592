"""`fusion_site.runtime.inserts`: new rows in one statement, stored and returned exactly as
`bulk_create` stores and returns them — on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from fusion_site.runtime.inserts import insert
from missions.models import Task, TaskStatus
from tests.test_prepared import _fields, _tree
from validation.models import JournalEntry, ValidatorRun

pytestmark = pytest.mark.django_db


def _tasks(mission, feature, prefix: str) -> list[Task]:
    return [
        Task(mission=mission, feature=feature, title=f"{prefix} één", status=TaskStatus.DONE, revision="a" * 40),
        Task(mission=mission, feature=None, title=f"{prefix} two"),
        Task(mission=mission, feature=feature, title=f"{prefix} three", summary="x" * 500),
    ]


def test_rows_are_stored_and_returned_as_bulk_create_stores_them(django_user_model):
    mission, _milestone, feature = _tree(django_user_model.objects.create_user("owner"), "alpha")
    ours, theirs = _tasks(mission, feature, "ours"), _tasks(mission, feature, "theirs")
    with CaptureQueriesContext(connection) as queries:
        returned = insert(ours)
    Task.objects.bulk_create(theirs)
    assert len(queries) == 1 and returned is ours
    assert [t.pk for t in ours] == sorted(t.pk for t in ours)  # the keys, in the objects' order
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine._state.adding is False and mine._state.db == "default"
        assert mine.created_at is not None and mine.created_at.tzinfo is not None
        stored, expected = _fields(Task.objects.get(pk=mine.pk)), _fields(Task.objects.get(pk=reference.pk))
        assert stored == _fields(mine)  # what the object holds is what was stored
        for changing in ("id", "created_at", "updated_at", "title"):
            stored.pop(changing), expected.pop(changing)
        assert stored == expected


def test_a_journal_entry_keeps_its_payload_and_a_duplicate_stores_nothing(django_user_model):
    mission, milestone, feature = _tree(django_user_model.objects.create_user("owner"), "beta")
    run = ValidatorRun.objects.create(mission=mission, feature=feature, milestone=milestone)
    payload = {"checks": [{"ok": True, "out": "naïve ✓", "n": 3}], "empty": {}}
    [entry] = insert([JournalEntry(run=run, seq=1, kind="check", key="VAL-1", payload=payload, sha256="f" * 64)])
    assert JournalEntry.objects.get(pk=entry.pk).payload == payload
    twice = [
        JournalEntry(run=run, seq=2, kind="check", key="VAL-2", payload={}, sha256="e" * 64),
        JournalEntry(run=run, seq=1, kind="check", key="VAL-1", payload={}, sha256="d" * 64),
    ]
    with pytest.raises(IntegrityError), transaction.atomic():
        insert(twice)
    assert list(JournalEntry.objects.filter(run=run).values_list("seq", flat=True)) == [1]
