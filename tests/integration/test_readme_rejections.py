"""README: "The zombie's write changes zero rows: it discards its work, and the rejection is
stored (`jobs.RejectedWrite`), logged on one line with both attempt numbers". Every kind of
write a zombie can present, each logged once, on one line naming the job, the worker and both
attempts (tests/integration/test_transitions.py checked the commit's line alone)."""

import json
from collections.abc import Callable

import pytest
from django.db import connection

import jobs
from demo.models import Report
from jobs.context import close_side_connection
from jobs.models import RejectedWrite
from jobs.ops.logs import JsonFormatter
from tests.integration.attempts import Running, claim, expire_and_reap

pytestmark = pytest.mark.django_db(transaction=True)

ZOMBIE, WINNER = "host-a:1", "host-b:2"


def _report(name: str) -> Report:
    return Report.objects.create(name=name, body="before")


# The worker's own final writes (completer) take the rejection in their stride; a handler's
# calls through `ctx` raise LeaseLost.
FINAL: dict[str, Callable[[Running], object]] = {
    "commit": lambda z: z.commit({"late": True}),
    "fail": lambda z: z.fail("late"),
}
HANDLERS: dict[str, Callable[[Running], object]] = {
    "heartbeat": lambda z: z.ctx.heartbeat(),
    "checkpoint": lambda z: z.ctx.checkpoint({"page": 9}),
    "token_write": lambda z: z.ctx.fenced_write(
        Report.objects.filter(pk=_report("w").pk), body="zombie"
    ),
    "token_write (insert)": lambda z: z.ctx.fenced_create(Report, name="z", body="zombie"),
    "token_write (delete)": lambda z: z.ctx.fenced_delete(Report.objects.filter(name="d")),
    "effect": lambda z: z.ctx.effect("charge", lambda key: {"charged": key}),
}


@pytest.mark.parametrize("write", [*FINAL, *HANDLERS])
def test_every_kind_of_zombie_write_is_stored_and_logged_on_one_line_with_both_attempts(
    write, caplog
):
    _report("d")
    job = jobs.enqueue("test.echo")
    zombie = claim(ZOMBIE)
    expire_and_reap(job.pk)
    assert claim(WINNER).claimed.fence.attempt == 2
    caplog.clear()
    try:
        if write in FINAL:
            FINAL[write](zombie)
        else:
            with pytest.raises(jobs.LeaseLost):
                HANDLERS[write](zombie)
    finally:
        close_side_connection()  # heartbeat and checkpoint run on a connection of their own
    stored = RejectedWrite.objects.get(job=job)
    assert (stored.attempt_presented, stored.attempt_current, stored.worker) == (1, 2, ZOMBIE)
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"job={job.pk} " in lines[0] and f"worker={ZOMBIE}" in lines[0], lines[0]
    assert "attempt_presented=1 " in lines[0] and "attempt_current=2 " in lines[0], lines[0]
    assert "\n" not in lines[0]
    assert connection.in_atomic_block is False


@pytest.mark.parametrize("write", ["token_write (insert)", "effect"])
def test_every_rejection_carries_the_structured_fields_in_json(write, caplog):
    job = jobs.enqueue("test.echo")
    zombie = claim(ZOMBIE)
    expire_and_reap(job.pk)
    claim(WINNER)
    caplog.clear()
    with pytest.raises(jobs.LeaseLost):
        HANDLERS[write](zombie)
    (record,) = [r for r in caplog.records if "rejected" in r.getMessage()]
    line = json.loads(JsonFormatter().format(record))
    assert line.get("event") == "stale_write_rejected"
    assert (line.get("job_id"), line.get("attempt_presented"), line.get("attempt_current")) == (
        job.pk,
        1,
        2,
    )
    assert (line.get("write"), line.get("state_current"), line.get("worker")) == (
        record.args["write"],  # type: ignore[call-overload,index]
        "running",
        ZOMBIE,
    )
    assert line.get("resource"), line
