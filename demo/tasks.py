"""Demo `@task` functions (django.tasks on jobs.tasks.PalisadeBackend, config/settings.TASKS)."""

import time
from typing import Any

from django.tasks import TaskContext, task

from demo.handlers import DRILL_LEASE_SECONDS
from jobs.tasks import job_context


# django-stubs type @task without the backend options Django 6.1 passes through (**kwargs).
@task(  # type: ignore[call-overload]
    takes_context=True, priority=100, lease_seconds=DRILL_LEASE_SECONDS, max_attempts=5
)
def drill(context: TaskContext, seconds: float = 3.0) -> dict[str, Any]:
    """The drill's slow work as a task (`manage.py drill --task`): one plain sleep, so a SIGSTOP
    lands inside it and the resumed process goes straight to its stale commit."""
    time.sleep(seconds)
    return {"attempt": context.attempt, "worker": job_context(context).worker}


@task
def noop() -> None:
    """A task that does nothing: what bench/run.py's `tasks` row drains."""
    return None
