"""Django's task framework (`django.tasks`, 6.1) on Palisade's fenced engine.

`TASKS = {"default": {"BACKEND": "jobs.tasks.PalisadeBackend", "QUEUES": ["default"]}}`, then
`@task` functions enqueue as jobs (kind = the task's module path), run on the fenced runner, and
report through `get_result()` what the job tables say. Public names: `PalisadeBackend`,
`PalisadeTask` (the task class: `@task(lease_seconds=..., max_attempts=..., unique_key=...,
timeout=...)`), `PalisadeTaskContext` and `job_context()` (a takes_context task's JobContext),
the error classes a TaskError may name, `MalformedTask` (get_result of a task row whose payload is
not a task's), `UniqueKeyHeld` (enqueue: the task's key is held by a row planted with it) and
`UnencodableResult` (a return value that cannot be stored: the job fails, not retried). How it
maps, and why: docs/tasks.md.

Layering: the backend (backend.py, results.py) is used by the web process and never imports
jobs.worker; the side that runs a task in a worker (execution.py) is one more handler in the
registry, so the worker needs no knowledge of django.tasks.
"""

from jobs.tasks.backend import PalisadeBackend, PalisadeTask, UniqueKeyHeld
from jobs.tasks.execution import PalisadeTaskContext, UnencodableResult, job_context
from jobs.tasks.results import AttemptFailed, LeaseExpired, MalformedTask, TaskCancelled

__all__ = [
    "AttemptFailed",
    "LeaseExpired",
    "MalformedTask",
    "PalisadeBackend",
    "PalisadeTask",
    "PalisadeTaskContext",
    "TaskCancelled",
    "UnencodableResult",
    "UniqueKeyHeld",
    "job_context",
]
