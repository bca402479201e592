"""The mission lock (`missions/locks.py`): taken once per transaction, recorded for as long
as the transaction holds it (gone at commit, at rollback and with a savepoint rolled back),
and asserted by what runs below the entry points."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from missions.locks import assert_mission_locked, lock_mission, locked_mission, mission_locked
from missions.models import Mission

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def mission(owner) -> Mission:
    return Mission.objects.create(key="m", title="M", owner=owner)


def test_the_lock_is_recorded_until_the_transaction_ends(mission):
    assert not mission_locked(mission.pk)
    with transaction.atomic():
        assert not mission_locked(mission.pk)
        lock_mission(mission.pk)
        assert mission_locked(mission.pk)
        assert not mission_locked(mission.pk + 1)
    assert not mission_locked(mission.pk)
    with pytest.raises(RuntimeError), transaction.atomic():
        lock_mission(mission.pk)
        raise RuntimeError
    assert not mission_locked(mission.pk)


def test_a_savepoint_rolled_back_takes_its_lock_with_it(mission):
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            lock_mission(mission.pk)
            raise RuntimeError
        assert not mission_locked(mission.pk)
        with transaction.atomic():
            lock_mission(mission.pk)
        assert mission_locked(mission.pk)  # a savepoint released into the transaction keeps it


def test_a_second_lock_in_the_transaction_costs_no_query(mission, django_assert_num_queries):
    first = 1 if connection.features.has_select_for_update else 0  # SQLite: IMMEDIATE transactions
    with transaction.atomic():
        with django_assert_num_queries(first):
            lock_mission(mission.pk)
        with django_assert_num_queries(0):
            lock_mission(mission.pk)


def test_locked_mission_reads_the_row_and_records_the_lock(mission):
    with transaction.atomic():
        found = locked_mission(pk=mission.pk)
        assert found == mission and mission_locked(mission.pk)
        assert locked_mission(pk=mission.pk + 1) is None


def test_what_runs_below_the_entry_points_asserts_the_lock(mission, settings):
    with pytest.raises(AssertionError, match="without the lock"), transaction.atomic():
        assert_mission_locked(mission.pk)
    with transaction.atomic():
        lock_mission(mission.pk)
        assert_mission_locked(mission.pk)
    settings.FUSION_STRICT = False
    assert_mission_locked(mission.pk)  # production: not checked
