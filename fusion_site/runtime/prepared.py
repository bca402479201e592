"""Querysets compiled once per process and run again with new parameter values.

The loop's hot reads (a run with its mission and feature, a task with its feature, ...)
are the same statement for every feature; only the ids change. Building and compiling a
queryset costs about ten times as much interpreter time as running its SQL (docs/BENCHMARKS.md,
"Loop throughput"), and Django keeps no compiled statement. A `Prepared` builds its queryset
once per database alias with marker values in place of its parameters, keeps Django's own
compiled SQL, row converters and model populators, and from then on only substitutes the
parameters, runs the SQL through the connection's cursor (its execute wrappers and debug
log included) and turns the rows into what the queryset would have returned: model
instances (with `select_related` objects), `values_list` tuples or flat values.

Compiling is checked, not trusted: every marker must come out of the compiler exactly once
and unchanged, and the queryset's kind of result must be one this module rebuilds; anything
else fails at the first use, loudly (`PreparedError`), never with a different query.
Parameters are integers, strings and aware datetimes (ids, states, revisions, leases),
bound as the backend binds them. `PreparedUpdate` does the same for `.update()`, and
`compare_and_set` for the state machines' compare-and-swap (docs/ARCHITECTURE.md). No
library does this for current Django (django-prepared-queries predates Django 5 and is
unmaintained), hence this module.

With `FUSION_FAST_PATHS` off (`fusion_site.runtime.fast_paths`) each of them evaluates the
plain queryset or `.update()` its builder describes instead: the same results, through the
ORM.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar, cast

from django.db import connections, router, transaction
from django.db.models import Field, Model, QuerySet
from django.db.models.query import (
    FlatValuesListIterable,
    ModelIterable,
    ValuesListIterable,
    get_related_populators,
)
from django.db.models.sql import UpdateQuery
from django.db.transaction import TransactionManagementError

from fusion_site.runtime import fast_paths

T = TypeVar("T")

# Markers: values no constant of a prepared queryset takes (a clash is found at the first
# use: the marker comes out twice), and within every integer field's range, a positive
# small integer's included: an out-of-range integer lookup compiles to "matches nothing",
# not to a parameter.
_INT_MARKER = 30_011
_DATETIME_MARKER = datetime(2001, 2, 3, 4, 5, 6, 7_000, tzinfo=UTC)
_STR_MARKER = "\x1fprepared-{}\x1f"


class PreparedError(RuntimeError):
    """A queryset this module cannot prepare faithfully (a programming error)."""


class _Compiled:
    """One alias's statement: SQL, where each parameter goes, and how rows become results."""

    __slots__ = ("sql", "params", "slots", "kind", "converters", "shape", "for_update", "model")

    def __init__(self, queryset: QuerySet, markers: dict[str, Any], db: str):
        connection = connections[db]
        compiler = queryset.query.get_compiler(using=db)
        sql, params = compiler.as_sql()
        self.sql, self.params = sql, list(params)
        self.slots = _slots(self.params, markers, db)
        self.kind = queryset._iterable_class
        if self.kind not in (ModelIterable, ValuesListIterable, FlatValuesListIterable):
            raise PreparedError(f"cannot prepare a {self.kind.__name__} queryset")
        # What the ORM does after the SQL, which this module does not repeat.
        if getattr(queryset, "_prefetch_related_lookups", ()) or getattr(queryset, "_known_related_objects", {}):
            raise PreparedError("cannot prepare a queryset with prefetch_related or from a related manager's objects")
        if compiler.has_composite_fields([s[0] for s in compiler.select[: compiler.col_count]]):
            raise PreparedError("cannot prepare a queryset with composite fields")
        if compiler.has_extra_select:  # columns Django trims off each row (distinct + order_by)
            raise PreparedError("cannot prepare a queryset whose rows carry extra columns")
        fields = [s[0] for s in compiler.select[: compiler.col_count]]
        # A backend's converter is a method of the compiling thread's connection: kept as
        # its function, called with the running thread's (no connection kept alive here).
        ops = connection.ops
        self.converters = [
            (pos, [(c.__func__, True) if getattr(c, "__self__", None) is ops else (c, False) for c in convs], expr)
            for pos, (convs, expr) in compiler.get_converters(fields).items()
        ]
        self.for_update = queryset.query.select_for_update and connection.features.has_select_for_update
        self.model = queryset.model
        self.shape: Any = None
        if self.kind is ModelIterable:
            klass_info, select = compiler.klass_info, compiler.select
            start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
            init_list = [f[0].target.attname for f in select[start:end]]
            self.shape = (
                klass_info["model"],
                start,
                end,
                init_list,
                # Django 5.2's signature (the stubs describe a later Django's).
                get_related_populators(klass_info, select, db),  # type: ignore[call-arg]
                dict(compiler.annotation_col_map or {}),
            )

    def rows(self, db: str, values: dict[str, Any]) -> Iterator[list[Any]]:
        connection = connections[db]
        if self.for_update and connection.get_autocommit():  # Django's own check, as it compiles
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        with connection.cursor() as cursor:
            cursor.execute(self.sql, _bind(self.params, self.slots, values))
            fetched = cursor.fetchall()
        converters, ops = self.converters, connection.ops
        for row in map(list, fetched):
            for pos, convs, expression in converters:
                value = row[pos]
                for converter, of_ops in convs:
                    value = (
                        converter(ops, value, expression, connection)
                        if of_ops
                        else converter(value, expression, connection)
                    )
                row[pos] = value
            yield row

    def results(self, db: str, values: dict[str, Any]) -> list[Any]:
        rows = self.rows(db, values)
        if self.kind is FlatValuesListIterable:
            return [row[0] for row in rows]
        if self.kind is ValuesListIterable:
            return [tuple(row) for row in rows]
        model_cls, start, end, init_list, populators, annotations = self.shape
        objects = []
        for row in rows:
            obj = model_cls.from_db(db, init_list, row[start:end])
            for populator in populators:
                populator.populate(row, obj)
            for attr, pos in annotations.items():
                setattr(obj, attr, row[pos])
            objects.append(obj)
        return objects


def _markers(types: dict[str, type]) -> dict[str, Any]:
    return {
        name: (
            _INT_MARKER + i
            if kind is int
            else _STR_MARKER.format(i)
            if kind is str
            else _DATETIME_MARKER + timedelta(microseconds=i)
        )
        for i, (name, kind) in enumerate(types.items())
    }


def _slots(params: list[Any], markers: dict[str, Any], db: str) -> list[tuple[str, int, Any]]:
    """Where each marker came out: (name, index, how to bind a value there, or None as it
    is). A backend may wrap a value for its driver (psycopg's `Int4` for an integer column
    on PostgreSQL), and adapts a datetime (SQLite: text in UTC): a new value is bound the
    same way."""
    adapt = connections[db].ops.adapt_datetimefield_value
    slots = []
    for name, marker in markers.items():
        target = adapt(marker) if isinstance(marker, datetime) else marker
        found = [i for i, p in enumerate(params) if isinstance(p, type(target)) and p == target]
        if len(found) != 1:
            raise PreparedError(f"parameter {name!r} came out of the compiler {len(found)} times, not once")
        kind = type(params[found[0]])
        bind: Callable[[Any], Any] | None = None if kind is type(marker) else kind
        if isinstance(marker, datetime):
            bind = functools.partial(_adapt_datetime, db)
        slots.append((name, found[0], bind))
    return slots


def _adapt_datetime(db: str, value: datetime) -> Any:
    # The current thread's connection: the same backend's operations as at compile time.
    return connections[db].ops.adapt_datetimefield_value(value)


_TYPES = (int, str, datetime)


def _parameter_types(build: Callable[..., Any], types: dict[str, type]) -> dict[str, type]:
    names = list(inspect.signature(build).parameters)
    if set(types) - set(names) or any(t not in _TYPES for t in types.values()):
        raise PreparedError(f"bad parameter types {types!r}")
    return {name: types.get(name, int) for name in names}


def _check_values(types: dict[str, type], values: dict[str, Any]) -> None:
    if set(values) != set(types):
        raise TypeError(f"expected parameters {list(types)}, got {sorted(values)}")
    for name, value in values.items():
        kind = types[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"parameter {name!r} must be {kind.__name__}, not {type(value).__name__}")
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            raise ValueError(f"parameter {name!r} is out of the database's integer range")
        if isinstance(value, datetime) and value.utcoffset() is None:
            raise TypeError(f"parameter {name!r} must be an aware datetime")


# The integer types a driver binds a value as (psycopg's), by name: their ranges.
_INT_BITS = {"Int2": 16, "Int4": 32, "Int8": 64}


def _bind(params: list[Any], slots: list[tuple[str, int, Any]], values: dict[str, Any]) -> list[Any]:
    params = list(params)
    for name, index, wrap in slots:
        value = values[name]
        bits = _INT_BITS.get(getattr(wrap, "__name__", ""))
        if bits and not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            # The ORM would compile "matches nothing"; a prepared statement refuses it.
            raise ValueError(f"parameter {name!r} is out of its column's integer range")
        params[index] = value if wrap is None else wrap(value)
    return params


S = TypeVar("S")


class _Once(Generic[S]):
    """A statement `build` describes, compiled on first use by `_compile` (with `build`'s
    markers), once for every thread. `types` gives a parameter's type when it is not `int`
    (`str`, or `datetime`: aware, as a `DateTimeField` takes it)."""

    def __init__(self, build: Callable[..., Any], **types: type):
        self._build = build
        self._types = _parameter_types(build, types)
        self._compiled: S | None = None
        self._lock = threading.Lock()

    def _compile(self, markers: dict[str, Any]) -> S:
        raise NotImplementedError

    def _statement(self, values: dict[str, Any]) -> S:
        _check_values(self._types, values)
        compiled = self._compiled
        if compiled is None:
            with self._lock:
                compiled = self._compiled
                if compiled is None:
                    compiled = self._compiled = self._compile(_markers(self._types))
        return compiled


class Prepared(_Once[tuple[str, _Compiled]], Generic[T]):
    """`Prepared(lambda pk: Run.objects.select_related("mission").filter(pk=pk))`, then
    `.get(pk=3)` / `.first(pk=3)` / `.all(pk=3)`: the queryset `build` returns, compiled on
    first use (for the alias that queryset uses: the project has one database). `build`
    must use its parameters only as plain values."""

    def _compile(self, markers: dict[str, Any]) -> tuple[str, _Compiled]:
        queryset = self._build(**markers)
        return queryset.db, _Compiled(queryset, markers, queryset.db)

    def _run(self, values: dict[str, Any]) -> tuple[Any, list[Any]]:
        """The model the statement reads, and its results."""
        if not fast_paths.on():
            _check_values(self._types, values)
            queryset = self._build(**values)
            return queryset.model, list(queryset)
        db, compiled = self._statement(values)
        return compiled.model, compiled.results(db, values)

    def all(self, **values: Any) -> list[T]:
        return self._run(values)[1]

    def first(self, **values: Any) -> T | None:
        results = self._run(values)[1]
        return results[0] if results else None

    def get(self, **values: Any) -> T:
        model, results = self._run(values)
        if len(results) == 1:
            return results[0]
        if not results:
            raise model.DoesNotExist(f"{model._meta.object_name} matching query does not exist.")
        raise model.MultipleObjectsReturned(f"get() returned more than one {model._meta.object_name}")


def _update_sql(queryset: QuerySet, updates: dict[str, Any], db: str) -> tuple[str, list[Any]]:
    """The statement and parameters Django compiles for `queryset.update(**updates)`."""
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))
    query.add_update_values(updates)
    if query.get_related_updates():
        raise PreparedError(f"cannot prepare an update of inherited fields of {queryset.model.__name__}")
    sql, params = query.get_compiler(db).as_sql()
    return sql, list(params)


def _execute_update(db: str, sql: str, params: list[Any]) -> int:
    """Rows changed; a failure dooms the surrounding transaction, as `QuerySet.update`'s does."""
    with transaction.mark_for_rollback_on_error(using=db), connections[db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


class _Update:
    """`UPDATE … SET <fields> WHERE pk = %s AND <field> = %s` for one shape of update:
    which fields are set, and which of them to NULL (NULL is not a parameter)."""

    __slots__ = ("sql", "slots", "fields", "size")

    def __init__(self, model: type[Model], db: str, field: str, updates: dict[str, Any]):
        markers = {"pk": _INT_MARKER, "old": _STR_MARKER.format(0)}
        queryset = model._default_manager.filter(pk=markers["pk"], **{field: markers["old"]})
        self.sql, params = _update_sql(queryset, updates, db)
        meta = model._meta
        self.fields = [cast(Field, meta.get_field(name)) for name, value in updates.items() if value is not None]
        self.size = len(self.fields)
        # The SET values come first, in the order given; the WHERE's parameters after them.
        tail = params[self.size :]
        if len(params) != self.size + len(markers):
            raise PreparedError(f"the update of {model.__name__} compiled to {len(params)} parameters")
        self.slots = [(name, self.size + index, wrap) for name, index, wrap in _slots(tail, markers, db)]

    def run(self, db: str, pk: int, old: str, updates: dict[str, Any]) -> int | None:
        """Rows changed; None when a value would not bind as it did when compiled."""
        connection = connections[db]
        params: list[Any] = []
        for model_field, value in zip(self.fields, (v for v in updates.values() if v is not None), strict=True):
            prepared = model_field.get_db_prep_save(value, connection=connection)
            if prepared is None or hasattr(prepared, "as_sql"):
                return None  # a different statement (NULL, an expression): the ORM's
            params.append(prepared)
        return _execute_update(db, self.sql, _bind([*params, None, None], self.slots, {"pk": pk, "old": old}))


_UPDATES: dict[tuple, _Update] = {}
_UPDATES_LOCK = threading.Lock()


def compare_and_set(model: type[Model], *, pk: int, field: str, old: str, updates: dict[str, Any]) -> int:
    """`model.objects.filter(pk=pk, <field>=old).update(**updates)`: the rows changed. The
    statement is compiled once per shape of `updates` (its names, and which are None);
    an expression, a model instance or an unusual value goes through the ORM's own update."""

    def through_the_orm() -> int:
        return model._default_manager.filter(pk=pk, **{field: old}).update(**updates)

    plain = type(pk) is int and isinstance(old, str)
    if (
        not plain
        or not fast_paths.on()
        or any(hasattr(v, "resolve_expression") or isinstance(v, Model) for v in updates.values())
    ):
        return through_the_orm()
    db = router.db_for_write(model)
    key = (model, db, field, tuple((name, value is None) for name, value in updates.items()))
    statement = _UPDATES.get(key)
    if statement is None:
        with _UPDATES_LOCK:
            statement = _UPDATES.get(key) or _UPDATES.setdefault(key, _Update(model, db, field, updates))
    changed = statement.run(db, pk, str.__str__(old), updates)  # a state's enum member as its text
    return through_the_orm() if changed is None else changed


class PreparedUpdate(_Once[tuple[str, str, list[Any], list[tuple[str, int, Any]]]]):
    """`PreparedUpdate(lambda pk, token: (Run.objects.filter(pk=pk), {"claim_token": token}), token=str)`,
    then `.run(pk=3, token="…")` → rows changed: the `UPDATE` Django compiles for
    `queryset.update(**values)`, compiled once. A value that changes from call to call, in
    the filter or in what is set, is a parameter of `build`; the rest are constants of the
    statement (a None, which is `NULL` and not a parameter, must be one)."""

    def _compile(self, markers: dict[str, Any]) -> tuple[str, str, list[Any], list[tuple[str, int, Any]]]:
        queryset, updates = self._build(**markers)
        db = router.db_for_write(queryset.model)
        sql, params = _update_sql(queryset, updates, db)
        return db, sql, params, _slots(params, markers, db)

    def run(self, **values: Any) -> int:
        if not fast_paths.on():
            _check_values(self._types, values)
            queryset, updates = self._build(**values)
            return queryset.update(**updates)
        db, sql, params, slots = self._statement(values)
        return _execute_update(db, sql, _bind(params, slots, values))
