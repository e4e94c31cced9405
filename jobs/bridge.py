"""The django-q2 bridge: the only module that talks to django-q2.

Owns: the task django-q2 executes (`drain`) and asking django-q2 to run it. A django-q2 task only
says "run due work"; the job tables decide which attempt may own a job, so a duplicate or late
delivery is a drain that claims nothing. Never: reads django-q2's OrmQ/Task/Schedule rows for a
job's state.
"""

from collections.abc import Sequence

from django_q.brokers import Broker, get_broker
from django_q.conf import Conf
from django_q.tasks import async_task

from jobs import runner

DRAIN_TASK = "jobs.bridge.drain"


def drain(queues: Sequence[str] | None = None) -> int:
    """Executed by a django-q2 worker process."""
    return runner.drain(list(queues) if queues else None)


def worker_count() -> int:
    return int(Conf.WORKERS)


def request_drains(count: int, queues: Sequence[str] | None, broker: Broker) -> None:
    for _ in range(count):
        async_task(DRAIN_TASK, list(queues) if queues else None, broker=broker)


def pending_drains(broker: Broker) -> int:
    """Drain tasks waiting in the broker (not yet handed to a worker)."""
    return int(broker.queue_size() or 0)


def new_broker() -> Broker:
    return get_broker()
