"""The admin: jobs, attempts, events, rejected writes, effects, schedules -- and the operator's
actions.

Owns: screens for admins and the four actions (requeue, cancel, retry now, enqueue a copy), in
job.py; the records' view-only screens in records.py; queue controls (pause, resume, limit, all
through jobs.ops.queues) in queues.py; django-q2's transport screens, read-only,
in transport.py; axes' login attempts, its clean-up action working, in logins.py. Never: saves a
job from a form -- an admin changes a job only through jobs.ops.actions ->
jobs.core.transitions, fenced like a worker's write; "add job" goes through enqueue's
validation.

Hazards: django-q2's own admin would let a user queue tasks or schedules that bypass the job
tables; transport.py re-registers it read-only. It is imported first, so django-q2's own
registrations exist before they are replaced.
"""

from jobs.admin import transport  # noqa: I001  (first: replaces django-q2's registrations)
from jobs.admin import job, logins, queues, records

__all__ = ["job", "logins", "queues", "records", "transport"]
