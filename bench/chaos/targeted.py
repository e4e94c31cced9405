"""The faults armed on a commit or a transaction: each lands at the moment it names, not at
whatever moment the schedule fires.

- kill_mid_commit / terminate_mid_commit: the nemesis locks the slot's running job row
  (`FOR NO KEY UPDATE`, which a foreign key's share lock does not wait for) on a connection of
  its own, and waits until a backend blocked behind that lock is running the platform's commit
  statement: the commit has been sent and has no reply. Then it SIGKILLs the slot's worker (the
  statement still runs once the lock goes: the job commits and nobody hears of it) or
  terminates that backend (the statement is rolled back: the worker hears of a lost connection),
  and lets the lock go.
- terminate_mid_transaction: the same with one of the slot's job's application rows locked
  (`FOR UPDATE`): the backend blocked behind it is inside a token-checked write's transaction
  (its rows' `SELECT ... FOR UPDATE`); it is terminated there.
- zombie_commit: cluster 0's next commit statement of a job that lingers or runs long is held
  in the fault proxy (bench/chaos/proxy.py) and its worker SIGSTOPped; once the job runs under
  a later attempt (or ended) the held statement is relayed -- a stale commit presented to the
  database, which must change nothing -- and the worker SIGCONTed. Without it a zombie often
  learns of its lost lease from its own heartbeat on waking and never presents its commit.

- zombie_write: the same with cluster 0's next token-checked INSERT or DELETE of the workload's
  items (a seeded half each), relayed once the attempt's lease has expired (the job queued
  again, or already taken or ended): the zombie's write must change nothing.

Each waits at most HOLD seconds for its moment; if it does not come the fault is recorded
skipped ("no commit while armed").
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.chaos import history
from bench.chaos.nemesis import Fault, World, signal_pid
from bench.chaos.proxy import COMMIT_MARKER, commit_rows, socket_owner

HOLD = 4.0  # seconds a lock waits for the statement it is armed for (under the 5 s DB timeout)
SLOT_WAIT = 6.0  # seconds a targeted fault waits for its slot to reach a job's last phase
ZOMBIE_COMMIT_WAIT = 60.0  # seconds a held commit waits for a later attempt to run its job
COMMIT_TEXT = COMMIT_MARKER.decode()


def _blocked_behind(world: World, lock_sql: str, param: Any, want: Callable[[str], bool],
                    act: Callable[[int], None], done: dict[str, Any]) -> None:  # fmt: skip
    """Hold the lock; when a backend blocked behind it runs a statement `want` accepts, `act` on
    that backend's pid; then let the lock go."""
    with psycopg.connect(world.pg.dsn(world.database), connect_timeout=10) as holder:
        holder.execute("SET lock_timeout = '2s'")
        if not holder.execute(lock_sql, (param,)).fetchall():
            done["skipped"] = "nothing to lock"
            return
        me = holder.info.backend_pid
        deadline = time.monotonic() + HOLD
        while time.monotonic() < deadline:
            rows = world.sql(
                "SELECT pid, query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                me,
            )
            hit = next(((pid, q) for pid, q in rows if want(q)), None)
            if hit is not None:
                act(hit[0])
                done.update(fired=True, backend=hit[0], statement=hit[1][:60].split()[0:3])
                break
            time.sleep(0.02)
        else:
            done["skipped"] = "no statement while armed"
        holder.rollback()  # the lock goes: a blocked statement of a killed worker runs now


def _mid_commit(world: World, fault: Fault, done: dict[str, Any], kill: bool) -> None:
    victim = world.slot_job(fault, done, phase="finishing", wait=SLOT_WAIT)
    if victim is None:
        return
    if done["phase"] != "finishing":  # a quick job commits before the lock; a long one blocks
        done["skipped"] = "slot ran no lingering job"  # on its checkpoints, not its commit
        return
    job, _attempt, pid = victim

    def act(backend: int) -> None:
        if kill:
            world.kill(pid)
        else:
            world.sql("SELECT pg_terminate_backend(%s)", backend)

    _blocked_behind(world, "SELECT 1 FROM jobs_job WHERE id = %s FOR NO KEY UPDATE", job,
                    lambda q: COMMIT_TEXT in q, act, done)  # fmt: skip


def _mid_transaction(world: World, fault: Fault, done: dict[str, Any]) -> None:
    victim = world.slot_job(fault, done, phase="long", wait=SLOT_WAIT)
    if victim is None:
        return
    rows = world.sql("SELECT payload->'rows' FROM jobs_job WHERE id = %s", victim[0])
    targets = (rows[0][0] if rows else None) or []
    if not targets:
        done["skipped"] = "job writes no rows"
        return

    def act(backend: int) -> None:
        world.sql("SELECT pg_terminate_backend(%s)", backend)

    _blocked_behind(world, "SELECT 1 FROM chaos_chaosrow WHERE id = %s FOR UPDATE",
                    max(targets), lambda q: "chaos_chaosrow" in q and "FOR UPDATE" in q, act,
                    done)  # fmt: skip


def _on_thread(world: World, name: str, body: Callable[[], None], done: dict[str, Any]) -> None:
    def run() -> None:
        try:
            body()
        except psycopg.Error as exc:
            done.setdefault("skipped", f"database unavailable: {type(exc).__name__}")

    done["fired"] = False
    thread = threading.Thread(target=run, name=name, daemon=True)
    world.pending.append(thread)
    thread.start()  # the schedule goes on meanwhile


def _kill_mid_commit(world: World, fault: Fault, done: dict[str, Any]) -> None:
    _on_thread(world, "kill-mid-commit", lambda: _mid_commit(world, fault, done, True), done)


def _terminate_mid_commit(world: World, fault: Fault, done: dict[str, Any]) -> None:
    _on_thread(world, "term-mid-commit", lambda: _mid_commit(world, fault, done, False), done)


def _terminate_mid_transaction(world: World, fault: Fault, done: dict[str, Any]) -> None:
    _on_thread(world, "term-mid-tx", lambda: _mid_transaction(world, fault, done), done)


def _zombie_commit(world: World, fault: Fault, done: dict[str, Any]) -> None:
    proxy = world.proxy
    if proxy is None or not hasattr(proxy, "intercept"):
        done["skipped"] = "no proxy"
        return
    cluster = world.clusters[0]
    done.update(fired=False, armed=True)

    def take(pair: Any, data: bytes) -> bool:
        rows = commit_rows(data)
        try:
            lingering = world.sql(
                "SELECT id, attempt FROM jobs_job WHERE id = ANY(%s) AND state = 'running' AND "
                "(coalesce((payload->>'linger')::float, 0) > 0 "
                " OR coalesce((payload->>'seconds')::float, 0) > 0)",
                [j for j, _ in rows],
            )
        except psycopg.Error:
            return False
        presented = dict(rows)
        target = next(((j, presented[j]) for j, a in lingering if presented.get(j) == a), None)
        pid = socket_owner(pair, proxy.port, cluster.pids()) if target else None
        if target is None or pid is None:
            return False  # relayed as usual; the interceptor stays armed
        signal_pid(pid, signal.SIGSTOP)
        started = time.monotonic()
        done.update(fired=True, job=target[0], attempt=target[1], pid=pid, taken_over=False)
        try:  # until a later attempt runs the job (or it ended): the fence has work to do --
            # a requeued job may wait behind the queue's backlog before its next claim
            deadline = time.monotonic() + ZOMBIE_COMMIT_WAIT
            now, row = "?", []
            while time.monotonic() < deadline:
                try:
                    row = world.sql("SELECT attempt, state FROM jobs_job WHERE id = %s",
                                    target[0])  # fmt: skip
                except psycopg.Error:  # the database restarting (a pg_crash): look again
                    time.sleep(0.1)
                    continue
                now = f"attempt {row[0][0]} {row[0][1]}" if row else "deleted"
                if not row or row[0][1] not in ("running", "queued") or (
                        row[0][0] > target[1] and row[0][1] == "running"):  # fmt: skip
                    break
                time.sleep(0.01)
            done.update(presented_while=now, taken_over=not row or row[0][0] > target[1])
        except psycopg.Error:
            pass
        finally:
            try:
                pair.server.sendall(data)  # the stale commit reaches the database
            except OSError:
                pass
            signal_pid(pid, signal.SIGCONT)
            done["stopped_seconds"] = round(time.monotonic() - started, 3)
        return True

    proxy.intercept(COMMIT_MARKER, take)


# A token-checked INSERT or DELETE of the workload's items, as Django writes it (cluster 0 runs
# without prepared statements, so the proxy sees the statement's text).
ITEM_WRITES = {
    "insert": b'INSERT INTO "chaos_chaositem" (',
    "delete": b'DELETE FROM "chaos_chaositem"',
}


def _zombie_write(world: World, fault: Fault, done: dict[str, Any]) -> None:
    """Cluster 0's next fenced INSERT (or DELETE, a seeded half) of an item is held in the proxy
    and its worker SIGSTOPped; once its attempt no longer owns the job (expired, taken over or
    ended) the statement is relayed -- a zombie's write presented to the database, which must
    refuse it -- and the worker SIGCONTed. Its job is the one the worker's last history line
    names (the job id is a bound parameter the statement's text does not show)."""
    proxy = world.proxy
    if proxy is None or not hasattr(proxy, "intercept"):
        done["skipped"] = "no proxy"
        return
    cluster, op = world.clusters[0], ("insert", "delete")[fault.pick % 2]
    done.update(fired=False, armed=True, on=op)

    def take(pair: Any, data: bytes) -> bool:
        pid = socket_owner(pair, proxy.port, cluster.pids())
        writing = _writing_items(pid) if pid is not None else None
        try:
            running = writing and world.running(
                f"j.id = {int(writing[0])} AND j.attempt = {int(writing[1])}"
            )
        except psycopg.Error:
            return False
        if pid is None or not writing or not running:
            done["declined"] = done.get("declined", 0) + 1
            return False  # relayed as usual; the interceptor stays armed
        job, attempt = writing
        signal_pid(pid, signal.SIGSTOP)
        started = time.monotonic()
        done.update(fired=True, job=job, attempt=attempt, pid=pid, taken_over=False)
        try:
            done["presented_while"] = _until_not_owned(world, job, attempt)
            done["taken_over"] = done["presented_while"] != f"attempt {attempt} running"
        finally:
            try:
                pair.server.sendall(data)  # the zombie's INSERT or DELETE reaches the database
            except OSError:
                pass
            signal_pid(pid, signal.SIGCONT)
            done["stopped_seconds"] = round(time.monotonic() - started, 3)
        return True

    proxy.intercept(ITEM_WRITES[op], take)


def _writing_items(pid: int) -> tuple[int, int] | None:
    """(job, attempt) whose item write this worker process is sending: its last history line
    (the handler writes one just before each fenced INSERT or DELETE; a batch claims several
    jobs, so the worker's running jobs alone do not say which)."""
    path = os.environ.get("CHAOS_HISTORY")
    if not path or not os.path.exists(path):
        return None
    last = None
    for line in history.read(Path(path)):
        if line["pid"] == pid:
            last = line
    if last and last["action"] in ("item_create", "item_delete") and last["phase"] == "before":
        return int(last["job"]), int(last["attempt"])
    return None


def _until_not_owned(world: World, job: int, attempt: int) -> str:
    """Wait (at most ZOMBIE_COMMIT_WAIT) until this attempt no longer owns the job -- its lease
    expired (queued again), a later attempt runs it, or it ended; what the job row said then.
    Not until a later attempt runs it, as zombie_commit waits: behind the queue's backlog that
    is often past the worker's own deadline for the statement (JOBS DB_TIMEOUT_SECONDS, 10 s,
    which counts the stopped time too), and the worker would cut its connection on waking
    before it read the database's answer."""
    deadline, now = time.monotonic() + ZOMBIE_COMMIT_WAIT, "?"
    while time.monotonic() < deadline:
        try:
            row = world.sql("SELECT attempt, state FROM jobs_job WHERE id = %s", job)
        except psycopg.Error:  # the database restarting (a pg_crash): look again
            time.sleep(0.1)
            continue
        now = f"attempt {row[0][0]} {row[0][1]}" if row else "deleted"
        if not row or row[0][0] != attempt or row[0][1] != "running":
            break
        time.sleep(0.01)
    return now


INJECT: dict[str, Callable[[World, Fault, dict[str, Any]], None]] = {
    "kill_mid_commit": _kill_mid_commit,
    "terminate_mid_commit": _terminate_mid_commit,
    "terminate_mid_transaction": _terminate_mid_transaction,
    "zombie_commit": _zombie_commit,
    "zombie_write": _zombie_write,
}
