"""The faults, on a schedule derived from the seed, and how each is injected.

`schedule(seed, faults, seconds, kinds, clusters, workers)` gives, for one seed, the same list
of `Fault`s -- time, kind AND victim -- every time: each fault names its victim by a stable
rule (cluster index, worker slot, a seeded number for any further choice), never "whatever is
running". A worker slot is the slot-th of the cluster's live worker processes in pid order (the
order they were started). A fault whose victim has nothing to hit when it fires (the slot ran no
job within VICTIM_WAIT seconds, no commit came while armed) is recorded `skipped` with the
reason; whether that happens depends on timing, which the schedule cannot fix.

Every kind is in every schedule of at least len(kinds) faults (one of each first, the rest
drawn by weight), so the small configuration exercises all of them.

Kinds (bench/chaos/targeted.py holds the ones armed on a commit or a transaction):
- zombie: SIGSTOP the slot's worker (preferably in a long job's write loop or after its last
  fenced write) until its job is claimed again and ended, then SIGCONT.
- zombie_commit: cluster 0's next commit of a job that lingers or runs long is held in the
  proxy, its worker SIGSTOPped; once another attempt runs the job the held commit is relayed (a
  stale commit presented to the database), then SIGCONT.
- zombie_write: the same with cluster 0's next token-checked INSERT or DELETE of an item.
- kill_worker: SIGKILL the slot's worker mid-job.
- kill_mid_commit: SIGKILL the slot's worker between sending its commit and the reply.
- term_cluster: SIGTERM a whole cluster mid-batch, then start it again.
- terminate_backend: pg_terminate_backend of one to three client backends.
- terminate_mid_commit / terminate_mid_transaction: pg_terminate_backend of the slot's worker
  connection while its commit runs / inside a token-checked write's transaction.
- pg_crash: kill -9 the private PostgreSQL and start it again (WAL replay).
- partition / proxy_reset / commit_cut: through the fault proxy in front of cluster 0 (a cut
  lets the next commit -- the platform's own commit statement or a transaction's COMMIT, a
  seeded choice -- reach the server and drops its answer).
- pooler_restart: kill -9 the PgBouncer in front of cluster 1 and start it again.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench.chaos.clusters import Cluster, worker_pid
from bench.chaos.proxy import COMMIT_MARKER

KINDS = ("zombie", "zombie_commit", "kill_worker", "kill_mid_commit", "term_cluster",
         "terminate_backend", "terminate_mid_commit", "terminate_mid_transaction", "pg_crash",
         "partition", "proxy_reset", "commit_cut", "pooler_restart", "zombie_write")  # fmt: skip
WEIGHTS = {"zombie": 6, "zombie_commit": 2, "kill_worker": 3, "kill_mid_commit": 2,
           "term_cluster": 1, "terminate_backend": 2, "terminate_mid_commit": 2,
           "terminate_mid_transaction": 2, "pg_crash": 1, "partition": 2, "proxy_reset": 1,
           "commit_cut": 2, "pooler_restart": 1, "zombie_write": 2}  # fmt: skip
ON_CLUSTER_0 = ("zombie_commit", "partition", "proxy_reset", "commit_cut",
                "zombie_write")  # the proxy's cluster  # fmt: skip
PHASE_CHOICES = ("long", "finishing", "finishing", "")
VICTIM_WAIT = 1.0  # seconds a fault waits for its slot to run a job before it is skipped


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    cluster: int  # index into the run's clusters
    slot: int  # worker slot within that cluster
    phase: str = ""  # zombies: where to stop it ("long", "finishing" or anywhere)
    count: int = 1  # terminate_backend: how many backends
    seconds: float = 0.0  # partition: how long
    pick: int = 0  # a seeded number for any choice made among what exists when it fires


def schedule(seed: int, faults: int, seconds: float, kinds: tuple[str, ...] = KINDS,
             clusters: int = 3, workers: int = 2) -> list[Fault]:  # fmt: skip
    """The seed's faults, in time order: the same seed gives the same list."""
    if clusters < 1 or workers < 1:
        raise ValueError("schedule(): clusters and workers must be at least 1")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"schedule(): unknown fault kinds {sorted(unknown)}")
    rng = random.Random(seed)
    pool = [k for k in kinds for _ in range(WEIGHTS.get(k, 1))]
    chosen = list(kinds)[:faults]
    rng.shuffle(chosen)
    chosen += [rng.choice(pool) for _ in range(faults - len(chosen))]
    times = sorted(rng.uniform(0.5, max(seconds, 1.0)) for _ in range(faults))
    out = []
    for at, kind in zip(times, chosen, strict=True):
        cluster = 0 if kind in ON_CLUSTER_0 else rng.randrange(clusters)
        if kind == "pooler_restart":
            cluster = min(1, clusters - 1)
        out.append(Fault(
            at=round(at, 3), kind=kind, cluster=cluster, slot=rng.randrange(workers),
            phase=rng.choice(PHASE_CHOICES) if kind == "zombie" else "",
            count=rng.randint(1, 3), seconds=round(rng.uniform(1.0, 3.0), 3),
            pick=rng.randrange(1 << 30),
        ))  # fmt: skip
    return out


@dataclass
class World:
    pg: Any  # bench.chaos.pgserver.PrivatePostgres
    database: str
    clusters: list[Cluster]
    proxy: Any = None  # bench.chaos.proxy.ChaosProxy in front of clusters[0], if any
    pooler: Any = None  # bench.chaos.pooler.PrivatePgBouncer in front of clusters[1], if any
    lease: float = 2.0
    log: list[dict[str, Any]] = field(default_factory=list)
    pending: list[threading.Thread] = field(default_factory=list)  # zombies not yet woken
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)  # every pid the suite SIGKILLed

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg.dsn(self.database), autocommit=True, connect_timeout=10) as c:
            cur = c.execute(query, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def running(self, where: str = "true") -> list[tuple[int, int, int, Cluster]]:
        """(job, attempt, pid, cluster) of attempts running now in a cluster of ours."""
        rows = self.sql(
            "SELECT j.id, j.attempt, a.worker FROM jobs_job j JOIN jobs_attempt a "
            f"ON a.job_id = j.id AND a.number = j.attempt WHERE j.state = 'running' AND {where}"
        )
        found = []
        for job, attempt, worker in rows:
            pid = worker_pid(worker)
            for cluster in self.clusters:
                if pid is not None and cluster.owns(pid):
                    found.append((job, attempt, pid, cluster))
        return found

    def slot_pid(self, fault: Fault) -> int | None:
        """The worker process in the fault's slot: the slot-th live worker of its cluster in pid
        order (a worker is a process of the cluster's group that has claimed a job)."""
        cluster = self.clusters[fault.cluster % len(self.clusters)]
        alive = set(cluster.pids())
        workers = sorted(
            p for (w,) in self.sql("SELECT DISTINCT worker FROM jobs_attempt")
            if (p := worker_pid(w)) in alive
        )  # fmt: skip
        return workers[fault.slot % len(workers)] if workers else None

    def slot_job(self, fault: Fault, done: dict[str, Any], phase: str = "",
                 wait: float = VICTIM_WAIT) -> tuple[int, int, int] | None:  # fmt: skip
        """(job, attempt, pid) the fault's slot runs -- in `phase` if it gets there within
        `wait` -- or None (recorded skipped)."""
        deadline = time.monotonic() + wait
        pid = self.slot_pid(fault)
        found = None
        while pid is not None:
            rows = self.running(f"a.worker LIKE '%%:{int(pid)}'")
            if rows:
                found = rows[0][:3]
                if not phase or self.running(f"j.id = {int(found[0])} AND {PHASES[phase]}"):
                    done["phase"] = phase or "any"
                    break
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if found is None:
            done["skipped"] = "slot ran no job" if pid else "slot has run no job yet"
            return None
        done.update(job=found[0], attempt=found[1], pid=found[2])
        done.setdefault("phase", "other")
        return found

    def kill(self, pid: int) -> None:
        self.killed.add(pid)
        signal_pid(pid, signal.SIGKILL)


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def inject(world: World, fault: Fault) -> dict[str, Any]:
    """Inject one fault; what it did (for the report)."""
    from bench.chaos import targeted

    started = time.monotonic()
    done: dict[str, Any] = {"kind": fault.kind, "cluster": world.clusters[
        fault.cluster % len(world.clusters)].name, "slot": fault.slot,
        "wall": round(time.time(), 3)}  # fmt: skip
    try:
        (INJECT.get(fault.kind) or targeted.INJECT[fault.kind])(world, fault, done)
    except psycopg.Error as exc:  # the database itself may be down (a pg_crash just before)
        done["skipped"] = f"database unavailable: {type(exc).__name__}"
    done["seconds"] = round(time.monotonic() - started, 3)
    world.log.append(done)
    return done


# Where a zombie is most telling: in a long job's loop of token writes (it writes before it
# knows), or after its last fenced write with only its commit left.
PHASES = {
    "long": "(j.payload->>'seconds')::float > 0",
    "finishing": "j.progress->>'step' = 'finishing' AND j.progress->>'attempt' = j.attempt::text",
}


def wait_taken_over(world: World, job: int, attempt: int, done: dict[str, Any],
                    until_ended: bool = True) -> None:  # fmt: skip
    """Poll until another attempt took the job (and, with `until_ended`, it ended) or 8 leases."""
    deadline = time.monotonic() + world.lease * 8
    try:
        while time.monotonic() < deadline:
            row = world.sql("SELECT attempt, state FROM jobs_job WHERE id = %s", job)
            if row and (row[0][0] > attempt or row[0][1] != "running"):
                done["taken_over"] = True
                if row[0][1] != "running" or not until_ended:
                    return
            time.sleep(0.05)
    except psycopg.Error:
        pass  # the database went down meanwhile: give up waiting


def _zombie(world: World, fault: Fault, done: dict[str, Any]) -> None:
    victim = world.slot_job(fault, done, phase=fault.phase)
    if victim is None:
        return
    job, attempt, pid = victim
    signal_pid(pid, signal.SIGSTOP)
    done["taken_over"] = False
    started = time.monotonic()

    def wake() -> None:  # stopped until another attempt took the job and, if it can, ended it
        try:
            wait_taken_over(world, job, attempt, done)
        finally:
            signal_pid(pid, signal.SIGCONT)
            done["stopped_seconds"] = round(time.monotonic() - started, 3)

    thread = threading.Thread(target=wake, name=f"zombie-{pid}", daemon=True)
    world.pending.append(thread)
    thread.start()  # the schedule goes on: faults overlap the zombie's stop


def _kill_worker(world: World, fault: Fault, done: dict[str, Any]) -> None:
    victim = world.slot_job(fault, done)
    if victim is not None:
        world.kill(victim[2])


def _term_cluster(world: World, fault: Fault, done: dict[str, Any]) -> None:
    cluster = world.clusters[fault.cluster % len(world.clusters)]
    done["stop_seconds"] = round(cluster.terminate(killed=world.killed), 3)
    cluster.start()


def _terminate_backend(world: World, fault: Fault, done: dict[str, Any]) -> None:
    pids = [r[0] for r in world.sql(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend' ORDER BY pid"
    )]  # fmt: skip
    chosen = random.Random(fault.pick).sample(pids, min(len(pids), fault.count))
    for pid in chosen:
        world.sql("SELECT pg_terminate_backend(%s)", pid)
    done["backends"] = len(chosen)


def _pg_crash(world: World, fault: Fault, done: dict[str, Any]) -> None:
    before = world.sql("SELECT coalesce(max(id), 0) FROM jobs_jobevent WHERE type = 'succeeded'")
    crashed_at = time.monotonic()
    seconds = world.pg.restart_after_crash()
    entry = {"accepting_s": round(seconds, 3), "first_commit_s": None}
    world.recoveries.append(entry)
    done["recovery_seconds"] = entry["accepting_s"]

    def first_commit() -> None:  # service back: the first job committed after the restart
        deadline = crashed_at + 60
        while time.monotonic() < deadline:
            try:
                if world.sql("SELECT 1 FROM jobs_jobevent WHERE type = 'succeeded' AND id > %s "
                             "LIMIT 1", before[0][0]):  # fmt: skip
                    entry["first_commit_s"] = round(time.monotonic() - crashed_at, 3)
                    return
            except psycopg.Error:
                pass
            time.sleep(0.05)

    threading.Thread(target=first_commit, daemon=True).start()


def _partition(world: World, fault: Fault, done: dict[str, Any]) -> None:
    if world.proxy is None:
        done["skipped"] = "no proxy"
        return
    world.proxy.hold()
    time.sleep(fault.seconds)  # the fault's own duration, not a synchronisation
    world.proxy.heal()
    done["held_seconds"] = fault.seconds


def _proxy_reset(world: World, fault: Fault, done: dict[str, Any]) -> None:
    if world.proxy is None:
        done["skipped"] = "no proxy"
        return
    world.proxy.reset()


def _commit_cut(world: World, fault: Fault, done: dict[str, Any]) -> None:
    if world.proxy is None:
        done["skipped"] = "no proxy"
        return
    # Half of them (a seeded choice) on the platform's own commit statement, which commits on
    # its own (autocommit); the others on the COMMIT of a transaction (a token-checked write's,
    # an effect's, a rejection's record).
    job_commit = fault.pick % 2 == 1
    world.proxy.cut_on(COMMIT_MARKER if job_commit else b"COMMIT", after_reply=True)
    done.update(armed=True, on="job commit" if job_commit else "COMMIT")


def _pooler_restart(world: World, fault: Fault, done: dict[str, Any]) -> None:
    if world.pooler is None:
        done["skipped"] = "no pooler"
        return
    done["restart_seconds"] = round(world.pooler.restart(), 3)


INJECT: dict[str, Callable[[World, Fault, dict[str, Any]], None]] = {
    "zombie": _zombie, "kill_worker": _kill_worker, "term_cluster": _term_cluster,
    "terminate_backend": _terminate_backend, "pg_crash": _pg_crash, "partition": _partition,
    "proxy_reset": _proxy_reset, "commit_cut": _commit_cut, "pooler_restart": _pooler_restart,
}  # fmt: skip
