"""Settings, all read from the environment with safe embedded defaults.

Every variable is documented in docs/CONFIGURATION.md.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from fusion_site.database_settings import default_database
from fusion_site.runtime.env import env_bool, env_float, env_int, json_object_from_env

BASE_DIR = Path(__file__).resolve().parent.parent

DATA_DIR = Path(os.environ.get("FUSION_DATA_DIR", BASE_DIR / "var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", False)
_secret = os.environ.get("SECRET_KEY", "")
if not _secret:
    # Embedded default: a per-installation key kept in the data directory, never a
    # constant in the source tree.
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        import secrets  # only the first start of an installation needs it

        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    _secret = key_file.read_text().strip()
SECRET_KEY = _secret

ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "django_dramatiq",
    "django_eventstream",
    "channels",
    "missions",
    "validation",
    "forges",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "missions.streams.EventsTokenMiddleware",  # `Authorization: Token` for GET /events/… (programs)
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "missions.api.errors.JsonApiErrorsMiddleware",  # JSON errors for /api/ URLs no view answered
]

ROOT_URLCONF = "fusion_site.urls"
ASGI_APPLICATION = "fusion_site.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "validation.context_processors.sandbox_status",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "").strip()
# `manage.py rundramatiq` runs the `dramatiq` program: its worker threads live as long as
# the process.
DRAMATIQ_WORKER_PROCESS = Path(sys.argv[0]).name in ("dramatiq", "dramatiq-gevent") if sys.argv else False
# `manage.py serve` (the ASGI server of docs/PRODUCTION.md): many short request threads.
WEB_SERVER_PROCESS = len(sys.argv) > 1 and Path(sys.argv[0]).name == "manage.py" and sys.argv[1] == "serve"
# Each engine's options for this kind of process: fusion_site/database_settings.py.
DATABASES = {
    "default": default_database(
        url=DATABASE_URL,
        data_dir=DATA_DIR,
        worker_process=DRAMATIQ_WORKER_PROCESS,
        web_server_process=WEB_SERVER_PROCESS,
    )
}
_db = DATABASES["default"]
IS_SQLITE = _db["ENGINE"] == "fusion_site.sqlite"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
LOGIN_URL = "login"  # the dashboard's sign-in page (members who are not staff cannot use the admin's)
LOGIN_REDIRECT_URL = "/"

DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("FUSION_MAX_BODY_BYTES", 2 * 1024 * 1024)

# --- REST API -------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "missions.api.plugins.PreparedTokenAuthentication",  # DRF's, its read prepared
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": [
        "missions.api.plugins.FilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "missions.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "missions.api.openapi.AutoSchema",  # drf-spectacular's, see there
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Fusion Missions API",
    "DESCRIPTION": (
        "Missions, contract assertions, tasks and the implement -> validate -> fix loop. `/api/` lists every"
        " resource. Authenticate with a session or `Authorization: Token <key>`; without, every operation"
        " answers 401 `not_authenticated`. Errors are JSON `{code, detail, fields}`: `code` is stable, `fields`"
        " names the offending input. You see the missions you own or are a member of (staff: every mission) and"
        " what is in them; any other object answers 404 `not_found`."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "ENUM_NAME_OVERRIDES": {},
}

# --- brokers and live events ----------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "").strip()
EVENTS_PREFIX = os.environ.get("FUSION_EVENTS_PREFIX", "fusion")

_dramatiq_middleware = [
    "dramatiq.middleware.AgeLimit",
    "dramatiq.middleware.TimeLimit",
    "dramatiq.middleware.Callbacks",
    "dramatiq.middleware.Retries",
    # django_dramatiq's DbConnectionsMiddleware, keeping a worker thread's SQLite connection.
    "fusion_site.runtime.queue.WorkerDbConnections",
]
if REDIS_URL:
    DRAMATIQ_BROKER = {
        # Dramatiq's RedisBroker whose enqueue wakes the idle consumers of its queue.
        "BROKER": "fusion_site.runtime.broker.WakingRedisBroker",
        "OPTIONS": {"url": REDIS_URL, "namespace": f"{EVENTS_PREFIX}-dramatiq"},
        "MIDDLEWARE": _dramatiq_middleware,
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": f"{EVENTS_PREFIX}-asgi"},
        }
    }
    # django-eventstream hands this dict to redis.Redis(**...): connection kwargs, not a URL.
    # Its pub/sub channel name is fixed, so each deployment needs its own Redis server.
    from redis.connection import parse_url as _parse_redis_url  # only the production shape needs Redis

    EVENTSTREAM_REDIS = _parse_redis_url(REDIS_URL)
    if EVENTSTREAM_REDIS.pop("connection_class", None) is not None:
        EVENTSTREAM_REDIS["ssl"] = True
else:
    DRAMATIQ_BROKER = {
        "BROKER": "dramatiq.brokers.stub.StubBroker",
        "OPTIONS": {},
        "MIDDLEWARE": _dramatiq_middleware,
    }
    # Channels' in-memory layer, made safe to publish to from worker threads (see missions.streams).
    CHANNEL_LAYERS = {"default": {"BACKEND": "missions.streams.InMemoryChannelLayer"}}
DRAMATIQ_TASKS_DATABASE = "default"
DRAMATIQ_AUTODISCOVER_MODULES = ["actors"]
# django-eventstream's model storage with fewer statements per event (missions/streams/storage.py).
EVENTSTREAM_STORAGE_CLASS = "missions.streams.storage.EventLogStorage"
EVENTSTREAM_CHANNELMANAGER_CLASS = "missions.streams.MissionChannelManager"

# --- the loop -------------------------------------------------------------------
FUSION_VALIDATOR_TIMEOUT = env_int("FUSION_VALIDATOR_TIMEOUT", 600)
# A running run holds a lease that its worker renews (a heartbeat) while it works: a run
# whose worker died is reaped once the lease passes, however long its checks may run.
# Shorter than the broker's own redelivery of a dead worker's message (Redis: 60 s), so
# that a redelivered message finds the lease passed and resumes the run from its journal.
FUSION_RUN_LEASE_SECONDS = env_int("FUSION_RUN_LEASE_SECONDS", 30)
FUSION_RUN_HEARTBEAT_SECONDS = FUSION_RUN_LEASE_SECONDS / 4
FUSION_CHECK_TIMEOUT = env_int("FUSION_CHECK_TIMEOUT", 120)
FUSION_CHECK_OUTPUT_BYTES = env_int("FUSION_CHECK_OUTPUT_BYTES", 16 * 1024)
FUSION_CHECK_PARALLELISM = env_int("FUSION_CHECK_PARALLELISM", 4)
# The sandbox every command of a revision runs in (docs/SANDBOX.md): `auto` uses
# bubblewrap where it works and says loudly when it does not; `required` runs nothing
# unconfined; `off` is unsafe.
FUSION_SANDBOX = os.environ.get("FUSION_SANDBOX", "auto").strip().lower()
if FUSION_SANDBOX not in ("auto", "required", "off"):
    raise ImproperlyConfigured(f"FUSION_SANDBOX must be auto, required or off, got {FUSION_SANDBOX!r}")
FUSION_CHECK_MEMORY_MB = env_int("FUSION_CHECK_MEMORY_MB", 2048)  # data segment of each process
FUSION_CHECK_PROCESSES = env_int("FUSION_CHECK_PROCESSES", 256)
FUSION_CHECK_FILE_MB = env_int("FUSION_CHECK_FILE_MB", 1024)  # the largest file a check may write
FUSION_CHECK_DISK_MB = env_int("FUSION_CHECK_DISK_MB", 1024)  # what a check may write in all (its layer)
# The interpreter a check without an environment gets; empty: the service's base
# interpreter (never its virtualenv).
FUSION_CHECK_PYTHON = os.environ.get("FUSION_CHECK_PYTHON", "")
# How many recent snapshots of one repository a worker process keeps read-only, to make
# the next revision's from the nearest (only where checks cannot write a snapshot;
# fusion_site/repos/snapshot_reuse.py), and how many in all; 0: none, every snapshot from scratch.
FUSION_SNAPSHOTS_KEPT = env_int("FUSION_SNAPSHOTS_KEPT", 2)
FUSION_SNAPSHOTS_KEPT_TOTAL = env_int("FUSION_SNAPSHOTS_KEPT_TOTAL", 6)
# Whether the command executor (a coding agent) runs sandboxed too, with the network.
FUSION_EXECUTOR_SANDBOX = os.environ.get("FUSION_EXECUTOR_SANDBOX", "").strip().lower() in ("1", "true", "yes")
# How much lower than the service's own the CPU priority of the commands it runs is
# (checks, command validators, executor tasks, its own git): added to their niceness, at
# most 19. On PostgreSQL the loop's steps hold their mission's row lock while they wait
# for the cores, together with the database's own processes: the commands get what the
# service leaves (fusion_site/runtime/proc.py, docs/BENCHMARKS.md "Loop throughput"). Embedded, the one
# process's interpreter is the bound and the commands run beside it: 0, in their own
# session (niced, it measured worse).
FUSION_COMMAND_NICE = env_int("FUSION_COMMAND_NICE", 10 if _db["ENGINE"] == "django.db.backends.postgresql" else 0)
if not 0 <= FUSION_COMMAND_NICE <= 19:
    raise ImproperlyConfigured(f"FUSION_COMMAND_NICE must be between 0 and 19, got {FUSION_COMMAND_NICE}")
FUSION_SWEEP_INTERVAL = env_int("FUSION_SWEEP_INTERVAL", 120)
# The MCP server (docs/MCP.md): how often a waiting tool looks at the database, how long
# `task_complete` waits for the admission, how long an idle MCP session is kept.
FUSION_MCP_POLL_SECONDS = env_float("FUSION_MCP_POLL_SECONDS", 0.5)
FUSION_MCP_ADMISSION_WAIT = env_float("FUSION_MCP_ADMISSION_WAIT", 10.0)
FUSION_MCP_SESSION_IDLE_SECONDS = env_float("FUSION_MCP_SESSION_IDLE_SECONDS", 1800.0)
FUSION_RETRY_BACKOFF_MS = env_int("FUSION_RETRY_BACKOFF_MS", 2000)
FUSION_REDRIVE_GRACE = env_int("FUSION_REDRIVE_GRACE", 30)
# A broken invariant (an event off the catalogue, a step without the mission lock) raises
# where this is on, and is logged where it is off (missions/event_catalogue.py, missions/locks.py).
FUSION_STRICT = env_bool("FUSION_STRICT", DEBUG)
# The fast paths (docs/ARCHITECTURE.md, "Private internals": statements compiled once per
# process, raw inserts): off, every one of them takes the plain ORM route, same results.
FUSION_FAST_PATHS = env_bool("FUSION_FAST_PATHS", True)
FUSION_WORKER_THREADS = env_int("FUSION_WORKER_THREADS", 4)
# The longest a Dramatiq worker waits between two looks at an empty queue (its worker
# timeout; Dramatiq's default is 1 s). On Redis an enqueue wakes the idle consumers of its
# queue (fusion_site/runtime/broker.py), so this is the fallback: for a message no wake-up
# announces (a lost one, Dramatiq's requeue of a dead worker's messages, a client without
# the wake-ups) and for a delayed message (a retry's backoff), which its consumer moves to
# the queue only between two waits. 100 ms stays: it bounds that lateness and how long a
# worker takes to stop, for 10 to 20 Redis script calls a second per idle consumer (two per
# worker process: the queue and its delay queue).
# `rundramatiq` execs the dramatiq CLI, which reads the timeout from this environment
# variable only; the embedded workers take the setting directly.
FUSION_WORKER_POLL_MS = env_int("FUSION_WORKER_POLL_MS", 100)
os.environ.setdefault("dramatiq_worker_timeout", str(FUSION_WORKER_POLL_MS))
FUSION_TASK_LOG_BYTES = env_int("FUSION_TASK_LOG_BYTES", 64 * 1024)
FUSION_EXECUTOR_TIMEOUT = env_int("FUSION_EXECUTOR_TIMEOUT", 900)


def _snapshot_dir() -> Path:
    """`$FUSION_DATA_DIR/snapshots`, unless that lies inside the service's own checkout (the
    default `var/`): a check's tools walk up from their folder and would find the service's
    files there (pytest takes the checkout's pyproject.toml as the judged project's
    configuration). Then the user's cache folder, one per data folder (docs/TRUTH.md)."""
    if os.environ.get("FUSION_SNAPSHOT_DIR"):
        return Path(os.environ["FUSION_SNAPSHOT_DIR"]).resolve()
    inside = DATA_DIR / "snapshots"
    if not inside.resolve().is_relative_to(BASE_DIR.resolve()):
        return inside.resolve()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (
        cache / "fusion-missions" / f"snapshots-{hashlib.sha256(str(DATA_DIR).encode()).hexdigest()[:12]}"
    ).resolve()


FUSION_SNAPSHOT_DIR = _snapshot_dir()
# Built environments (docs/ENVIRONMENTS.md): beside the snapshots (outside the service's
# checkout), the least recently used removed past FUSION_ENV_CACHE_MB.
FUSION_ENV_CACHE = Path(
    os.environ.get("FUSION_ENV_CACHE")
    or FUSION_SNAPSHOT_DIR.with_name(FUSION_SNAPSHOT_DIR.name.replace("snapshots", "environments", 1))
).resolve()
FUSION_ENV_CACHE_MB = env_int("FUSION_ENV_CACHE_MB", 10 * 1024)
# The longest an environment's build (its preset's step and its setup) may take.
FUSION_ENV_BUILD_TIMEOUT = env_int("FUSION_ENV_BUILD_TIMEOUT", 900)
FUSION_EXECUTOR_ATTEMPTS = env_int("FUSION_EXECUTOR_ATTEMPTS", 2)
FUSION_EXECUTOR_LEASE_SECONDS = env_int("FUSION_EXECUTOR_LEASE_SECONDS", 60)
# Repositories (docs/REPOSITORIES.md): one bare mirror per source on each worker, the
# least recently used evicted past the byte budget.
FUSION_REPO_CACHE = Path(os.environ.get("FUSION_REPO_CACHE", DATA_DIR / "repos")).resolve()
FUSION_REPO_CACHE_BYTES = env_int("FUSION_REPO_CACHE_BYTES", 20 * 1024**3)
# Bounded time for a network call to a source (ls-remote, fetch, clone).
FUSION_GIT_REMOTE_TIMEOUT = env_int("FUSION_GIT_REMOTE_TIMEOUT", 120)
# Folders inside which a member who is not staff may name a local repository (`:`-separated).
FUSION_WORKSPACE_ROOTS = [p for p in os.environ.get("FUSION_WORKSPACE_ROOTS", "").split(os.pathsep) if p.strip()]
FUSION_ADMIN_USER = os.environ.get("FUSION_ADMIN_USER", "admin")
# Which workers' variables a mission's `credentials_env` may name, and the URL prefixes
# each may be sent to: {"GITHUB_TOKEN": ["https://github.com/acme/"]} (docs/REPOSITORIES.md).
FUSION_GIT_CREDENTIALS = json_object_from_env(
    "FUSION_GIT_CREDENTIALS", of="variable names to lists of URL prefixes", error=ImproperlyConfigured
)
if not all(
    isinstance(v, list) and v and all(isinstance(p, str) and "://" in p for p in v)
    for v in FUSION_GIT_CREDENTIALS.values()
):
    raise ImproperlyConfigured(
        "FUSION_GIT_CREDENTIALS maps each variable name to a non-empty list of URL prefixes (scheme://host/path/)"
    )
# Whether members who are not staff may set a mission's `credentials_env` (to a listed variable).
FUSION_MEMBERS_SET_CREDENTIALS = env_bool("FUSION_MEMBERS_SET_CREDENTIALS", False)


FUSION_VALIDATORS = json_object_from_env("FUSION_VALIDATORS", of="profiles", error=ImproperlyConfigured)
# JSON kept as text: validation.review.profiles reads it (with the same json_object) when a
# review starts, so a bad value refuses reviews instead of stopping the start-up.
FUSION_REVIEW_PROFILES = os.environ.get("FUSION_REVIEW_PROFILES", "").strip()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}, "daphne": {"level": "WARNING"}},
}


# Forges: webhooks in (docs/FORGES.md). The largest webhook body read (bytes; a larger one
# is refused with 413 before any of it is verified), and the deployment's shared secret,
# used by a mission whose forge has none of its own.
FUSION_FORGE_HOOK_MAX_BYTES = env_int("FUSION_FORGE_HOOK_MAX_BYTES", 1024 * 1024)
FUSION_FORGE_WEBHOOK_SECRET = os.environ.get("FUSION_FORGE_WEBHOOK_SECRET", "")

# Forges: statuses and comments out (docs/FORGES.md, "Statuses and comments out")
# The site's address as people reach it: the statuses' and comments' links to run pages.
FUSION_PUBLIC_URL = os.environ.get("FUSION_PUBLIC_URL", "http://127.0.0.1:8000").strip().rstrip("/")
# One request to a forge's API: the longest it may take (seconds), and the most of its
# answer read (bytes).
FUSION_FORGE_TIMEOUT = env_float("FUSION_FORGE_TIMEOUT", 10.0)
FUSION_FORGE_MAX_RESPONSE_BYTES = env_int("FUSION_FORGE_MAX_RESPONSE_BYTES", 1024 * 1024)
# A sender's claim on an outbox row while it talks to the forge; a row whose claim has
# expired (its worker died) is sent again by the sweep.
FUSION_FORGE_LEASE_SECONDS = env_int("FUSION_FORGE_LEASE_SECONDS", 60)
# Retries after 5xx, 429 and network errors: exponential from the base to the cap
# (seconds), with jitter; a `Retry-After` is honoured up to FUSION_FORGE_RETRY_AFTER_MAX.
FUSION_FORGE_RETRY_BASE = env_float("FUSION_FORGE_RETRY_BASE", 5.0)
FUSION_FORGE_RETRY_MAX = env_float("FUSION_FORGE_RETRY_MAX", 600.0)
FUSION_FORGE_RETRY_AFTER_MAX = env_float("FUSION_FORGE_RETRY_AFTER_MAX", 3600.0)
# The most outbox rows one sweep sends.
FUSION_FORGE_SWEEP_BATCH = env_int("FUSION_FORGE_SWEEP_BATCH", 200)
