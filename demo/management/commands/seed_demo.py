"""Create the demo superuser and a read-only operator (if missing); enqueue demo jobs once.

`bin/run` calls this on every start: the demo jobs are enqueued only while the database holds
none of them yet (each start used to add another dozen), and `--add N` enqueues N more on demand.
Two starts at once (two `bin/run` on two ports, one database) seed once: the look for users and
demo jobs and the first batch of jobs are one transaction under a lock (`seeding`), so the
second start finds what the first wrote. Before, both saw no demo job and each enqueued a dozen
(and both looked for the users, and the second one's insert of `admin` stopped it).
"""

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, transaction

import jobs
from jobs.models import Job

SEEDED_KINDS = ("demo.sleep", "demo.flaky", "demo.render", "demo.report", "demo.noop")
MAX_JOBS = 10_000  # per run: N is a demo's load, not a bulk import
BATCH = 100  # jobs per transaction: on SQLite a transaction holds the only write lock
SEED_LOCK = 0x5041_5345_4544  # "PASEED": the advisory lock of a first seed (PostgreSQL)


@contextmanager
def seeding() -> Iterator[None]:
    """One transaction that one seed at a time holds: PostgreSQL's transaction-scoped advisory
    lock (released by the COMMIT, or by the server if the process dies); on SQLite the
    transaction itself (IMMEDIATE: it takes the database's one write lock at BEGIN)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", [SEED_LOCK])
        yield


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
        count = options["add"]
        with seeding():
            self.create_users()
            if count is None:
                if Job.objects.filter(kind__in=SEEDED_KINDS).exists():
                    self.stdout.write("demo jobs already seeded (seed_demo --add N enqueues more)")
                    return
                count = options["jobs"]
            # The first batch in the lock's transaction: a start waiting for it sees these jobs.
            enqueue_demo_jobs(0, min(BATCH, count))
        for start in range(BATCH, count, BATCH):
            with transaction.atomic():
                enqueue_demo_jobs(start, min(start + BATCH, count))
        self.stdout.write(f"enqueued {count} demo jobs")

    def create_users(self) -> None:
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


def enqueue_demo_jobs(start: int, stop: int) -> None:
    for i in range(start, stop):
        enqueue_demo_job(i)


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
