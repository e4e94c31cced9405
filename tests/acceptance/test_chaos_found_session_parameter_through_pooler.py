"""Found by the fault-injection suite (bench/chaos, "messy" jobs, seed 1 of the small
configuration): behind PgBouncer in transaction pooling -- the configuration docs/operations.md
documents and the suite's cluster 1 runs -- a handler's `SET default_transaction_read_only = on`
outlives its job. The SET ran on a pooled *server* connection, which goes back to the pool
with it; closing the worker's client connection (jobs/worker/hygiene.py: "a session parameter
left changed only costs the connection") does not reach it. Every later transaction that
PgBouncer hands that server connection -- another job's claim, heartbeat, commit, the
scheduler's and the reaper's -- fails "cannot execute ... in a read-only transaction", until
PgBouncer closes it. In the suite, 4 such handlers among 300 jobs failed 24 attempts of other
jobs and ended 3 jobs `failed`; the completer took the read-only error for "the database
refused the handler's result" (jobs/worker/completer.py `_refused`).

With a pool of one server connection the reproduction is deterministic. Fixed: behind a
pooler, hygiene's statement watcher refuses such a statement before it is sent; the handler's
job fails with that error, no other job sees anything."""

from pathlib import Path

import pytest

from jobs import enqueue
from jobs.models import Attempt, Job
from tests.acceptance.cluster import wait_until
from tests.acceptance.test_pgbouncer import PGBOUNCER, pgbouncer  # noqa: F401  the fixture

pytestmark = pytest.mark.skipif(
    not Path(PGBOUNCER).exists(), reason="pgbouncer is not installed (bin/test installs it)"
)


@pytest.mark.parametrize("pgbouncer", [1], indirect=True)
def test_a_handlers_session_parameter_never_reaches_another_job_through_the_pooler(
    pgbouncer,  # noqa: F811
    start_qcluster,
):
    start_qcluster(DATABASE_URL=pgbouncer, JOBS_PREPARED_STATEMENTS="0", JOBS_WORKERS="1")
    changing = enqueue(
        "test.script", {"leave": "read_only", "return": {"done": 1}}, priority=5, max_attempts=1
    )
    after = [enqueue("test.echo", {"n": n}) for n in range(3)]
    ids = [j.pk for j in after]
    wait_until(
        lambda: (
            Job.objects.filter(pk__in=ids, state="succeeded").count() == len(ids)
            and Job.objects.filter(pk=changing.pk, state="failed").exists()
        ),
        timeout=20,
        what="the job that changed a session parameter to fail and the jobs after it to succeed",
        job_id=changing.pk,
    )
    # the SET was refused before it reached the pooled server connection: its own job failed,
    # saying why and what to use instead
    changing.refresh_from_db()
    assert "SessionStateThroughPooler" in changing.error
    assert "SET LOCAL" in changing.error
    # the others each on their first attempt: none failed of the parameter left behind
    assert set(Attempt.objects.filter(job_id__in=ids).values_list("number", flat=True)) == {1}
