"""The faults, on a schedule derived from the seed, and how each is injected.

`schedule(seed, faults, seconds, kinds)` gives the same list of (at, kind) for the same seed.
Targets (which running attempt, which backend) are picked when the fault fires, from what is
running then, with a generator seeded from (seed, index): the schedule is reproducible, the
exact victims depend on timing.

Kinds:
- zombie: SIGSTOP the worker process of a running attempt until its job is claimed again and
  ended (or a deadline), then SIGCONT: its later writes must all be refused. The wake-up runs
  on a thread of its own, so later faults overlap the stop.
- kill_worker: SIGKILL the worker process of a running attempt (mid-job or mid-commit).
- term_cluster: SIGTERM a whole cluster mid-batch, then start it again.
- terminate_backend: pg_terminate_backend of one to three worker connections.
- pg_crash: kill -9 the private PostgreSQL and start it again (WAL replay).
- partition / proxy_reset / commit_cut: through the fault proxy in front of one cluster: hold
  every connection silent for 1-3 s; reset every connection; let the next COMMIT reach the
  server but drop its answer (the outcome unknown to the worker).
- pooler_restart: kill -9 the PgBouncer (transaction pooling) in front of cluster 1 and start it
  again on the same port.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench.chaos.clusters import Cluster, worker_pid
from bench.chaos.pgserver import PrivatePostgres

KINDS = ("zombie", "kill_worker", "term_cluster", "terminate_backend", "pg_crash",
         "partition", "proxy_reset", "commit_cut", "pooler_restart")  # fmt: skip
WEIGHTS = {"zombie": 8, "kill_worker": 3, "term_cluster": 1, "terminate_backend": 3,
           "pg_crash": 1, "partition": 2, "proxy_reset": 1, "commit_cut": 2,
           "pooler_restart": 1}  # fmt: skip


def schedule(seed: int, faults: int, seconds: float, kinds: tuple[str, ...] = KINDS
             ) -> list[tuple[float, str]]:  # fmt: skip
    rng = random.Random(seed)
    pool = [k for k in kinds for _ in range(WEIGHTS.get(k, 1))]
    times = sorted(rng.uniform(0.5, max(seconds, 1.0)) for _ in range(faults))
    return [(round(t, 3), rng.choice(pool)) for t in times]


@dataclass
class World:
    pg: PrivatePostgres
    database: str
    clusters: list[Cluster]
    proxy: Any = None  # tests.integration.pgproxy.PgProxy in front of clusters[0], if any
    pooler: Any = None  # bench.chaos.pooler.PrivatePgBouncer in front of clusters[1], if any
    lease: float = 2.0
    log: list[dict[str, Any]] = field(default_factory=list)
    pending: list[threading.Thread] = field(default_factory=list)  # zombies not yet woken
    recoveries: list[float] = field(default_factory=list)

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


def _signal(pid: int, sig: int) -> None:
    try:
        import os

        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def inject(world: World, kind: str, rng: random.Random) -> dict[str, Any]:
    """Inject one fault; what it did (for the report)."""
    started = time.monotonic()
    done: dict[str, Any] = {"kind": kind}
    try:
        INJECT[kind](world, rng, done)
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


def _victim(world: World, rng: random.Random, done: dict[str, Any], prefer: str = ""
            ) -> tuple[int, int, int, Cluster] | None:  # fmt: skip
    running = (prefer and world.running(PHASES[prefer])) or world.running()
    if prefer and running:
        done["phase"] = prefer
    if not running:
        done["skipped"] = "nothing running"
        return None
    victim = rng.choice(running)
    done.update(job=victim[0], attempt=victim[1], pid=victim[2], cluster=victim[3].name)
    return victim


def _zombie(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    victim = _victim(world, rng, done, prefer=rng.choice(["long", "finishing", "finishing", ""]))
    if victim is None:
        return
    job, attempt, pid, _ = victim
    _signal(pid, signal.SIGSTOP)
    done["taken_over"] = False

    def wake() -> None:  # stopped until another attempt took the job and, if it can, ended it
        deadline = time.monotonic() + world.lease * 8
        try:
            while time.monotonic() < deadline:
                row = world.sql("SELECT attempt, state FROM jobs_job WHERE id = %s", job)
                if row and (row[0][0] > attempt or row[0][1] != "running"):
                    done["taken_over"] = True
                    if row[0][1] != "running":
                        break
                time.sleep(0.1)
        except psycopg.Error:
            pass  # the database went down meanwhile: wake the zombie now
        finally:
            _signal(pid, signal.SIGCONT)
            done["stopped_seconds"] = round(time.monotonic() - started, 3)

    started = time.monotonic()
    thread = threading.Thread(target=wake, name=f"zombie-{pid}", daemon=True)
    world.pending.append(thread)
    thread.start()  # the schedule goes on: faults overlap the zombie's stop


def _kill_worker(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    victim = _victim(world, rng, done)
    if victim is not None:
        _signal(victim[2], signal.SIGKILL)


def _term_cluster(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    cluster = rng.choice(world.clusters)
    done["cluster"] = cluster.name
    done["stop_seconds"] = round(cluster.terminate(), 3)
    cluster.start()


def _terminate_backend(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    pids = [r[0] for r in world.sql(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )]  # fmt: skip
    chosen = rng.sample(pids, min(len(pids), rng.randint(1, 3)))
    for pid in chosen:
        world.sql("SELECT pg_terminate_backend(%s)", pid)
    done["backends"] = len(chosen)


def _pg_crash(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    seconds = world.pg.restart_after_crash()
    world.recoveries.append(seconds)
    done["recovery_seconds"] = round(seconds, 3)


def _partition(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    if world.proxy is None:
        done["skipped"] = "no proxy"
        return
    hold = rng.uniform(1.0, 3.0)
    world.proxy.hold()
    time.sleep(hold)  # the fault's own duration, not a synchronisation
    world.proxy.heal()
    done["held_seconds"] = round(hold, 3)


def _proxy_reset(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    if world.proxy is None:
        done["skipped"] = "no proxy"
        return
    world.proxy.reset()


def _commit_cut(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    if world.proxy is None:
        done["skipped"] = "no proxy"
        return
    world.proxy.cut_on(b"COMMIT", after_reply=True)
    done["armed"] = True


def _pooler_restart(world: World, rng: random.Random, done: dict[str, Any]) -> None:
    if world.pooler is None:
        done["skipped"] = "no pooler"
        return
    done["restart_seconds"] = round(world.pooler.restart(), 3)


INJECT: dict[str, Callable[[World, random.Random, dict[str, Any]], None]] = {
    "zombie": _zombie, "kill_worker": _kill_worker, "term_cluster": _term_cluster,
    "terminate_backend": _terminate_backend, "pg_crash": _pg_crash, "partition": _partition,
    "proxy_reset": _proxy_reset, "commit_cut": _commit_cut, "pooler_restart": _pooler_restart,
}  # fmt: skip
