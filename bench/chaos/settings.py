"""Settings of the clusters the suite runs: Palisade's own, plus the workload app, against the
private PostgreSQL (DATABASE_URL set by bench/chaos/run.py)."""

import os

os.environ["PALISADE_ENV_FILE"] = "none"
os.environ.setdefault("SECRET_KEY", "palisade-chaos-only-secret-key")

from config.settings import *  # noqa: E402,F403
from config.settings import INSTALLED_APPS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "bench.chaos.workload"]

# Mail goes to the suite's own SMTP receiver (tests/smtp_receiver.py), which deduplicates nothing.
if os.environ.get("CHAOS_SMTP_PORT"):
    MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {
                "host": "127.0.0.1",
                "port": int(os.environ["CHAOS_SMTP_PORT"]),
                "timeout": 10,
            },
        }
    }
