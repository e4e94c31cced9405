"""Test settings: PostgreSQL (DATABASE_URL, default the local cluster) plus test-only handlers."""

import json
import os

# The suite defines its own environment: never the checkout's development .env (DJANGO_DEBUG=1).
os.environ["PALISADE_ENV_FILE"] = "none"
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/palisade")
os.environ.setdefault("SECRET_KEY", "palisade-tests-only-secret-key")  # DEBUG is off in tests

from config.settings import *  # noqa: E402,F403
from config.settings import INSTALLED_APPS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "tests.app"]
# django.tasks on Palisade (jobs.tasks); the test tasks live in tests/app/tasks.py.
TASKS = {
    "default": {"BACKEND": "jobs.tasks.PalisadeBackend", "QUEUES": ["default", "tasks"]},
    "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Cron schedules for acceptance tests that start qcluster subprocesses (JSON, see jobs.ops.cron).
JOBS_SCHEDULES = json.loads(os.environ.get("TEST_JOBS_SCHEDULES", "{}"))

# django-q2 recycles a worker process after this many drains (its default: 500); a test lowers it.
if os.environ.get("TEST_Q_RECYCLE"):
    Q_CLUSTER = {**Q_CLUSTER, "recycle": int(os.environ["TEST_Q_RECYCLE"])}  # noqa: F405
