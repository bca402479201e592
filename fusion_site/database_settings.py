"""The `default` database of `fusion_site.settings`: DATABASE_URL's, or the embedded
SQLite file in the data folder, and how each kind of process connects to it. Every
variable is documented in docs/CONFIGURATION.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url

from fusion_site.runtime.env import env_int

SQLITE_ENGINES = ("django.db.backends.sqlite3", "fusion_site.sqlite")


def default_database(*, url: str, data_dir: Path, worker_process: bool, web_server_process: bool) -> dict[str, Any]:
    """`DATABASES["default"]`: `url` (DATABASE_URL), or the SQLite file in `data_dir`, with
    its engine's options for this process (a Dramatiq worker, the web server, another)."""
    db: dict[str, Any]
    if url:
        # No persistent connections in web processes: under ASGI (Daphne) requests run in
        # short-lived threads; connections kept per thread piled up until PostgreSQL refused
        # more ("too many clients"). Django's advice for ASGI is the same. A Dramatiq worker
        # process keeps one per worker thread between messages (checked before each message
        # uses it), instead of connecting anew for every message: a run's check threads and
        # its lease thread never keep one (the check threads use no database).
        keep = env_int("FUSION_WORKER_DB_CONN_MAX_AGE", 600) if worker_process else 0
        db = dict(dj_database_url.parse(url, conn_max_age=keep, conn_health_checks=keep > 0))
    else:
        db = {"ENGINE": "fusion_site.sqlite", "NAME": str(data_dir / "fusion.sqlite3")}
    if db["ENGINE"] == "django.db.backends.postgresql":
        _postgresql(db.setdefault("OPTIONS", {}), web_server_process=web_server_process)
    if db["ENGINE"] in SQLITE_ENGINES:
        _sqlite(db, data_dir)
    return db


def _postgresql(options: dict[str, Any], *, web_server_process: bool) -> None:
    # `manage.py serve` borrows a connection from a pool for each request and gives it
    # back when the request ends (Django's own pool): not a new PostgreSQL backend (a
    # fork, authentication, cold catalog caches) for every API call, and never more than
    # FUSION_WEB_DB_POOL_SIZE of them, whatever the number of request threads.
    pool_size = env_int("FUSION_WEB_DB_POOL_SIZE", 20)
    if web_server_process and pool_size > 0:
        options["pool"] = {"min_size": 2, "max_size": pool_size, "timeout": 30}
    # Parameters bound by the server, and a statement run FUSION_DB_PREPARE_THRESHOLD
    # times on one connection is prepared there (parsed and planned once): the loop runs
    # the same few statements for every feature (fusion_site/runtime/prepared.py compiles
    # them once on this side). 1: from its second run, so that on a new connection (a
    # worker just started, a pool's new one) the loop's statements are parsed twice, not
    # six times; a statement run once stays unprepared. 0 keeps Django's default, client-side
    # binding: needed behind a pooler in transaction mode that does not track prepared
    # statements.
    prepare = env_int("FUSION_DB_PREPARE_THRESHOLD", 1)
    if prepare > 0:
        options.update(server_side_binding=True, prepare_threshold=prepare)


def _sqlite(db: dict[str, Any], data_dir: Path) -> None:
    # Writers of this process queue on a lock instead of SQLite's polling (fusion_site/sqlite/base.py).
    db["ENGINE"] = "fusion_site.sqlite"
    # WAL lets readers go on while one writer commits; IMMEDIATE takes the write lock
    # at BEGIN so two writers queue on the timeout instead of failing on upgrade.
    db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # A file-backed test database: worker threads cannot share an in-memory one.
    # Per process, so that concurrent test runs never share one file.
    db["TEST"] = {"NAME": str(data_dir / f"test_{os.getpid()}.sqlite3")}
