"""Settings for the "django-q2 alone" peer of bench/run.py.

Palisade's settings (same database, same SECRET_KEY, same transport knobs: ORM broker, poll,
timeout/retry, ack_failures, queue_limit) with the Palisade apps removed, so `manage.py qcluster`
is django-q2's own command (no embedded scheduler), and with `save_limit = 0` so every success
is kept as a django_q_task row (no pruning): the count of success rows is the completion signal.
Also quieter logging (below).
"""

import os

from config.settings import *  # noqa: F403
from config.settings import Q_CLUSTER

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_q",
]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "bench.djq_urls"

Q_CLUSTER = {
    **Q_CLUSTER,
    "workers": int(os.environ.get("JOBS_WORKERS", "2")),
    "queue_limit": int(os.environ.get("JOBS_WORKERS", "2")),
    "save_limit": 0,
    # django-q2 logs two INFO lines per task by default (its logger is "django-q", which the
    # LOGGING "django_q" entry of config.settings does not reach); the peer runs without them.
    "log_level": os.environ.get("BENCH_DJQ_LOG_LEVEL", "WARNING"),
    "label": "django-q2 bench peer",
}
