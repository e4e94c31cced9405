"""Palisade settings, read from the environment.

DATABASE_URL selects the database (PostgreSQL in production and tests). Unset, Palisade runs on an
embedded SQLite file in WAL mode with IMMEDIATE transactions so a newcomer needs nothing installed.
REDIS_URL, when set, carries the channel layer. Job-platform knobs live in JOBS, each overridable by
an environment variable named JOBS_<KEY>.

Local development also reads the checkout's git-ignored `.env` (`bin/setup --dev` writes one with
DJANGO_DEBUG=1 and a generated SECRET_KEY); see `read_env_file`. Production has no `.env`.
"""

import math
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
import environ
from django.core.exceptions import ImproperlyConfigured

from config.startup import SettingError

BASE_DIR = Path(__file__).resolve().parent.parent


def read_env_file() -> Path | None:
    """Load a dotenv file into os.environ (django-environ) and return its path, or None.

    The file is the checkout's `.env`, read only if it exists; PALISADE_ENV_FILE names another
    one (which must exist), and PALISADE_ENV_FILE empty or `none` reads no file at all. A variable
    already in the environment always wins over the file (DJANGO_DEBUG=0 exported means
    production whatever the file says), and the values land in os.environ, so the processes a
    command starts see the same settings.
    """
    name = os.environ.get("PALISADE_ENV_FILE")
    if name is not None and name.strip().lower() in {"", "none"}:
        return None
    path = BASE_DIR / ".env" if name is None else Path(name).expanduser()
    try:
        with path.open(encoding="utf-8") as file:
            environ.Env.read_env(file, overwrite=False)
    except FileNotFoundError:
        if name is None:
            return None  # no .env: only the real environment counts (production)
        raise SettingError(
            f"PALISADE_ENV_FILE={name} names no file (empty or 'none' reads no file)"
        ) from None
    return path


ENV_FILE = read_env_file()  # before anything below reads os.environ


# Reading the environment: every flag, number and list below goes through one of these. A value
# they cannot use stops every entry point with SettingError, whose message config.startup prints:
# the variable, its value and the form expected (a typo must become neither a silent default nor
# a bare traceback). Unset or blank means the default, except for a list, where blank means none.


def bad_value(name: str, value: str, expected: str) -> SettingError:
    shown = repr(value) if len(value) <= 60 else repr(value[:60]) + "..."
    return SettingError(f"{name}={shown}: expected {expected}")


def env_bool(name: str, default: bool) -> bool:
    """1/true/yes/on or 0/false/no/off, in any case."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise bad_value(name, raw, f"1/true/yes/on or 0/false/no/off (unset: {int(default)})")


def env_int(name: str, default: int, low: int, high: int) -> int:
    """A whole number in [low, high]."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value: int | None = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise bad_value(name, raw, f"a whole number from {low} to {high} (unset: {default})")
    return value


def env_float(name: str, default: float, low: float, high: float) -> float:
    """A finite number in [low, high]."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value: float | None = float(raw)
    except ValueError:
        value = None
    if value is None or not (math.isfinite(value) and low <= value <= high):
        raise bad_value(name, raw, f"a number from {low:g} to {high:g} (unset: {default:g})")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, in any case (returned as spelled in `choices`)."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    for choice in choices:
        if raw.strip().lower() == choice.lower():
            return choice
    raise bad_value(name, raw, f"one of {', '.join(choices)} (unset: {default})")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def env_list(name: str, default: str) -> list[str]:
    """Comma-separated; each item stripped, empty items dropped."""
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY.strip():  # unset, empty or only whitespace: no key
    SECRET_KEY = "palisade-insecure-development-key-change-me" if DEBUG else ""  # noqa: S105
# DEBUG off and no key: SECRET_KEY stays empty and every entry point refuses to start
# (config/startup.py) -- never the public development key in production.
# `a.example.com, 127.0.0.1` is two hosts: a host with a space matches no request (400 for all).
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")

INSTALLED_APPS = [
    "daphne",  # first: makes `runserver` the ASGI server (HTTP + websockets)
    "jobs",  # before django_q: our `qcluster` adds the embedded scheduler to django-q2's
    "demo",  # demo job kinds, the seed and the zombie drill (job code, not screens)
    "dashboard",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "channels",
    "django_q",
    "axes",  # login throttling: see "Security" below
]

# Django's task framework (`@task`, django.tasks) on the fenced engine: docs/tasks.md.
TASKS = {"default": {"BACKEND": "jobs.tasks.PalisadeBackend", "QUEUES": ["default"]}}

MIDDLEWARE = [
    "config.middleware.refuse_nul_in_path",  # a 400 before any view looks the path up
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a lockout into the page below
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"

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
            ],
        },
    },
]

SQLITE_PATH = Path(os.environ.get("PALISADE_SQLITE_PATH", BASE_DIR / "var" / "palisade.sqlite3"))


PG_NETWORK_OPTIONS = {
    "connect_timeout": env_int("PG_CONNECT_TIMEOUT", 5, 2, 3600),  # seconds (libpq: min 2)
    "keepalives": 1,
    "keepalives_idle": 10,  # an idle connection (LISTEN) is probed after 10 s of silence,
    "keepalives_interval": 3,  # every 3 s,
    "keepalives_count": 3,  # and declared dead after 3 unanswered probes (~19 s)
    "tcp_user_timeout": 20_000,  # ms: data sent and not acknowledged for 20 s fails the socket
}


def database_from_env() -> dict[str, Any]:
    url = os.environ.get("DATABASE_URL")
    if url:
        db: dict[str, Any] = dict(
            dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
        )
        if db["ENGINE"] == "django.db.backends.postgresql":
            # libpq limits on the network, safe for every connection (web, workers, scheduler):
            # they bound connecting and detect a peer that stopped acknowledging (a half-open
            # connection), never a query that is merely slow. No statement_timeout here: handlers
            # and the web share these connections and may run long queries legitimately; the
            # platform's own round trips are bounded client-side instead (jobs.core.connectivity),
            # which also covers a partition the server never sees. Options in the URL win.
            options = db.setdefault("OPTIONS", {})
            for key, value in PG_NETWORK_OPTIONS.items():
                options.setdefault(key, value)
        return db
    SQLITE_PATH.parent.mkdir(parents=True, exist_ok=True)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": SQLITE_PATH,
        "OPTIONS": {
            # WAL lets the web server read while a worker writes; IMMEDIATE takes the write lock
            # at BEGIN so two writers queue on `timeout` instead of failing mid-transaction.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        },
    }


DATABASES = {"default": database_from_env()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def mailer_from_env(name: str, timeout_name: str, debug: bool) -> dict[str, Any]:
    """The default mailer (Django's MAILERS) from `name`, a URL as django-environ reads it:
    smtp://user:password@host:port, smtp+tls://..., smtp+ssl://..., consolemail:// or
    filemail:///path. Unset: SMTP on localhost:25 (the console under DJANGO_DEBUG: bin/run's demo
    mail is printed by the worker). SMTP waits at most `timeout_name` seconds for each exchange:
    without a timeout a mail server that stops answering held its handler until the execution
    timeout (30 minutes). A URL it cannot read stops every entry point, named."""
    timeout = env_float(timeout_name, 30.0, 0.1, 3600)
    raw = os.environ.get(name, "").strip()
    if not raw:
        if debug:
            return {"BACKEND": "django.core.mail.backends.console.EmailBackend"}
        raw = "smtp://localhost:25"
    try:
        parsed = environ.Env.email_url_config(raw)
    except (ValueError, ImproperlyConfigured):
        shown = raw if "@" not in raw else raw.split("://", 1)[0] + "://(hidden)"
        raise bad_value(
            name,
            shown,
            "smtp://user:password@host:port, smtp+tls://..., smtp+ssl://..., "
            "consolemail:// or filemail:///path",
        ) from None
    backend = parsed["EMAIL_BACKEND"]
    if backend.endswith(".filebased.EmailBackend"):
        return {"BACKEND": backend, "OPTIONS": {"file_path": parsed["EMAIL_FILE_PATH"]}}
    if not backend.endswith(".smtp.EmailBackend"):
        return {"BACKEND": backend}
    options = {
        "host": parsed["EMAIL_HOST"] or "localhost",
        "port": parsed["EMAIL_PORT"],
        "username": parsed["EMAIL_HOST_USER"] or "",
        "password": parsed["EMAIL_HOST_PASSWORD"] or "",
        "use_tls": bool(parsed.get("EMAIL_USE_TLS")),
        "use_ssl": bool(parsed.get("EMAIL_USE_SSL")),
        "timeout": timeout,
    }
    return {"BACKEND": backend, "OPTIONS": options}


# Mail: jobs.effects.send_mail in handlers.
MAILERS = {"default": mailer_from_env("EMAIL_URL", "EMAIL_TIMEOUT", DEBUG)}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "").strip() or "webmaster@localhost"
SERVER_EMAIL = DEFAULT_FROM_EMAIL

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "var" / "staticfiles"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise expects it; collectstatic fills it
STATICFILES_DIRS = [BASE_DIR / "static"]
MEDIA_ROOT = Path(os.environ.get("MEDIA_ROOT", BASE_DIR / "var" / "media"))
MEDIA_URL = "media/"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
if DEBUG:
    STORAGES["staticfiles"] = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}

# The right part of every mail's Message-ID (jobs.effects.send_mail); "" = one derived from
# SECRET_KEY, different per install. Set it if you rotate SECRET_KEY.
JOBS_MAIL_DOMAIN = os.environ.get("JOBS_MAIL_DOMAIN", "")
# Where the demo's intents are relayed (demo/views.py serves it under DEBUG).
DEMO_WEBHOOK_URL = os.environ.get("DEMO_WEBHOOK_URL", "http://127.0.0.1:8000/demo/hook/")

LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:overview"

# -- Security (docs/operations.md, "Running it in production") ---------------------------------
# Behind a TLS-terminating proxy: DJANGO_SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https
# (only if the proxy always sets that header), DJANGO_HTTPS=1 (secure cookies, redirect to HTTPS,
# HSTS), DJANGO_CSRF_TRUSTED_ORIGINS=https://ops.example.com. The dashboard's websocket accepts
# the same origins as a POST (dashboard.access.SameOriginValidator).
HTTPS = env_bool("DJANGO_HTTPS", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", HTTPS)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", HTTPS)
# HSTS starts at an hour: raise it (and opt into subdomains/preload) once HTTPS is known good.
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 3600 if HTTPS else 0, 0, 10 * 365 * 86400)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", False)
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")


def proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """`HTTP_X_FORWARDED_PROTO,https` -> the pair Django expects; empty -> None."""
    if not value.strip():
        return None
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 2 or not all(parts) or not parts[0].startswith("HTTP_"):
        raise bad_value(
            "DJANGO_SECURE_PROXY_SSL_HEADER",
            value,
            "'HTTP_<HEADER>,<value>', e.g. HTTP_X_FORWARDED_PROTO,https",
        )
    return parts[0], parts[1]


SECURE_PROXY_SSL_HEADER = proxy_ssl_header(os.environ.get("DJANGO_SECURE_PROXY_SSL_HEADER", ""))

# Login throttling (django-axes): after LOGIN_FAILURE_LIMIT wrong passwords for one username from
# one address, that pair is refused -- before any password is hashed -- for LOGIN_COOLOFF_MINUTES.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out login unhashed
    "django.contrib.auth.backends.ModelBackend",
]
# A limit of 0 or less would lock every login out before its first try (axes compares the
# failures so far, 0, with the limit); a cool-off of 0 would never lock anyone out.
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, 1, 1_000_000)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("LOGIN_COOLOFF_MINUTES", 15, 0.1, 525_600))


def lockout_parameters(name: str, default: str) -> list[list[str]]:
    """`username+ip_address, ip_address` -> [["username", "ip_address"], ["ip_address"]]; a name
    axes does not know would be a 500 on every login attempt, so it is refused here."""
    known = {"username", "ip_address", "user_agent"}
    groups = [[p.strip() for p in item.split("+")] for item in env_list(name, default)]
    if not groups or any(not set(group) <= known for group in groups):
        raise bad_value(
            name,
            os.environ.get(name, default),
            "comma-separated alternatives, each of username, ip_address and user_agent joined "
            "by +, e.g. username+ip_address",
        )
    return groups


# "username+ip_address" (the default: one account from one address), or e.g. "ip_address",
# comma-separated alternatives; see django-axes' AXES_LOCKOUT_PARAMETERS.
AXES_LOCKOUT_PARAMETERS = lockout_parameters("LOGIN_LOCKOUT_BY", "username+ip_address")
AXES_LOCKOUT_TEMPLATE = "dashboard/locked.html"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

JOBS_WORKERS = env_int("JOBS_WORKERS", 2, 1, 256)

# Job-platform settings; every key can be overridden by the environment variable JOBS_<KEY>.
# jobs.core.conf validates and types them; `manage.py check` reports bad combinations.
JOBS: dict[str, Any] = {
    "LEASE_SECONDS": 30.0,  # lease set by a claim, from the database clock
    "HEARTBEAT_SECONDS": 10.0,  # background heartbeat interval (must be <= lease / 3)
    "REAPER_SECONDS": 1.0,  # how often the embedded scheduler reclaims expired leases
    "POLL_SECONDS": 0.5,  # dispatcher poll when no LISTEN/NOTIFY wake-up arrives
    "DRAIN_SECONDS": 10.0,  # one django-q2 drain task stops claiming after this long
    "CLAIM_BATCH": 64,  # most jobs claimed per statement by one drain (quick jobs only)
    "MAX_ATTEMPTS": 3,
    "MAX_PAYLOAD_BYTES": 256 * 1024,
    "RETRY_BASE_SECONDS": 2.0,
    "RETRY_MAX_SECONDS": 3600.0,
    "QUEUES": None,  # None: this cluster serves every queue; or a comma-separated list
    "STAGING_STORAGE": "default",
    "ORPHAN_GRACE_SECONDS": 3600.0,
    "INTENT_RETRY_HOURS": 24.0,  # an undelivered intent is retried this long, then `failed`
    # Faults (docs/operations.md, "Shutdown and database outages").
    "SHUTDOWN_GRACE_SECONDS": 20.0,  # after SIGTERM, running handlers may finish within this
    "DB_TIMEOUT_SECONDS": 10.0,  # client-side deadline of one platform round trip
    "UNKNOWN_OUTCOME_SECONDS": 60.0,  # a worker stops resolving a final write after this long
    "OUTAGE_LOG_SECONDS": 30.0,  # reminder interval while the database stays unreachable
    "UNRESOLVED_DIR": "",  # spool of final writes given up on; "" = var/unresolved
}

Q_CLUSTER = {
    "name": "palisade",
    "workers": JOBS_WORKERS,
    # Transport only: the job tables decide. The ORM broker keeps Palisade on the database alone.
    "orm": "default",
    # django-q2's ORM broker, made to ride out a database outage (see jobs/worker/bridge.py).
    "broker_class": "jobs.worker.bridge.ResilientORMBroker",
    "poll": env_float("Q_POLL", 0.05, 0.001, 60),
    # `timeout`: the execution timeout of an attempt whose kind sets none (jobs.worker.watchdog;
    # django-q2's own timer is off for drains); `retry` must stay above it (checked: jobs.E002).
    "timeout": env_int("Q_TIMEOUT", 1800, 1, 31 * 86400),
    "retry": env_int("Q_RETRY", 1860, 1, 31 * 86400),
    "ack_failures": True,
    "max_attempts": 1,  # retries live in jobs.Job.run_at, never in django-q2
    "save_limit": -1,  # keep no success rows: our tables are the audit trail
    "queue_limit": JOBS_WORKERS,
    "catch_up": False,
    "label": "Transport (django-q2)",
    "log_level": env_choice("Q_LOG_LEVEL", "WARNING", LOG_LEVELS),  # django-q2 logs to "django-q"
}

JOBS_LOG_LEVEL = env_choice("JOBS_LOG_LEVEL", "INFO", LOG_LEVELS)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # One line a record: a message's control characters (a peer's error text) as \xNN.
        "line": {
            "()": "jobs.ops.logs.LineFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "jobs.ops.logs.JsonFormatter"},  # JOBS_LOG_FORMAT=json: one object a line
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json"
            if env_choice("JOBS_LOG_FORMAT", "text", ("text", "json")) == "json"
            else "line",
        }
    },
    "loggers": {
        "jobs": {"handlers": ["console"], "level": JOBS_LOG_LEVEL},
        "dashboard": {"handlers": ["console"], "level": JOBS_LOG_LEVEL},
        "demo": {"handlers": ["console"], "level": JOBS_LOG_LEVEL},
    },
}
