"""Django settings for the Django-based peers (django-tasks-db, django-q2 on Redis or the ORM).

Standalone: nothing from Palisade. BENCH_PEER picks the peer, BENCH_DSN the database (a
database of its own per peer), BENCH_WORKERS the worker count. django-q2 gets Palisade's transport
knobs (poll 0.05 s, queue_limit = workers) and `save_limit = 0`, so every success is a
django_q_task row: the durable completion signal.
"""

import os

PEER = os.environ.get("BENCH_PEER", "dtdb")
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS: list[str] = []
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _db(url: str) -> dict:
    from urllib.parse import urlparse

    u = urlparse(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": u.path.lstrip("/"),
        "USER": u.username or "postgres",
        "PASSWORD": u.password or "",
        "HOST": u.hostname or "127.0.0.1",
        "PORT": str(u.port or 5432),
        "CONN_MAX_AGE": None,
    }


DATABASES = {"default": _db(os.environ["BENCH_DSN"])}

if PEER == "dtdb":
    INSTALLED_APPS += ["django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
else:
    INSTALLED_APPS += ["django_q"]
    Q_CLUSTER = {
        "name": "bench",
        "workers": WORKERS,
        "queue_limit": WORKERS,
        "poll": 0.05,
        "timeout": 1800,
        "retry": 1860,
        "ack_failures": True,
        "max_attempts": 1,
        "save_limit": 0,
        "catch_up": False,
        "log_level": "WARNING",
    }
    if PEER == "djq-redis":
        Q_CLUSTER["redis"] = os.environ.get("BENCH_DJQ_REDIS", "redis://127.0.0.1:6379/13")
    else:
        Q_CLUSTER["orm"] = "default"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "WARNING"},
}
