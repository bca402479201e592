"""`fusion_site.runtime.prepared`: a statement compiled once gives, for every new parameter
value, exactly what the queryset it was built from gives — on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from fusion_site.runtime.prepared import Prepared, PreparedError
from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice, Task, TaskStatus


def _tree(owner, key: str):
    mission = Mission.objects.create(key=key, title=key, owner=owner, status="active")
    milestone = Milestone.objects.create(mission=mission, key="m", title="m")
    slice_ = Slice(milestone=milestone, key="s", title="s")
    slice_.save()
    feature = MissionFeature(slice=slice_, key="f", title="f")
    feature.save()
    return mission, milestone, feature


@pytest.fixture
def tree(django_user_model):
    owner = django_user_model.objects.create_user("owner")
    return _tree(owner, "alpha")


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


TASK_WITH: Prepared[Task] = Prepared(lambda pk: Task.objects.select_related("mission", "feature").filter(pk=pk))


@pytest.mark.django_db
def test_models_with_their_related_objects_equal_the_querysets(tree):
    mission, _milestone, feature = tree
    with_feature = Task.objects.create(mission=mission, feature=feature, title="t1", status=TaskStatus.DONE)
    alone = Task.objects.create(mission=mission, feature=None, title="t2")
    for task in (with_feature, alone):
        expected = Task.objects.select_related("mission", "feature").get(pk=task.pk)
        with CaptureQueriesContext(connection) as queries:
            got = TASK_WITH.get(pk=task.pk)
            # The related objects came with the one statement: reading them queries nothing.
            related = (got.mission, got.feature)
        assert len(queries) == 1
        assert _fields(got) == _fields(expected)
        assert _fields(related[0]) == _fields(expected.mission)
        assert (related[1] and _fields(related[1])) == (expected.feature and _fields(expected.feature))
        assert isinstance(got.created_at, datetime) and got.created_at.tzinfo is not None
        assert got._state.adding is False and got._state.db == "default"
    assert alone.feature_id is None and TASK_WITH.get(pk=alone.pk).feature is None


@pytest.mark.django_db
def test_each_call_takes_its_own_values(tree, django_user_model):
    mission, milestone, feature = tree
    other_mission, _m, other_feature = _tree(django_user_model.objects.create_user("b"), "beta")
    assert TASK_WITH.first(pk=10**6) is None
    with pytest.raises(Task.DoesNotExist):
        TASK_WITH.get(pk=10**6)
    one = Task.objects.create(mission=mission, feature=feature, title="one")
    two = Task.objects.create(mission=other_mission, feature=other_feature, title="two")
    assert TASK_WITH.get(pk=one.pk).mission.key == "alpha"
    assert TASK_WITH.get(pk=two.pk).mission.key == "beta"
    assert [t.title for t in TASK_WITH.all(pk=one.pk)] == ["one"]


@pytest.mark.django_db
def test_string_parameters_are_bound_not_spliced(tree):
    mission, milestone, _feature = tree
    by_key: Prepared[str] = Prepared(
        lambda mission, key: ContractAssertion.objects.filter(mission_id=mission, key=key).values_list(
            "title", flat=True
        ),
        key=str,
    )
    tricky = 'it\'s "quoted" %s; -- ünï'
    ContractAssertion.objects.create(milestone=milestone, key=tricky, title="found", statement="s")
    ContractAssertion.objects.create(milestone=milestone, key="plain", title="other", statement="s")
    assert by_key.all(mission=mission.pk, key=tricky) == ["found"]
    assert by_key.all(mission=mission.pk, key="plain") == ["other"]
    assert by_key.all(mission=mission.pk, key="' OR 1=1 --") == []


@pytest.mark.django_db
def test_a_value_the_driver_binds_as_a_typed_integer(tree, settings):
    """PostgreSQL's backend hands a positive integer's value to psycopg as `Int4`: a new
    value is bound the same way (and a count of attempts finds its row, or none)."""
    _mission, _milestone, feature = tree
    MissionFeature.objects.filter(pk=feature.pk).update(implementation_attempts=3)
    at: Prepared[str] = Prepared(
        lambda pk, attempts: MissionFeature.objects.filter(pk=pk, implementation_attempts=attempts).values_list(
            "key", flat=True
        )
    )
    assert at.all(pk=feature.pk, attempts=3) == ["f"]
    assert at.all(pk=feature.pk, attempts=2) == []
    if connection.vendor == "postgresql":  # an `integer` column: a value past it is refused, not sent
        settings.FUSION_FAST_PATHS = True  # (the ORM's route compiles "matches nothing")
        with pytest.raises(ValueError, match="integer range"):
            at.all(pk=feature.pk, attempts=2**31)


@pytest.mark.django_db
def test_values_list_rows_convert_like_the_orm(tree):
    _mission, milestone, _feature = tree
    spec = {"file": "a.txt", "contains": "x"}
    made = ContractAssertion.objects.create(milestone=milestone, key="A", title="a", statement="s", check_spec=spec)
    rows: list[Any] = Prepared(
        lambda pk: ContractAssertion.objects.filter(pk=pk).values_list("key", "check_spec", "created_at")
    ).all(pk=made.pk)
    assert rows == list(ContractAssertion.objects.filter(pk=made.pk).values_list("key", "check_spec", "created_at"))
    assert rows[0][1] == spec  # JSON decoded, not its text


@pytest.mark.django_db
def test_more_than_one_row_is_refused_by_get(tree):
    mission, _milestone, feature = tree
    by_mission: Prepared[Any] = Prepared(lambda mission: Task.objects.filter(mission_id=mission))
    Task.objects.create(mission=mission, feature=feature, title="a")
    Task.objects.create(mission=mission, feature=feature, title="b")
    with pytest.raises(Task.MultipleObjectsReturned):
        by_mission.get(mission=mission.pk)


@pytest.mark.django_db(transaction=True)
def test_a_locking_read_needs_a_transaction(django_user_model):
    mission, _milestone, _feature = _tree(django_user_model.objects.create_user("l"), "alpha")
    locked: Prepared[Any] = Prepared(lambda pk: Mission.objects.select_for_update().filter(pk=pk))
    with transaction.atomic():
        assert locked.get(pk=mission.pk).key == "alpha"
    if connection.features.has_select_for_update:
        with pytest.raises(TransactionManagementError):
            locked.get(pk=mission.pk)


def test_a_query_it_cannot_rebuild_faithfully_fails_loudly(db, settings):
    settings.FUSION_FAST_PATHS = True  # the compiler's checks: FUSION_FAST_PATHS=off compiles nothing
    twice: Prepared[Any] = Prepared(lambda pk: Task.objects.filter(pk=pk, mission_id=pk))
    with pytest.raises(PreparedError, match="2 times"):
        twice.all(pk=1)
    unused: Prepared[Any] = Prepared(lambda pk: Task.objects.all())
    with pytest.raises(PreparedError, match="0 times"):
        unused.all(pk=1)
    trimmed: Prepared[Any] = Prepared(
        lambda pk: Task.objects.filter(mission_id=pk).order_by("created_at").distinct().values_list("title", flat=True)
    )
    with pytest.raises(PreparedError, match="extra columns"):
        trimmed.all(pk=1)
    dicts: Prepared[Any] = Prepared(lambda pk: Task.objects.filter(pk=pk).values("title"))
    with pytest.raises(PreparedError, match="ValuesIterable"):
        dicts.all(pk=1)
    prefetching: Prepared[Any] = Prepared(lambda pk: Mission.objects.prefetch_related("tasks").filter(pk=pk))
    with pytest.raises(PreparedError, match="prefetch_related"):
        prefetching.all(pk=1)
    with pytest.raises(PreparedError):
        Prepared(lambda ratio: Task.objects.filter(pk=ratio), ratio=float)


def test_parameters_are_checked(db):
    with pytest.raises(TypeError, match="expected parameters"):
        TASK_WITH.get(id=1)
    with pytest.raises(TypeError, match="must be int"):
        TASK_WITH.get(pk="1")
    with pytest.raises(TypeError, match="must be int"):
        TASK_WITH.get(pk=True)
    with pytest.raises(ValueError, match="integer range"):
        TASK_WITH.get(pk=2**63)


@pytest.mark.django_db(transaction=True)
def test_compiled_in_one_thread_runs_in_another(django_user_model):
    """Workers are threads, each with its own connection: the statement is shared."""
    mission, _milestone, feature = _tree(django_user_model.objects.create_user("t"), "gamma")
    task = Task.objects.create(mission=mission, feature=feature, title="threaded")
    shared: Prepared[Any] = Prepared(lambda pk: Task.objects.select_related("mission").filter(pk=pk))
    assert shared.get(pk=task.pk).mission.key == "gamma"  # compiled here
    seen: list[str] = []

    def other() -> None:
        try:
            seen.append(shared.get(pk=task.pk).mission.key)
        finally:
            close_old_connections()
            connection.close()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(timeout=60)
    assert seen == ["gamma"]


@pytest.mark.django_db
def test_compare_and_set_moves_only_from_the_expected_state(tree):
    from django.db.models import F
    from django.utils import timezone

    from fusion_site.runtime.prepared import compare_and_set

    _mission, _milestone, feature = tree
    when = timezone.now()
    first = {"loop_state": "implementing", "updated_at": when, "stop_detail": "it's 'quoted'", "stopped_at": when}
    assert compare_and_set(MissionFeature, pk=feature.pk, field="loop_state", old="idle", updates=first) == 1
    # The same shape again from a state the row is not in: nothing changes.
    lost = {**first, "loop_state": "validating", "stop_detail": "lost"}
    assert compare_and_set(MissionFeature, pk=feature.pk, field="loop_state", old="idle", updates=lost) == 0
    row = MissionFeature.objects.get(pk=feature.pk)
    assert (row.loop_state, row.stop_detail, row.stopped_at, row.updated_at) == (
        "implementing",
        "it's 'quoted'",
        when,
        when,
    )
    # None is a NULL (another statement than a value), an expression goes through the ORM.
    cleared = {"loop_state": "validating", "stopped_at": None, "validator_attempts": F("validator_attempts") + 2}
    assert compare_and_set(MissionFeature, pk=feature.pk, field="loop_state", old="implementing", updates=cleared) == 1
    row.refresh_from_db()
    assert (row.loop_state, row.stopped_at, row.validator_attempts) == (
        "validating",
        None,
        feature.validator_attempts + 2,
    )
    other = {"loop_state": "passed", "stopped_at": when}
    assert compare_and_set(MissionFeature, pk=10**6, field="loop_state", old="validating", updates=other) == 0


@pytest.mark.django_db
def test_a_prepared_update_compares_and_sets_datetimes_like_the_orm(tree):
    """The shape of a run's claim: a row changes only while its lease is free or past."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from fusion_site.runtime.prepared import PreparedUpdate

    mission, _milestone, feature = tree
    task = Task.objects.create(mission=mission, feature=feature, title="t", status=TaskStatus.IN_PROGRESS)
    claim = PreparedUpdate(
        lambda pk, now, title, until: (
            Task.objects.filter(
                Q(started_at__isnull=True) | Q(started_at__lt=now), pk=pk, status=TaskStatus.IN_PROGRESS
            ),
            {"title": title, "started_at": until},
        ),
        now=datetime,
        title=str,
        until=datetime,
    )
    now = timezone.now()
    later = now + timedelta(minutes=5, microseconds=7)
    assert claim.run(pk=task.pk, now=now, title="first", until=later) == 1
    task.refresh_from_db()
    assert (task.title, task.started_at) == ("first", later)
    # Held until `later`: a claim before then changes nothing, one after it takes the row.
    assert claim.run(pk=task.pk, now=later - timedelta(microseconds=1), title="second", until=later) == 0
    assert claim.run(pk=task.pk, now=later + timedelta(microseconds=1), title="third", until=now) == 1
    task.refresh_from_db()
    assert (task.title, task.started_at) == ("third", now)
    with pytest.raises(TypeError, match="aware"):
        claim.run(pk=task.pk, now=datetime(2030, 1, 1), title="x", until=now)  # noqa: DTZ001 — the refused kind
    assert Task.objects.get(pk=task.pk).title == "third"
