"""In-process attempts for the effects tests: claim, lose to the reaper, claim again, commit.

Every step is the real fenced statement on PostgreSQL; only the worker is this test process.
"""

import time
from dataclasses import dataclass
from typing import Any

from django.db import connection

import jobs
from jobs.context import Held, JobContext
from jobs.core import transitions
from jobs.core.transitions import Claimed
from jobs.worker import completer, reaper
from jobs.worker.heartbeat import Finished


@dataclass
class Running:
    claimed: Claimed
    held: Held
    ctx: JobContext

    def commit(self, result: Any = None) -> None:
        completer.commit([Finished(self.held, self.claimed, result, time.monotonic())])

    def fail(self, error: str = "boom") -> None:
        completer.fail(self.claimed, error, held=self.held)


def claim(worker: str) -> Running:
    (claimed,) = transitions.claim(worker, limit=1, lease_seconds=30)
    held = Held(claimed.fence, 30)
    return Running(claimed, held, JobContext(held, claimed.kind, claimed.payload))


def commit_intent(target: str, data: Any = None, worker: str = "host-a:1") -> str:
    """A job committed with one intent (step "publish") to `target`: the intent's key."""
    job = jobs.enqueue("test.echo")
    running = claim(worker)
    running.ctx.intent("publish", target, {} if data is None else data)
    running.commit(None)
    return f"{job.pk}:publish"


def commit_webhook_intents(url: str, n: int) -> list[str]:
    """`n` jobs, each committed with one webhook intent to `url`/hook: their intents' keys."""
    return [commit_intent("webhook", {"url": f"{url}/hook", "json": {"n": i}}) for i in range(n)]


def expire_and_reap(job_id: int) -> None:
    """The lease runs out (moved into the past on the database clock) and the reaper reclaims."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET lease_expires_at = clock_timestamp() - interval '1 second' "
            "WHERE id = %s",
            [job_id],
        )
    assert reaper.reap("reaper:1") == 1


# Valid jsonb that Python's json cannot decode (beyond its recursion limit): a payload that no
# enqueue would let in, written to the table as a raw row.
UNDECODABLE = "[" * 5000 + "]" * 5000


def insert_undecodable_job(priority: int = 5) -> int:
    """A test.echo job whose payload the worker cannot decode; returns its id."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs_job (kind, payload, priority) VALUES ('test.echo', %s::jsonb, %s) "
            "RETURNING id",
            [UNDECODABLE, priority],
        )
        return int(cur.fetchone()[0])
