"""Handlers the tests drive. Durations come from the payload so a test decides, per attempt, how
long a handler runs -- no test waits on a fixed sleep of its own."""

import asyncio
import ctypes
import gc
import os
import signal
import time
from typing import Any

from jobs import handler
from jobs.context import JobContext


def _duration(ctx: JobContext) -> float:
    by_attempt = ctx.payload.get("seconds_by_attempt", {})
    return float(by_attempt.get(str(ctx.attempt), ctx.payload.get("seconds", 0.0)))


@handler("test.echo")
def echo(ctx: JobContext) -> dict[str, Any]:
    return {"echo": ctx.payload, "attempt": ctx.attempt}


@handler("test.gc_state")
def gc_state(ctx: JobContext) -> dict[str, Any]:
    """What the garbage collector of the worker process running it walks, and what it does not."""
    return {"frozen": gc.get_freeze_count(), "walked": len(gc.get_objects())}


@handler("test.sleep")
def sleep(ctx: JobContext) -> dict[str, Any]:
    """Sleeps without heartbeating itself (the runner's background heartbeat still runs)."""
    time.sleep(_duration(ctx))
    return {"attempt": ctx.attempt, "worker": ctx.worker}


@handler("test.token_write")
def token_write(ctx: JobContext) -> dict[str, Any]:
    """Sleeps like test.sleep, then writes "job <id> attempt <n>" to the demo.Report named
    `payload["report"]` through ctx.fenced_write (a token-checked write)."""
    from demo.models import Report

    time.sleep(_duration(ctx))
    name = str(ctx.payload["report"])
    Report.objects.get_or_create(name=name)
    body = f"job {ctx.job_id} attempt {ctx.attempt}"
    ctx.fenced_write(Report.objects.filter(name=name), body=body)
    return {"attempt": ctx.attempt, "worker": ctx.worker}


@handler("test.token_write_in_transaction")
def token_write_in_transaction(ctx: JobContext) -> dict[str, Any]:
    """In one transaction of its own: writes "job <id> attempt <n>" to the demo.Report named
    `payload["report"]` through ctx.fenced_write (unless `payload["create_only"]`), creates the
    Report "<name> by attempt <n>" through ctx.fenced_create (unless `payload["write_only"]`),
    then sleeps like test.sleep before the transaction commits."""
    from django.db import transaction

    from demo.models import Report

    name = str(ctx.payload["report"])
    with transaction.atomic():
        body = f"job {ctx.job_id} attempt {ctx.attempt}"
        if not ctx.payload.get("create_only"):
            ctx.fenced_write(Report.objects.filter(name=name), body=body)
        if not ctx.payload.get("write_only"):
            ctx.fenced_create(Report, name=f"{name} by attempt {ctx.attempt}", body=body)
        time.sleep(_duration(ctx))
    return {"attempt": ctx.attempt, "worker": ctx.worker}


@handler("test.checkpointing")
def checkpointing(ctx: JobContext) -> dict[str, Any]:
    """Works in small steps, checkpointing each; stops only when told or when the lease is lost."""
    deadline = time.monotonic() + _duration(ctx)
    step = 0
    while time.monotonic() < deadline:
        step += 1
        ctx.checkpoint({"step": step})
        time.sleep(0.05)
    return {"attempt": ctx.attempt, "steps": step}


@handler("test.fail", max_attempts=2)
def fail(ctx: JobContext) -> None:
    raise RuntimeError(f"boom on attempt {ctx.attempt}")


@handler("test.long_lease", lease_seconds=600)
def long_lease(ctx: JobContext) -> None:
    return None


class _Scripted(Exception):
    pass


class _RaisingItems(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("hostile items()")


class _RecursingItems(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[no-untyped-def]
        return self.items()


class _HidingValues(dict):  # type: ignore[type-arg]
    """Its values() hides its content (json's encoder reads items())."""

    def values(self):  # type: ignore[no-untyped-def]
        return []


class _HostileDiag(Exception):
    @property
    def diag(self) -> Any:
        raise RuntimeError("hostile diag")


def _hostile_result(bad: str) -> Any:
    if bad == "items_raise":
        return _RaisingItems(a=1)
    if bad == "items_recurse":
        return _RecursingItems(a=1)
    if bad == "hidden_depth":
        nested: list[Any] = []
        for _ in range(500):
            nested = [nested]
        return _HidingValues(a=nested)
    if bad == "diag_raise":
        try:
            raise _HostileDiag("inner")
        except _HostileDiag as inner:
            raise ValueError("outer") from inner
    return None


def _base_exception(name: str) -> BaseException:
    from django_q.exceptions import TimeoutException

    return {
        "SystemExit": SystemExit(3),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "CancelledError": asyncio.CancelledError(),
        "TimeoutException": TimeoutException("task exceeded timeout"),
    }[name]


def _leave(what: str) -> None:
    """Leave the worker's connection as a careless handler would (jobs.worker.hygiene)."""
    from django.db import connection, transaction

    from jobs.models import Job

    if what == "atomic_other":  # on a second database alias: entered by hand, never left
        transaction.atomic(using="other").__enter__()
        Job.objects.using("other").filter(unique_key="leftover-marker").update(priority=7)
        return
    if what == "atomic":  # entered by hand, never left
        transaction.atomic().__enter__()
    elif what == "autocommit":
        transaction.set_autocommit(False)
    elif what in ("begin", "aborted"):
        connection.cursor().execute("BEGIN")
    elif what == "terminated":  # its connection ends under it (the server, the network)
        try:
            connection.cursor().execute("SELECT pg_terminate_backend(pg_backend_pid())")
        except Exception:  # noqa: BLE001  the lost connection is the point: caught, left
            pass
        return
    elif what in ("read_only", "read_only_reconnected"):
        if what == "read_only_reconnected":
            connection.close()  # the next statement opens a new connection
        connection.cursor().execute("SET default_transaction_read_only = on")
        return
    # A write of its own in the transaction left open: it must not outlive the attempt.
    Job.objects.filter(unique_key="leftover-marker").update(priority=7)
    if what == "aborted":
        try:
            connection.cursor().execute("SELECT 1/0")
        except Exception:  # noqa: BLE001  the failed statement is the point: caught, left
            pass


@handler("test.script")
def script(ctx: JobContext) -> Any:
    """Does what the payload says, so one batch can hold well-behaved and hostile jobs:
    `{"return": value}`, `{"raise": text}`, `{"base": "SystemExit"|...}`, `{"kill": true}`,
    `{"seconds": s}` (sleep first), `{"spin": s}` (then
    busy in Python code), `{"observe": job_id}` (return that job's state now),
    `{"leave": "atomic"|"atomic_other"|"autocommit"|"begin"|"aborted"|"read_only"|...}` (a
    transaction left open -- `atomic_other` on the alias "other" --, a session parameter
    changed, or "terminated": the connection lost, on the worker's connection: `_leave`),
    `{"leak_thread": true}`
    (a non-daemon thread left running forever), `{"multiprocessing": "process"|"pool"}` (a
    child started by multiprocessing), `{"fork_child": "exit"|"return"}` (a child
    forked by the handler that leaves by SystemExit or returns), `{"alarm": s}` (a SIGALRM
    deadline of its own, raising, left pending if the handler raises first),
    `{"bad": ...}` for values no payload can carry (a NUL or a
    lone surrogate in the result, a NUL in the error text) and hostile ones (a result whose
    items() raises or recurses, or hides its depth from values(); an error whose cause's
    `diag` raises)."""
    p = ctx.payload
    time.sleep(float(p.get("seconds", 0.0)))
    spin_until = time.monotonic() + float(p.get("spin", 0.0))
    while time.monotonic() < spin_until:  # busy in Python: the GIL switches between threads
        pass
    if p.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    bad = p.get("bad")
    if bad == "nul_result":
        return {"text": "before\x00after"}
    if bad == "surrogate_result":
        return {"text": "lone \ud800 surrogate"}
    if bad == "nul_error":
        raise _Scripted("error text with a \x00 NUL")
    if bad is not None:
        return _hostile_result(bad)
    if "leave" in p:
        _leave(p["leave"])
    if "alarm" in p:  # a deadline of its own, left pending when it raises first

        def deadline(signum: int, frame: Any) -> None:
            raise _Scripted(f"job {ctx.job_id}'s own alarm")

        signal.signal(signal.SIGALRM, deadline)
        signal.setitimer(signal.ITIMER_REAL, float(p["alarm"]))
    if "fork_child" in p:
        if os.fork() == 0:  # the child: leaves as the payload says
            if p["fork_child"] == "exit":
                raise SystemExit(0)  # sys.exit() where os._exit() was meant
            return {"child": os.getpid()}  # returns into the drain it was forked from
        time.sleep(float(p.get("after_fork", 0.0)))  # the parent goes on meanwhile
    if "multiprocessing" in p:  # a child process through multiprocessing, as a handler might
        import concurrent.futures
        import multiprocessing

        if p["multiprocessing"] == "pool":
            with concurrent.futures.ProcessPoolExecutor(1) as pool:
                return pool.submit(abs, -1).result()
        child = multiprocessing.Process(target=abs, args=(-1,))
        child.start()
        child.join()
        return child.exitcode
    if p.get("leak_thread"):  # a non-daemon thread that never ends
        import threading

        threading.Thread(target=threading.Event().wait, name="leaked-by-handler").start()
    if "raise" in p:
        raise _Scripted(p["raise"])
    if "base" in p:
        raise _base_exception(p["base"])
    if "observe" in p:  # what the database says of another job now
        from jobs.models import Job

        return Job.objects.values_list("state", flat=True).get(pk=p["observe"])
    return p.get("return", {"attempt": ctx.attempt})


def _post(url: str, key: str, body: Any) -> Any:
    import json
    import urllib.request

    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _by_attempt(ctx: JobContext, name: str) -> float:
    return float(ctx.payload.get(name, {}).get(str(ctx.attempt), 0.0))


@handler("test.effects")
def effects(ctx: JobContext) -> dict[str, Any]:
    """Stages, performs effects and records intents as the payload says, pausing (a plain
    sleep, per attempt) where a test wants to stop the worker:
    `{"stage": name, "after_stage": {attempt: s}, "kill_after_stage": attempt,
      "webhook": url, "in_effect": {attempt: s}, "intent": {url, check_url}}`."""
    p = ctx.payload
    out: dict[str, Any] = {"attempt": ctx.attempt}
    if "stage" in p:
        out["ref"] = ctx.stage(p["stage"], f"output of attempt {ctx.attempt}")
        if p.get("kill_after_stage") == ctx.attempt:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(_by_attempt(ctx, "after_stage"))
    if "webhook" in p:

        def notify(key: str) -> Any:
            answer = _post(p["webhook"], key, {"attempt": ctx.attempt})
            time.sleep(_by_attempt(ctx, "in_effect"))  # stalled after performing, unrecorded
            return answer

        out["effect"] = ctx.effect("notify", notify)
    if "intent" in p:
        data = {**p["intent"]["data"], "json": {"attempt": ctx.attempt}}
        ctx.intent("publish", p["intent"].get("target", "webhook"), data)
    return out


class _CrashAfterPerform:
    """The webhook target, except that a relay process started with
    PALISADE_TEST_CRASH_AFTER_PERFORM=1 dies (SIGKILL) right after performing, before marking."""

    def __init__(self) -> None:
        from jobs.effects.outbox import WebhookTarget

        self._inner = WebhookTarget(timeout=5)

    def perform(self, key: str, data: Any, token: int = 0) -> None:
        self._inner.perform(key, data, token)
        if os.environ.get("PALISADE_TEST_CRASH_AFTER_PERFORM") == "1":
            os.kill(os.getpid(), signal.SIGKILL)

    def reconcile(self, key: str, data: Any, token: int = 0) -> bool | None:
        return self._inner.reconcile(key, data, token)


def _register_targets() -> None:
    from jobs.effects.outbox import register_target

    register_target("test.crash-after-perform", _CrashAfterPerform())


_register_targets()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _stuck_in_c(seconds: float, *, holding_the_gil: bool = False) -> None:
    """Block `seconds` inside one C call that no signal interrupts: pthread_mutex_timedlock on a
    mutex this thread already holds (glibc retries its futex wait after a signal, never EINTR),
    so Python's signal handlers (SIGALRM, SIGTERM) run only once it returns. Through ctypes.CDLL
    the call releases the GIL (other threads of the process run); through PyDLL it keeps it."""
    libc = (ctypes.PyDLL if holding_the_gil else ctypes.CDLL)(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
    assert libc.pthread_mutex_lock(mutex) == 0
    until = time.time() + seconds  # pthread_mutex_timedlock takes a CLOCK_REALTIME deadline
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(_Timespec(int(until), int((until % 1) * 1e9))))


@handler("test.stuck_in_c", max_attempts=3)
def stuck_in_c(ctx: JobContext) -> dict[str, Any]:
    _stuck_in_c(_duration(ctx), holding_the_gil=bool(ctx.payload.get("holding_the_gil")))
    return {"attempt": ctx.attempt}


@handler("test.timeout_in_c", timeout=1.5, max_attempts=3)
def timeout_in_c(ctx: JobContext) -> dict[str, Any]:
    _stuck_in_c(_duration(ctx), holding_the_gil=bool(ctx.payload.get("holding_the_gil")))
    return {"attempt": ctx.attempt}


@handler("test.timeout_long", timeout=60, max_attempts=1)
def timeout_long(ctx: JobContext) -> dict[str, Any]:
    """A kind whose own execution timeout is far above a short Q_TIMEOUT and Q_RETRY: it sleeps
    (no beat of its own; the runner's background heartbeat keeps its lease)."""
    time.sleep(_duration(ctx))
    return {"attempt": ctx.attempt}


@handler("test.timeout_short", timeout=0.5, max_attempts=3)
def timeout_short(ctx: JobContext) -> dict[str, Any]:
    """A kind with a short execution timeout; the tests swap in what it does around it."""
    return {"attempt": ctx.attempt}


# What test.session changes (`{"change": [...]}`), each as a careless handler would leave it.
SESSION_CHANGES = {
    "statement_timeout": "SET statement_timeout = '1234s'",
    "search_path": "SET search_path TO pg_catalog",
    "set_config": "SELECT set_config('statement_timeout', '4321s', false)",
    "advisory_lock": "SELECT pg_advisory_lock(7, 7)",
    "temp_table": "CREATE TEMP TABLE leftover (n int)",
}


def session_state() -> dict[str, Any]:
    """What this thread's session and Django activations look like now."""
    from django.db import connection
    from django.utils import timezone, translation

    with connection.cursor() as cur:
        cur.execute(
            "SELECT current_setting('statement_timeout'), current_setting('search_path'), "
            "(SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' "
            "AND pid = pg_catalog.pg_backend_pid()), "
            "pg_catalog.to_regclass('pg_temp.leftover') IS NOT NULL"
        )
        timeout, path, locks, temp = cur.fetchone()
    return {
        "statement_timeout": timeout,
        "search_path": path,
        "advisory_locks": locks,
        "temp_table": temp,
        "timezone": timezone.get_current_timezone_name(),
        "language": translation.get_language(),
    }


@handler("test.session")
def session(ctx: JobContext) -> dict[str, Any]:
    """Returns the session as it found it (session_state), then leaves behind what
    `payload["change"]` names: SESSION_CHANGES' statements, "timezone", "language"."""
    from django.db import connection
    from django.utils import timezone, translation

    found = session_state()
    for change in ctx.payload.get("change", []):
        if change == "timezone":
            timezone.activate("Asia/Tokyo")
        elif change == "language":
            translation.activate("fr")
        else:
            with connection.cursor() as cur:
                cur.execute(SESSION_CHANGES[change])
    return found
