"""The django-q2 bridge: the only module that talks to django-q2.

Owns: the task django-q2 executes (`drain`) and asking django-q2 to run it. A django-q2 task only
says "run due work"; the job tables decide which attempt may own a job, so a duplicate or late
delivery is a drain that claims nothing. Never: reads django-q2's OrmQ/Task/Schedule rows for a
job's state.

Also owns the broker django-q2 is configured with (Q_CLUSTER["broker_class"]): its ORM broker,
made to ride out a database outage. django-q2's pusher sleeps 10 s after any broker error and is
then restarted by the sentinel, so every blip stalled dispatch for up to ~10 s; this broker's
poll is bounded (jobs.core.connectivity), catches the error itself, logs the outage once (then a
rate-limited reminder, then the recovery) and retries within 0.25 s, so the pusher never sees it.
"""

import gc
import time
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections
from django_q.brokers import Broker, get_broker
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.signals import post_spawn
from django_q.tasks import async_task

from jobs.core.connectivity import OutageLog, bounded
from jobs.worker import runner, shutdown, watchdog

DRAIN_TASK = "jobs.worker.bridge.drain"


def drain(queues: Sequence[str] | None = None) -> int:
    """Executed by a django-q2 worker process: a drain that, once idle, waits for new work."""
    with shutdown.draining():
        ran = runner.drain(list(queues) if queues else None, idle_wait=True)
    if shutdown.terminated():
        raise SystemExit(0)  # SIGTERM to the whole group: the sentinel is gone, so leave now
    return ran


def freeze_startup_heap(sender: object = None, **kwargs: object) -> None:
    """django-q2's post_spawn, in each new worker process: the objects it starts with (Django,
    the apps, django-q2: about 115,000) are moved where the garbage collector never walks them,
    so a full collection during a drain walks only what was made since. Before, each worker
    stopped claiming and committing for one 63-72 ms collection in every 4,000-job drain
    (measured with gc.callbacks). The startup objects stay for the process's life anyway; one
    of them that later becomes cyclic garbage is kept, not collected."""
    gc.collect()
    gc.freeze()


post_spawn.connect(freeze_startup_heap, dispatch_uid="jobs.bridge.freeze_startup_heap")
post_spawn.connect(shutdown.install_worker_handler, dispatch_uid="jobs.shutdown.worker_sigterm")
post_spawn.connect(watchdog.claim_slot, dispatch_uid="jobs.watchdog.claim_slot")


def worker_count() -> int:
    return int(Conf.WORKERS)


def request_drains(count: int, queues: Sequence[str] | None, broker: Broker) -> None:
    # timeout=-1: no django-q2 timer on a drain. Its SIGALRM would raise anywhere in the drain
    # (in a commit too), and its guard's SIGTERM would read as a stop; each handler's execution
    # timeout is enforced per attempt instead (jobs.worker.watchdog).
    for _ in range(count):
        async_task(DRAIN_TASK, list(queues) if queues else None, broker=broker, timeout=-1)


def pending_drains(broker: Broker) -> int:
    """Drain tasks waiting in the broker (not yet handed to a worker)."""
    return int(broker.queue_size() or 0)


def new_broker() -> Broker:
    return get_broker()


class ResilientORMBroker(ORM):
    """django-q2's ORM broker whose poll survives a database outage without the 10 s stall."""

    def __init__(self, list_key: str | None = None) -> None:
        self.outage = OutageLog("django-q2 pusher (broker poll)")
        self.ack_outage = OutageLog("django-q2 monitor (broker acknowledge)")
        # django-q2's ORM broker reads the connection's autocommit flag when it is made (in the
        # sentinel, the pusher and the monitor): with the database down at that moment it raised
        # and took the whole cluster down (found by bench/chaos: a cluster restarted during a
        # PostgreSQL crash). Wait for the database instead, as every other loop here does.
        starting = OutageLog("django-q2 broker (start)")
        while True:
            try:
                super().__init__(list_key=list_key)  # type: ignore[arg-type]
                break
            except DatabaseError as exc:
                starting.failed(exc)
                connections[Conf.ORM].close()
                time.sleep(starting.backoff())  # waiting for the database, not for a condition
        starting.recovered()

    def dequeue(self) -> Any:
        try:
            with bounded("broker poll", conn=connections[Conf.ORM]):
                tasks = super().dequeue()
        except DatabaseError as exc:
            self.outage.failed(exc)
            connections[Conf.ORM].close()
            time.sleep(self.outage.backoff())  # waiting for the database, not for a condition
            return None
        self.outage.recovered()
        return tasks

    def acknowledge(self, task_id: Any) -> None:
        """An acknowledgement lost to an outage is dropped, not fatal: the task row is redelivered
        after Q_RETRY as a harmless drain that claims nothing (the job tables decide)."""
        try:
            with bounded("broker acknowledge", conn=connections[Conf.ORM]):
                super().acknowledge(task_id)
        except DatabaseError as exc:
            self.ack_outage.failed(exc)
            connections[Conf.ORM].close()
            return
        self.ack_outage.recovered()
