"""Demo job kinds, so a fresh `bin/run` has something to show, and the drill's slow job."""

import random
import time
from typing import Any

from jobs import handler
from jobs.context import JobContext

DRILL_KIND = "demo.drill"
DRILL_LEASE_SECONDS = 2.0


@handler("demo.sleep", lease_seconds=15)
def sleep(ctx: JobContext) -> dict[str, Any]:
    """Works for payload['seconds'], checkpointing progress every tenth of the way."""
    seconds = float(ctx.payload.get("seconds", 1.0))
    steps = 10
    for step in range(steps):
        time.sleep(seconds / steps)
        ctx.checkpoint({"done": step + 1, "of": steps})
    return {"slept": seconds, "attempt": ctx.attempt}


@handler("demo.flaky", max_attempts=4)
def flaky(ctx: JobContext) -> dict[str, Any]:
    """Fails with probability payload['fail_rate'] (default one half)."""
    if random.random() < float(ctx.payload.get("fail_rate", 0.5)):
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"ok": True, "attempt": ctx.attempt}


@handler("demo.noop")
def noop(ctx: JobContext) -> None:
    return None


@handler(DRILL_KIND, lease_seconds=DRILL_LEASE_SECONDS, max_attempts=5)
def drill(ctx: JobContext) -> dict[str, Any]:
    """The drill's slow job: one plain sleep (no checkpoints), so a SIGSTOP lands inside it and
    the resumed process goes straight to its commit -- the stale write the fence rejects."""
    time.sleep(float(ctx.payload.get("seconds", 3.0)))
    return {"attempt": ctx.attempt, "worker": ctx.worker}


@handler("demo.render", lease_seconds=15)
def render(ctx: JobContext) -> dict[str, Any]:
    """Renders a small text file as a staged output and mails a notice under an idempotency key.

    The file lands under jobs/<id>/attempt-<n>/ and becomes the job's result_ref only through
    the commit; the mail is sent at most once per job, whichever attempt gets there.
    """
    from jobs.effects import send_mail

    pages = int(ctx.payload.get("pages", 3))
    text = "\n".join(f"page {p + 1} of {pages}" for p in range(pages))
    time.sleep(float(ctx.payload.get("seconds", 0.5)))
    ref = ctx.stage("render.txt", text)
    mail = send_mail(
        ctx, "notice", f"Render {ctx.job_id} is ready", f"Your file: {ref}", ["ops@example.com"]
    )
    return {"ref": ref, "pages": pages, "message_id": mail["message_id"]}


@handler("demo.report")
def report(ctx: JobContext) -> dict[str, Any]:
    """Writes a report row through the token-checked helper and posts an intent to a webhook.

    A zombie of this job can neither create nor overwrite the row (the job's attempt has moved
    on) nor post (its intent only exists if its commit is accepted).
    """
    from django.conf import settings

    from demo.models import Report

    name = str(ctx.payload.get("name", f"report-{ctx.job_id}"))[:100]
    rows = int(ctx.payload.get("rows", 10))
    body = f"{rows} rows by attempt {ctx.attempt}"
    if not ctx.fenced_write(Report.objects.filter(name=name), body=body, rows=rows):
        ctx.fenced_create(Report, name=name, body=body, rows=rows)  # the INSERT is checked too
    url = settings.DEMO_WEBHOOK_URL
    check = url.rstrip("/") + "/check/"
    ctx.intent("publish", "webhook", {"url": url, "check_url": check, "json": {"report": name}})
    return {"report": name, "rows": rows}


@handler("demo.staged_effect")
def staged_effect(ctx: JobContext) -> dict[str, Any]:
    """The benchmark's job (bench/run.py `effects`): one small staged output, one effect."""
    ref = ctx.stage("out.txt", b"ok")
    effect = ctx.effect("record", lambda key: {"key": key})
    return {"ref": ref, "effect": effect}


@handler("demo.work")
def work(ctx: JobContext) -> None:
    """Stands in for real work: one plain sleep of payload['ms'] milliseconds (bench/mixed.py)."""
    time.sleep(max(0.0, min(float(ctx.payload.get("ms", 1.0)), 60_000.0)) / 1000.0)
