"""Create the demo superuser and a read-only operator (if missing); enqueue demo jobs once.

`bin/run` calls this on every start: the demo jobs are enqueued only while the database holds
none of them yet (each start used to add another dozen), and `--add N` enqueues N more on demand.
"""

import argparse
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

import jobs
from jobs.models import Job

SEEDED_KINDS = ("demo.sleep", "demo.flaky", "demo.render", "demo.report", "demo.noop")
MAX_JOBS = 10_000  # per run: N is a demo's load, not a bulk import
BATCH = 100  # jobs per transaction: on SQLite a transaction holds the only write lock


def job_count(text: str) -> int:
    """An argparse type: a whole number of jobs from 1 to MAX_JOBS."""
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or not 1 <= int(text) <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {MAX_JOBS}")
    return int(text)


class Command(BaseCommand):
    help = "Create the demo users and, once, enqueue demo jobs (sleep, flaky, render, report...)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--jobs", type=job_count, default=12, help="how many demo jobs the first seed enqueues"
        )
        parser.add_argument(
            "--add", type=job_count, default=None, metavar="N", help="enqueue N more demo jobs now"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("DEMO_ADMIN_USER", "admin")
        password = os.environ.get("DEMO_ADMIN_PASSWORD", "palisade")
        user_model = get_user_model()
        if not user_model.objects.filter(username=username).exists():
            user_model.objects.create_superuser(username, f"{username}@example.com", password)
            self.stdout.write(f"created superuser {username!r} with password {password!r}")
        if not user_model.objects.filter(username="viewer").exists():
            viewer = user_model.objects.create_user("viewer", password=password)
            viewer.groups.add(Group.objects.get(name="operators"))  # read-only: sees, never acts
            self.stdout.write(f"created read-only operator 'viewer' with password {password!r}")
        count = options["add"]
        if count is None:
            if Job.objects.filter(kind__in=SEEDED_KINDS).exists():
                self.stdout.write("demo jobs already seeded (seed_demo --add N enqueues more)")
                return
            count = options["jobs"]
        for start in range(0, count, BATCH):
            with transaction.atomic():
                for i in range(start, min(start + BATCH, count)):
                    enqueue_demo_job(i)
        self.stdout.write(f"enqueued {count} demo jobs")


def enqueue_demo_job(i: int) -> None:
    """The i-th demo job: the five kinds in turn."""
    if i % 5 == 0:
        jobs.enqueue("demo.sleep", {"seconds": 1 + i % 5})
    elif i % 5 == 1:
        jobs.enqueue("demo.flaky", {"fail_rate": 0.5})
    elif i % 5 == 2:
        jobs.enqueue("demo.render", {"pages": 1 + i % 4})
    elif i % 5 == 3:
        jobs.enqueue("demo.report", {"name": f"report-{i}", "rows": i})
    else:
        jobs.enqueue("demo.noop", {"n": i})
