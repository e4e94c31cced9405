"""The handler every chaos job runs: a checkpoint, a staged output, a keyed effect at a real
deduplicating HTTP receiver (prompt, slow, or one that hangs past the call's timeout after doing
the work: the attempt fails and the next one's call is deduplicated), an outbox intent to a
prompt, slow or hanging non-deduplicating receiver, a token-checked write to shared rows, then
sometimes a long run or a failure, each outside call bracketed by history lines (before/after)
for the checker.

The plan is in the payload (decided by the seeded generator in bench/chaos/run.py), so every
attempt of a job does the same things and the checker knows what each job meant to do.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

from bench.chaos import history
from bench.chaos.workload.models import ChaosRow
from jobs import handler
from jobs.context import JobContext
from jobs.core.exceptions import LeaseLost
from jobs.effects import send_mail

# A call to the effect receiver waits this long; its hanging endpoint hangs far longer.
EFFECT_TIMEOUT = 2.0
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

    if plan.get("seconds"):  # long work: token writes and checkpoints in turn (a zombie woken
        deadline = time.monotonic() + float(plan["seconds"])  # here writes before it knows)
        step = 0
        while time.monotonic() < deadline:
            step += 1
            if step % 2:
                token_write()
            else:
                ctx.checkpoint({"step": "long", "attempt": attempt})
            time.sleep(0.1)
    token_write()
    if plan.get("linger"):  # work after the last fenced write: a zombie stopped here has
        ctx.checkpoint({"step": "finishing", "attempt": attempt})  # only its commit left
        time.sleep(float(plan["linger"]))
    if plan.get("fail_attempts", 0) >= attempt:
        log("fail", "before")
        raise RuntimeError(f"planned failure of attempt {attempt}")
    log("commit", "before")
    return {"job": job, "attempt": attempt}
