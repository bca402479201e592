"""The environment decides the configuration: checked in a fresh interpreter per case.

Settings are read once at import, so each case starts its own Python with a controlled
environment (the variables of the surrounding CI pass are removed first).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent

# Everything settings.py reads; removed so a CI pass with DATABASE_URL set still tests defaults.
SETTINGS_VARS = (
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "DEBUG",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "FUSION_DATA_DIR",
    "FUSION_EVENTS_PREFIX",
    "FUSION_VALIDATORS",
    "FUSION_VALIDATOR_TIMEOUT",
    "FUSION_CHECK_TIMEOUT",
    "FUSION_CHECK_OUTPUT_BYTES",
    "FUSION_CHECK_PARALLELISM",
    "FUSION_COMMAND_NICE",
    "FUSION_SWEEP_INTERVAL",
    "FUSION_WORKER_THREADS",
    "FUSION_WORKER_POLL_MS",
    "dramatiq_worker_timeout",
    "FUSION_TASK_LOG_BYTES",
    "FUSION_EXECUTOR_TIMEOUT",
    "FUSION_SNAPSHOT_DIR",
    "FUSION_ADMIN_USER",
    "FUSION_ADMIN_PASSWORD",
    "FUSION_MAX_BODY_BYTES",
    "LOG_LEVEL",
    "PYTEST_XDIST_WORKER",
)

PRINT_SETTINGS = """
import django, json, os
os.environ['DJANGO_SETTINGS_MODULE'] = 'fusion_site.settings'
django.setup()
from django.conf import settings

def eventstream_client():
    from django_eventstream import eventstream  # builds its client at import, as in production
    if eventstream.redis_client is None:
        return None
    kw = eventstream.redis_client.connection_pool.connection_kwargs
    return {'host': kw.get('host'), 'port': int(kw.get('port')), 'db': int(kw.get('db', 0))}

print(json.dumps({
    'db': settings.DATABASES['default'],
    'broker': settings.DRAMATIQ_BROKER,
    'layers': settings.CHANNEL_LAYERS,
    'eventstream_redis': getattr(settings, 'EVENTSTREAM_REDIS', None),
    'validators': settings.FUSION_VALIDATORS,
    'check_timeout': settings.FUSION_CHECK_TIMEOUT,
    'command_nice': settings.FUSION_COMMAND_NICE,
    'eventstream_client': eventstream_client(),
    'snapshot_dir': str(settings.FUSION_SNAPSHOT_DIR),
}, default=str))
"""

JOURNAL_MODE = """
import django, os
os.environ['DJANGO_SETTINGS_MODULE'] = 'fusion_site.settings'
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute('PRAGMA journal_mode')
    print(cursor.fetchone()[0])
print(connection.settings_dict['NAME'])
"""


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARS and k != "DJANGO_SETTINGS_MODULE"}
    env["FUSION_DATA_DIR"] = str(data_dir)
    env["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
    env.update(extra)
    return env


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )


def _settings(tmp_path: Path, **extra: str) -> dict:
    proc = _python(PRINT_SETTINGS, _env(tmp_path, **extra))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_default_is_sqlite_wal_immediate_with_file_test_db(tmp_path):
    s = _settings(tmp_path)
    db = s["db"]
    assert db["ENGINE"] == "fusion_site.sqlite"  # Django's, with writers queued (fusion_site/sqlite/base.py)
    assert Path(db["NAME"]).parent == tmp_path.resolve()
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]
    # Worker threads cannot share an in-memory test database.
    assert db["TEST"]["NAME"] and ":memory:" not in db["TEST"]["NAME"]
    assert Path(db["TEST"]["NAME"]).parent == tmp_path.resolve()
    assert s["broker"]["BROKER"] == "dramatiq.brokers.stub.StubBroker"
    # the in-memory layer, with its cross-loop wake-up fix (missions.streams)
    assert s["layers"]["default"]["BACKEND"] == "missions.streams.InMemoryChannelLayer"
    assert s["eventstream_redis"] is None
    assert s["eventstream_client"] is None
    assert s["command_nice"] == 0  # the commands run beside the one process, as asked


def test_database_url_selects_postgresql(tmp_path):
    s = _settings(tmp_path, DATABASE_URL="postgres://fusion:secret@127.0.0.1:5432/fusiondb")
    db = s["db"]
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert db["NAME"] == "fusiondb"
    assert db["HOST"] == "127.0.0.1"
    assert db["PORT"] == 5432
    assert db["USER"] == "fusion"
    # The SQLite-only options must not leak into the PostgreSQL configuration.
    assert "transaction_mode" not in db.get("OPTIONS", {})
    assert "init_command" not in db.get("OPTIONS", {})
    # The commands yield the cores to the loop's steps and the database (docs/BENCHMARKS.md, "Loop throughput").
    assert s["command_nice"] == 10
    assert _settings(tmp_path, DATABASE_URL="postgres://f@h/db", FUSION_COMMAND_NICE="0")["command_nice"] == 0


@pytest.mark.parametrize(
    "url, argv, pool",
    [
        ("postgres://fusion@127.0.0.1:5432/fusiondb", ["manage.py", "serve", "127.0.0.1:8000"], True),
        ("postgres://fusion@127.0.0.1:5432/fusiondb", ["dramatiq", "validation.actors"], False),
        ("sqlite:///{tmp}/other.sqlite3", ["manage.py", "serve", "127.0.0.1:8000"], None),
    ],
    ids=["postgresql-serve", "postgresql-worker", "sqlite-url-serve"],
)
def test_the_connection_pool_and_prepared_statements_are_postgresqls(tmp_path, url, argv, pool):
    """`serve` on PostgreSQL borrows from a pool, a worker keeps its own connections, both
    prepare statements on the server; a SQLite DATABASE_URL (as tests start `serve` with)
    gets none of these options, which SQLite's driver refuses."""
    code = f"import sys; sys.argv = {argv!r}\n" + PRINT_SETTINGS
    proc = _python(code, _env(tmp_path, DATABASE_URL=url.format(tmp=tmp_path)))
    assert proc.returncode == 0, proc.stderr
    options = json.loads(proc.stdout.strip().splitlines()[-1])["db"].get("OPTIONS", {})
    if pool is None:
        assert not {"pool", "server_side_binding", "prepare_threshold"} & set(options)
        return
    assert ("pool" in options) is pool
    assert options["server_side_binding"] is True and options["prepare_threshold"] == 1


def test_redis_url_selects_redis_broker_and_channel_layer(tmp_path):
    url = "redis://127.0.0.1:6379/5"
    s = _settings(tmp_path, REDIS_URL=url, FUSION_EVENTS_PREFIX="deploy-a")
    assert s["broker"]["BROKER"] == "fusion_site.runtime.broker.WakingRedisBroker"
    assert s["broker"]["OPTIONS"]["url"] == url
    layer = s["layers"]["default"]
    assert layer["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert layer["CONFIG"]["hosts"] == [url]
    assert layer["CONFIG"]["prefix"].startswith("deploy-a")
    assert s["eventstream_redis"], "REDIS_URL must switch django-eventstream to Redis pub/sub"
    # django-eventstream passes EVENTSTREAM_REDIS as keyword arguments to redis.Redis:
    # the client it builds must point at the server and database of REDIS_URL.
    assert s["eventstream_client"] == {"host": "127.0.0.1", "port": 6379, "db": 5}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "FUSION_VALIDATORS is not valid JSON"),
        ('["checks"]', "FUSION_VALIDATORS must be a JSON object"),
    ],
)
def test_bad_validators_json_fails_readably(tmp_path, raw, message):
    proc = _python(PRINT_SETTINGS, _env(tmp_path, FUSION_VALIDATORS=raw))
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr
    assert message in proc.stderr


def test_valid_validators_json_is_loaded(tmp_path):
    profile = {"local": {"kind": "agent", "model": "m", "api_key_env": "LOCAL_LLM_KEY"}}
    s = _settings(tmp_path, FUSION_VALIDATORS=json.dumps(profile))
    assert s["validators"] == profile


def test_bad_integer_fails_readably(tmp_path):
    proc = _python(PRINT_SETTINGS, _env(tmp_path, FUSION_CHECK_TIMEOUT="soon"))
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr
    assert "FUSION_CHECK_TIMEOUT must be an integer" in proc.stderr


@pytest.mark.parametrize("raw", ["20", "-1"])
def test_a_command_niceness_out_of_range_fails_readably(tmp_path, raw):
    proc = _python(PRINT_SETTINGS, _env(tmp_path, FUSION_COMMAND_NICE=raw))
    assert proc.returncode != 0
    assert f"FUSION_COMMAND_NICE must be between 0 and 19, got {raw}" in proc.stderr


def test_manage_check_reports_unknown_validator_kind(tmp_path):
    env = _env(tmp_path, FUSION_VALIDATORS=json.dumps({"x": {"kind": "nope"}}))
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "fusion.E001" in out
    assert "'x'" in out and "nope" in out


def test_manage_check_passes_with_valid_profiles(tmp_path):
    env = _env(tmp_path, FUSION_VALIDATORS=json.dumps({"ci": {"kind": "checks"}}))
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fusion.E001" not in proc.stdout + proc.stderr


def test_sqlite_database_really_is_in_wal_mode(tmp_path):
    proc = _python(JOURNAL_MODE, _env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    mode, name = proc.stdout.strip().splitlines()[-2:]
    assert mode.lower() == "wal"
    db_file = Path(name)
    assert db_file.parent == tmp_path.resolve() and db_file.exists()
    # WAL is a property of the file, so a plain connection that sets nothing sees it too.
    con = sqlite3.connect(db_file)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    finally:
        con.close()


# Run by `manage.py shell -c` (as `manage.py rundramatiq` starts, settings loaded), then as
# `rundramatiq` does: exec the dramatiq CLI, which reads its worker timeout at import.
WORKER_POLL = """
import subprocess, sys
child = 'import dramatiq.worker as w; print(w.WORKER_TIMEOUT)'
print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True, check=True).stdout.strip())
"""


@pytest.mark.parametrize(
    "extra, expected",
    [({}, "100"), ({"FUSION_WORKER_POLL_MS": "40"}, "40"), ({"dramatiq_worker_timeout": "700"}, "700")],
)
def test_the_dramatiq_processes_rundramatiq_starts_poll_an_idle_queue_within_the_setting(tmp_path, extra, expected):
    """Dramatiq's default (1 s) was the most an idle system waited per hop of the loop."""
    proc = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", WORKER_POLL],
        cwd=BASE_DIR,
        env=_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == expected


def test_snapshots_never_lie_inside_the_services_own_checkout(tmp_path):
    """A check walking up from its snapshot must not find the service's files: with the
    data folder inside the checkout (the default `var/`), snapshots go to the user's cache."""
    outside = _settings(tmp_path / "data")
    assert Path(outside["snapshot_dir"]) == (tmp_path / "data" / "snapshots").resolve()
    inside = BASE_DIR / "var" / f"settings-test-{os.getpid()}"
    try:
        s = _settings(inside, XDG_CACHE_HOME=str(tmp_path / "cache"))
    finally:
        shutil.rmtree(inside, ignore_errors=True)
    snapshots = Path(s["snapshot_dir"])
    assert not snapshots.is_relative_to(BASE_DIR.resolve())
    assert snapshots.parent == (tmp_path / "cache" / "fusion-missions").resolve()
