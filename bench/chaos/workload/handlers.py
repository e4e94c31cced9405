"""The handler every chaos job runs: a checkpoint, a staged output, a keyed effect at a real
deduplicating HTTP receiver (prompt, slow, or one that hangs past the call's timeout after doing
the work: the attempt fails and the next one's call is deduplicated), an outbox intent to a
prompt, slow or hanging non-deduplicating receiver, a token-checked write to shared rows,
token-checked INSERTs and DELETEs of the job's own items (in autocommit, or in one transaction
whose COMMIT the database decides again), then sometimes a long run or a failure, each outside
call bracketed by history lines (before/after) for the checker. A few jobs are "messy" on their
first attempt: they return leaving a transaction open, a session parameter changed, or a thread
running (jobs/worker/hygiene.py must fail that attempt alone, or cost only its connection).

The plan is in the payload (decided by the seeded generator in bench/chaos/run.py), so every
attempt of a job does the same things and the checker knows what each job meant to do.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from typing import Any

from django.db import connection, transaction

from bench.chaos import history
from bench.chaos.workload.models import ChaosItem, ChaosRow, MessMark
from jobs import handler
from jobs.context import JobContext
from jobs.core.exceptions import LeaseLost
from jobs.effects import fenced, send_mail

# A call to the effect receiver waits this long; its hanging endpoint hangs far longer.
EFFECT_TIMEOUT = 2.0
# How long a thread a messy handler leaks lives on (past its job; a worker's exit must not wait).
LEAKED_THREAD_SECONDS = 30.0
# The receivers by the plan's target: a prompt one, a slow one, one that hangs after doing the
# work (run.py starts each and names it in these variables; the relay's lanes are per origin).
EFFECT_RECEIVERS = {"prompt": "CHAOS_RECEIVER", "slow": "CHAOS_RECEIVER_SLOW",
                    "hang": "CHAOS_RECEIVER_HANG"}  # fmt: skip
INTENT_RECEIVERS = {"prompt": "CHAOS_FENCING_RECEIVER", "slow": "CHAOS_FENCING_SLOW",
                    "hang": "CHAOS_FENCING_HANG"}  # fmt: skip


def _post(url: str, key: str, body: dict[str, Any]) -> str:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=EFFECT_TIMEOUT) as answer:
        return str(json.loads(answer.read())["verdict"])


@handler("chaos.work", max_attempts=25)
def work(ctx: JobContext) -> dict[str, Any]:
    plan = ctx.payload
    job, attempt = ctx.job_id, ctx.attempt

    def log(action: str, phase: str, **fields: Any) -> None:
        history.record(job, attempt, action, phase, **fields)

    log("begin", "before", worker=ctx.worker)
    ctx.checkpoint({"step": "start", "attempt": attempt})
    if plan.get("stage"):
        ref = ctx.stage("out.txt", f"{job}:{attempt}")
        log("stage", "after", ref=ref)
    if plan.get("effect"):
        target = EFFECT_RECEIVERS[plan.get("effect_target", "prompt")]
        url = os.environ.get(target, os.environ["CHAOS_RECEIVER"]) + "/hook"

        def call(key: str) -> str:
            log("effect", "before", key=key)
            verdict = _post(url, key, {"job": job, "attempt": attempt, "step": "notify"})
            log("effect", "after", key=key, verdict=verdict)
            return verdict

        ctx.effect("notify", call)
    if plan.get("mail"):
        log("mail", "before")
        send_mail(ctx, "mail", f"job {job}", f"attempt {attempt}", ["ops@example.invalid"])
        log("mail", "after")
    if plan.get("intent"):  # performed by the relay, only if this attempt commits
        target = INTENT_RECEIVERS[plan.get("intent_target", "prompt")]
        hook = os.environ.get(target, os.environ["CHAOS_FENCING_RECEIVER"])
        ctx.intent("publish", "webhook", {
            "url": hook + "/hook", "check_url": hook + "/check", "json": {"job": job},
        })  # fmt: skip
    rows = ChaosRow.objects.filter(pk__in=plan.get("rows", []))

    def token_write() -> None:
        log("token_write", "before", rows=plan.get("rows", []))
        try:
            updated = ctx.fenced_write(rows, body=f"{job}:{attempt}")
        except LeaseLost:
            log("token_write", "after", outcome="refused")
            raise
        log("token_write", "after", outcome="accepted", updated=updated)

    def fenced_step(action: str, write: Any) -> Any:
        """One token-checked INSERT or DELETE, its refusal (LeaseLost) logged as seen."""
        log(action, "before")
        try:
            done = write()
        except LeaseLost:
            log(action, "after", outcome="refused")
            raise
        log(action, "after", outcome="accepted")
        return done

    def scratch() -> None:  # a row created and deleted again: a committed row's DELETE
        made = fenced_step("item_create", lambda: ctx.fenced_create(
            ChaosItem, job=job, attempt=attempt, name="scratch"))  # fmt: skip
        fenced_step("item_delete", lambda: ctx.fenced_delete(ChaosItem.objects.filter(pk=made.pk)))

    def item_writes() -> None:
        """What earlier attempts of this job left is deleted, this attempt's items created."""
        fenced_step("item_delete", lambda: ctx.fenced_delete(
            ChaosItem.objects.filter(job=job, attempt__lt=attempt)))  # fmt: skip
        mine = [{"job": job, "attempt": attempt, "name": f"item-{k}"} for k in range(items)]
        if len(mine) == 1:
            fenced_step("item_create", lambda: ctx.fenced_create(ChaosItem, **mine[0]))
        else:
            fenced_step("item_create", lambda: ctx.fenced_bulk_create(ChaosItem, mine))
        scratch()

    items = int(plan.get("items", 0))

    if plan.get("seconds"):  # long work: token writes and checkpoints in turn (a zombie woken
        deadline = time.monotonic() + float(plan["seconds"])  # here writes before it knows)
        step = 0
        while time.monotonic() < deadline:
            step += 1
            if step % 2:
                token_write()
                if items and step % 4 == 1:  # every other round: a zombie stopped in the
                    scratch()  # loop meets an INSERT and a DELETE as often as an UPDATE
            else:
                ctx.checkpoint({"step": "long", "attempt": attempt})
            time.sleep(0.1)
    if items and not plan.get("items_txn"):
        item_writes()
    token_write()
    if items and plan.get("items_txn"):  # in one transaction: a zombie stopped while it lingers
        log("items_txn", "before")  # has only its COMMIT left, which the database decides
        try:
            with transaction.atomic():
                item_writes()
                if plan.get("linger"):
                    ctx.checkpoint({"step": "finishing", "attempt": attempt})
                    time.sleep(float(plan["linger"]))
        except Exception as exc:
            if fenced.refused_at_commit(exc) is not None:
                log("items_txn", "after", outcome="refused")
            raise
        log("items_txn", "after", outcome="accepted")
    elif plan.get("linger"):  # work after the last fenced write: a zombie stopped here has
        ctx.checkpoint({"step": "finishing", "attempt": attempt})  # only its commit left
        time.sleep(float(plan["linger"]))
    if plan.get("fail_attempts", 0) >= attempt:
        log("fail", "before")
        raise RuntimeError(f"planned failure of attempt {attempt}")
    if plan.get("mess") and attempt == 1:
        log("mess", "before", mess=plan["mess"], worker=ctx.worker)
        leave_a_mess(plan["mess"], job, attempt)
    log("commit", "before")
    return {"job": job, "attempt": attempt}


def leave_a_mess(mess: str, job: int, attempt: int) -> None:
    """Return leaving the worker's connection or process unfit: a transaction open (by
    transaction.atomic() never left, or a raw BEGIN) with a row inserted in it, a session
    parameter changed (every later statement of that session read-only), or a thread running."""
    if mess == "atomic":
        transaction.atomic().__enter__()
        MessMark.objects.create(job=job, attempt=attempt)
    elif mess == "begin":
        with connection.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("INSERT INTO chaos_messmark (job, attempt) VALUES (%s, %s)", [job, attempt])
    elif mess == "read_only":
        # Behind PgBouncer in transaction pooling (cluster 1) the SET stays on the pooled server
        # connection, out of the worker's reach, and fails other jobs (the suite's finding,
        # tests/acceptance/test_chaos_found_session_parameter_through_pooler.py): there, unless
        # the run asks for that finding again, a parameter PgBouncer restores per client.
        pooled = os.environ.get("CHAOS_POOLED") == "1"
        with connection.cursor() as cur:
            cur.execute(
                "SET TIME ZONE 'Pacific/Chatham'"
                if pooled and os.environ.get("CHAOS_READ_ONLY_THROUGH_POOLER") != "1"
                else "SET default_transaction_read_only = on"
            )
    elif mess == "thread":
        threading.Thread(target=threading.Event().wait, args=(LEAKED_THREAD_SECONDS,),
                         name=f"chaos-leaked-{job}").start()  # fmt: skip
