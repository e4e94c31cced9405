"""The records: the only truth about a job (django-q2's tables are transport).

- job.py      -- Job (and `Job.objects.enqueue()`), Attempt, JobEvent, RejectedWrite;
- one_statement.py -- PostgreSQL's one-statement enqueue: the row in, a real Job out;
- effects.py  -- IdempotencyKey, StagedOutput, Intent, and the FencedRow mixin;
- schedule.py -- Schedule (cron);
- queue.py    -- QueueControl (a queue paused or limited by an operator).

Owns: schema, constraints and read-only query methods. Never: changes a job's state, attempt,
lease or result -- jobs/core/transitions is the only writer of those. The records import only
the core's vocabulary (states, bounds, exceptions, enqueue's rules); everything above the core
may import the records.
"""

from jobs.models.effects import FencedRow, IdempotencyKey, Intent, StagedOutput
from jobs.models.job import Attempt, Job, JobEvent, RejectedWrite
from jobs.models.queue import QueueControl
from jobs.models.schedule import Schedule

__all__ = [
    "Attempt",
    "FencedRow",
    "IdempotencyKey",
    "Intent",
    "Job",
    "JobEvent",
    "QueueControl",
    "RejectedWrite",
    "Schedule",
    "StagedOutput",
]
