"""Two `bin/run` starting at once (on two ports, one database) seed the demo once: two real
`manage.py seed_demo` processes, made to overlap where it matters -- both past the "no demo jobs
yet" look before either has written a job."""

import os
import subprocess
import sys
import time

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from demo.management.commands.seed_demo import SEEDED_KINDS
from jobs.models import Job
from tests.acceptance.cluster import PROJECT_DIR, subprocess_database_env

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the overlap is held by a PostgreSQL table lock"
)


def _waiting_on_locks() -> int:
    """Sessions of this database waiting for a lock (read outside the holder's transaction:
    a transaction reads pg_stat_activity once and keeps that snapshot)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return int(cur.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_two_starts_at_once_seed_the_demo_jobs_once(second_connection):
    """Before: each saw no demo job yet and enqueued a dozen (24 jobs), and the users were
    looked for and created the same way (an IntegrityError stopped one `bin/run`)."""
    Group.objects.get_or_create(name="operators")  # made by a migration; a flush removed it
    env = {**os.environ, **subprocess_database_env(), "PYTHONUNBUFFERED": "1"}
    second_connection.autocommit = False
    with second_connection.cursor() as held:
        # Reads go on, writes to jobs_job wait: each seed gets as far as its first job.
        held.execute("LOCK TABLE jobs_job IN SHARE MODE")
        seeds = [
            subprocess.Popen(
                [sys.executable, "manage.py", "seed_demo"],
                cwd=PROJECT_DIR,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for _ in range(2)
        ]
        deadline = time.monotonic() + 60
        while _waiting_on_locks() < 2:  # both blocked: on the table, or on each other
            assert time.monotonic() < deadline, "the two seeds never both waited"
            assert all(p.poll() is None for p in seeds), [p.communicate() for p in seeds]
            time.sleep(0.05)
        second_connection.commit()
    outputs = [p.communicate(timeout=60)[0].decode() for p in seeds]
    assert [p.returncode for p in seeds] == [0, 0], outputs
    assert Job.objects.filter(kind__in=SEEDED_KINDS).count() == 12, outputs
    assert sum("enqueued 12 demo jobs" in out for out in outputs) == 1, outputs
