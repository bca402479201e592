"""New rows of one model in one `INSERT … RETURNING`, its SQL written once per process.

`bulk_create` builds and compiles its statement anew on every call; for the few rows a
run's journal takes at a time (its checks' results, its decision), or an audit event on
SQLite (missions/audit.py), that cost more interpreter time than the insert itself
(docs/BENCHMARKS.md, "Loop throughput"). `insert` does what
`bulk_create` does for such rows: each field's `pre_save` (the `auto_now` stamps), its
value prepared for the database as the ORM prepares it (`get_db_prep_save`), the primary
keys read back onto the objects, which are then saved ones. Like `bulk_create` it sends no
signals. A model with parents or with columns the database fills, or a database that
cannot return the keys of a multi-row insert, goes through `bulk_create` itself, and so
does every insert with `FUSION_FAST_PATHS` off (`fusion_site.runtime.fast_paths`).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, TypeVar

from django.db import connections, router
from django.db.models import Field, Model

from fusion_site.runtime import fast_paths

M = TypeVar("M", bound=Model)

_STATEMENTS: dict[tuple[str, type[Model], int], tuple[str, list[Field]]] = {}
_LOCK = threading.Lock()


def insert(objs: list[M]) -> list[M]:
    """Insert the unsaved objects (all of one model) in their order; returns them saved."""
    if not objs:
        return objs
    model = type(objs[0])
    db = router.db_for_write(model)
    connection = connections[db]
    if not fast_paths.on() or not _plain(model) or not connection.features.can_return_rows_from_bulk_insert:
        model._default_manager.using(db).bulk_create(objs)  # it returns a copy of the list
        return objs
    sql, fields = _statement(connection, model, len(objs))
    params = [field.get_db_prep_save(field.pre_save(obj, True), connection) for obj in objs for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        keys = [row[0] for row in cursor.fetchall()]
    pk = model._meta.pk
    for obj, key in zip(objs, keys, strict=True):
        setattr(obj, pk.attname, pk.to_python(key))
        obj._state.adding, obj._state.db = False, db
    return objs


@functools.cache
def _plain(model: type[Model]) -> bool:
    """No parents, no field the database fills (a default of its own, a generated
    column, a returned value other than the key): what this module writes, all of it."""
    meta = model._meta
    return not meta.parents and not any(
        f.has_db_default() or getattr(f, "generated", False) or (f.db_returning and not f.primary_key)
        for f in meta.concrete_fields
    )


def _statement(connection: Any, model: type[Model], rows: int) -> tuple[str, list[Field]]:
    key = (connection.alias, model, rows)
    statement = _STATEMENTS.get(key)
    if statement is None:
        meta, quote = model._meta, connection.ops.quote_name
        # Every concrete field but a database-generated primary key, as `bulk_create` sends them.
        fields = [f for f in meta.concrete_fields if not (f.primary_key and f.db_returning)]
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        sql = (
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
            f"VALUES {', '.join([row] * rows)} RETURNING {quote(meta.pk.column)}"
        )
        with _LOCK:
            statement = _STATEMENTS.setdefault(key, (sql, fields))
    return statement
