"""The private internals of Django, Dramatiq, Channels and django-eventstream that the fast
paths and backends read (docs/ARCHITECTURE.md, "Private internals"). Each is checked here:
an upgrade that changes one fails here, naming the file that relies on it and the version
installed. Then representative fast paths run both ways (`FUSION_FAST_PATHS` on and off)
against the test database, with identical results."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper
from django.db.models import Field, Model
from django.db.models import query as django_query
from django.db.models.sql import UpdateQuery
from django.db.models.sql.compiler import SQLCompiler

from missions.models import ContractAssertion, Milestone, Mission, MissionEvent, Task, TaskStatus

PRIVATE_INTERNALS = "docs/ARCHITECTURE.md, 'Private internals'"


def _changed(what: str, where: str, dist: str = "django") -> None:
    pytest.fail(f"{dist} {version(dist)} changed {what}: {where} relies on it; check it and update {PRIVATE_INTERNALS}")


def _attribute(owner: Any, name: str, where: str, dist: str = "django") -> Any:
    if not hasattr(owner, name):
        _changed(f"{getattr(owner, '__qualname__', type(owner).__qualname__)}.{name} (missing)", where, dist)
    return getattr(owner, name)


def _signature(func: Any, expected: list[str], where: str, dist: str = "django") -> None:
    got = list(inspect.signature(func).parameters)
    if got != expected:
        _changed(f"the signature of {func.__qualname__}: {got}, checked against {expected}", where, dist)


PREPARED = "fusion_site/runtime/prepared.py"
INSERTS = "fusion_site/runtime/inserts.py"
FASTPATHS = "missions/fastpaths.py"
STORAGE = "missions/streams/storage.py"
SQLITE = "fusion_site/sqlite/base.py and tests/support/locks.py"


@pytest.mark.django_db
def test_querysets_name_their_kind_of_result_and_what_runs_after_the_sql():
    where = f"{PREPARED} (_Compiled)"
    kinds = {
        "ModelIterable": Task.objects.all(),
        "ValuesListIterable": Task.objects.values_list("title"),
        "FlatValuesListIterable": Task.objects.values_list("title", flat=True),
    }
    for name, queryset in kinds.items():
        if _attribute(queryset, "_iterable_class", where) is not _attribute(django_query, name, where):
            _changed(f"the iterable class of {queryset.query} (not {name})", where)
    if Task.objects.prefetch_related("mission")._prefetch_related_lookups != ("mission",):
        _changed("QuerySet._prefetch_related_lookups", where)
    if _attribute(Task.objects.all(), "_known_related_objects", where) != {}:
        _changed("QuerySet._known_related_objects", where)


@pytest.mark.django_db
def test_the_sql_compiler_gives_what_a_prepared_read_rebuilds_its_rows_with():
    where = f"{PREPARED} (_Compiled)"
    queryset = Task.objects.select_related("mission").filter(pk=30_011)
    compiler = queryset.query.get_compiler(using=queryset.db)
    if not isinstance(compiler, SQLCompiler):
        _changed("Query.get_compiler (not an SQLCompiler)", where)
    sql, params = compiler.as_sql()
    if not isinstance(sql, str) or list(params) != [30_011]:
        _changed(f"SQLCompiler.as_sql's result ({sql!r}, {params!r})", where)
    for name in ("select", "col_count", "klass_info", "annotation_col_map", "has_extra_select"):
        _attribute(compiler, name, where)
    klass_info = compiler.klass_info
    if not isinstance(klass_info, dict) or not {"model", "select_fields", "related_klass_infos"} <= set(klass_info):
        _changed(f"SQLCompiler.klass_info's shape ({klass_info!r})", where)
    fields = [s[0] for s in compiler.select[: compiler.col_count]]
    if klass_info["model"] is not Task or fields[0].target.attname != "id":
        _changed("SQLCompiler.select's shape ((expression, sql, alias) with the model's columns first)", where)
    _signature(compiler.has_composite_fields, ["expressions"], where)
    _signature(compiler.get_converters, ["expressions"], where)
    converters = compiler.get_converters(fields)
    for position, pair in converters.items():
        if not isinstance(position, int) or len(pair) != 2 or not isinstance(pair[0], list):
            _changed(f"SQLCompiler.get_converters's result ({converters!r})", where)
    _signature(django_query.get_related_populators, ["klass_info", "select", "db"], where)
    populators = django_query.get_related_populators(klass_info, compiler.select, queryset.db)
    if len(populators) != 1 or not callable(getattr(populators[0], "populate", None)):
        _changed("get_related_populators's result (a RelatedPopulator per select_related object)", where)
    _signature(Model.from_db.__func__, ["cls", "db", "field_names", "values"], where)  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_an_update_compiles_as_a_prepared_update_expects():
    where = f"{PREPARED} (_update_sql, _Update)"
    query = Task.objects.filter(pk=30_011, status="\x1fold\x1f").query.chain(UpdateQuery)
    _signature(query.add_update_values, ["values"], where)
    query.add_update_values({"title": "new", "summary": "s"})
    if _attribute(query, "get_related_updates", where)() != []:
        _changed("UpdateQuery.get_related_updates (an update of a model without parents)", where)
    sql, params = query.get_compiler(connection.alias).as_sql()
    if list(params)[:2] != ["new", "s"] or "\x1fold\x1f" not in list(params)[2:]:
        _changed(f"the order of an UPDATE's parameters (the SET values first): {params!r}", where)
    _signature(transaction.mark_for_rollback_on_error, ["using"], where)


def test_the_backend_operations_and_fields_the_raw_statements_use():
    where = f"{PREPARED}, {INSERTS}, {FASTPATHS}, {STORAGE}"
    ops, features = connection.ops, connection.features
    _signature(ops.adapt_datetimefield_value, ["value"], where)
    _signature(ops.quote_name, ["name"], where)
    for name in ("has_select_for_update", "can_return_rows_from_bulk_insert", "can_return_columns_from_insert"):
        if not isinstance(_attribute(features, name, where), bool):
            _changed(f"DatabaseFeatures.{name} (not a bool)", where)
    _signature(Field.get_db_prep_save, ["self", "value", "connection"], where)
    _signature(Field.pre_save, ["self", "model_instance", "add"], where)
    _signature(Field.cast_db_type, ["self", "connection"], where)
    _signature(Field.has_db_default, ["self"], where)
    _attribute(Field, "db_returning", where)
    state = Task()._state
    if (_attribute(state, "adding", where), _attribute(state, "db", where)) != (True, None):
        _changed("Model._state (adding, db) of an unsaved object", where)


def test_sqlite_starts_its_transactions_where_the_gate_waits():
    where = SQLITE
    for name in ("_start_transaction_under_autocommit", "_commit", "_rollback", "_close"):
        _attribute(SQLiteWrapper, name, where)
        _signature(getattr(SQLiteWrapper, name), ["self"], where)
    if "_start_transaction_under_autocommit()" not in inspect.getsource(BaseDatabaseWrapper.set_autocommit):
        _changed("BaseDatabaseWrapper.set_autocommit (it starts no transaction under autocommit)", where)


def test_dramatiqs_redis_consumer_as_the_waking_broker_extends_it():
    where = "fusion_site/runtime/broker.py"
    from dramatiq.brokers import redis as dramatiq_redis

    consumer = _attribute(dramatiq_redis, "_RedisConsumer", where, "dramatiq")
    _signature(consumer.__init__, ["self", "broker", "queue_name", "prefetch", "timeout"], where, "dramatiq")
    _attribute(consumer, "outstanding_message_count", where, "dramatiq")
    source = inspect.getsource(consumer)
    for used in ("self.message_cache", "self.misses", "self.broker.do_fetch", "compute_backoff"):
        if used not in source:
            _changed(f"_RedisConsumer (it no longer uses {used})", where, "dramatiq")
    if "self.consumer_class(" not in inspect.getsource(dramatiq_redis.RedisBroker.consume):
        _changed("RedisBroker.consume (it builds no consumer_class)", where, "dramatiq")


def test_channels_in_memory_layer_as_the_embedded_layer_extends_it():
    where = "missions/streams/layer.py"
    from channels.layers import InMemoryChannelLayer

    layer = InMemoryChannelLayer()
    for name in ("_clean_expired", "channels", "groups", "expiry", "get_capacity"):
        _attribute(layer, name, where, "channels")
    _signature(layer._clean_expired, [], where, "channels")
    if not isinstance(layer.channels, dict) or not isinstance(layer.groups, dict):
        _changed("InMemoryChannelLayer.channels / .groups (not dicts)", where, "channels")


def test_django_eventstreams_model_storage_as_the_event_log_extends_it():
    from django_eventstream.models import Event as StoredEvent
    from django_eventstream.models import EventCounter
    from django_eventstream.storage import DjangoModelStorage

    where = STORAGE
    _signature(DjangoModelStorage.append_event, ["self", "channel", "event_type", "data"], where, "django-eventstream")
    _attribute(DjangoModelStorage, "trim_event_log", where, "django-eventstream")
    for model, names in (
        (StoredEvent, ("channel", "type", "data", "eid", "created")),
        (EventCounter, ("name", "value", "updated")),
    ):
        have = {f.name for f in model._meta.concrete_fields}
        if not set(names) <= have:
            _changed(f"{model.__name__}'s fields ({sorted(have)})", where, "django-eventstream")


# --- The fast paths both ways -------------------------------------------------------


def _fields(obj: Model, *skip: str) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.attname not in skip}


@pytest.mark.django_db
def test_representative_fast_paths_give_the_same_results_both_ways(settings, django_user_model):
    from fusion_site.runtime.inserts import insert
    from fusion_site.runtime.prepared import Prepared, PreparedUpdate, compare_and_set
    from missions import audit, fastpaths

    mission = Mission.objects.create(key="both", title="both", owner=django_user_model.objects.create_user("o"))
    milestone = Milestone.objects.create(mission=mission, key="m", title="m")
    for key, scope in (("VAL-1", "feature"), ("VAL-2", "milestone")):
        ContractAssertion.objects.create(milestone=milestone, key=key, title=key, statement="s", scope=scope)
    tasks = Prepared(lambda mission: Task.objects.select_related("mission").filter(mission_id=mission).order_by("pk"))
    titles = Prepared(lambda mission: Task.objects.filter(mission_id=mission).values_list("title", flat=True))
    touch = PreparedUpdate(lambda pk, at: (Task.objects.filter(pk=pk), {"updated_at": at}), at=datetime)
    results: dict[bool, dict[str, Any]] = {}
    for fast in (True, False):
        settings.FUSION_FAST_PATHS = fast
        name = f"task {fast}"
        stored = insert([Task(mission=mission, title=name), Task(mission=mission, title=name + "b")])
        at = datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=UTC) + timedelta(days=int(fast))
        event = audit.append(mission.pk, "task.created", {"n": name}, None)
        results[fast] = {
            "inserted": [(type(t), t._state.adding, t._state.db, t.pk is not None) for t in stored],
            "read": [
                (_fields(t, "id", "created_at", "updated_at", "title"), _fields(t.mission, "event_seq", "updated_at"))
                for t in tasks.all(mission=mission.pk)[-2:]
            ],
            "first": type(tasks.first(mission=mission.pk)),
            "titles": sorted(titles.all(mission=mission.pk)),
            "touched": (touch.run(pk=stored[0].pk, at=at), Task.objects.get(pk=stored[0].pk).updated_at - at),
            # The same compare-and-swap twice: the first moves the row (1), the second finds it moved (0).
            "moved": [
                compare_and_set(
                    Task, pk=stored[1].pk, field="status", old=TaskStatus.TODO, updates={"status": TaskStatus.DONE}
                )
                for _ in range(2)
            ],
            "event": (
                type(event),
                event.seq - MissionEvent.objects.filter(mission=mission).count(),
                event.type,
                event._state.adding,
            ),
            "missing": pytest.raises(Task.DoesNotExist, Prepared(lambda pk: Task.objects.filter(pk=pk)).get, pk=0).type,
            "rollup": (
                fastpaths.milestone_rollup_row(milestone_id=milestone.pk),
                fastpaths.milestone_rollup_row(milestone_id=0),
            ),
        }
    # The titles differ by the pass they were written in; everything else is the same.
    results[True]["titles"] = [t.replace("True", "False") for t in results[True]["titles"] if "True" in t]
    results[False]["titles"] = [t for t in results[False]["titles"] if "False" in t]
    assert results[True]["read"] == results[False]["read"]
    assert results[True] == results[False]
