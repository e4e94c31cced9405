"""The cron page's rows: each schedule in words, its next tick and its last runs.

Owns: read-only queries for /cron/ and describing a cron expression in English (cron-descriptor).
Never writes: disable, enable and run now are jobs/ops/cron_controls.py's, called by
dashboard/operate.py.

A schedule's runs are the jobs whose unique key is `schedule:<name>:<tick>` (ticks and "run
now" alike): read newest first on the partial index jobs_job_schedule_runs_idx (kind, id WHERE
unique_key LIKE 'schedule:%'), RUNS_SHOWN per schedule, so the page never scans the job table.
"""

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cron_descriptor import ExpressionDescriptor, FormatException, Options
from django.db.models import Q, QuerySet

from jobs.core.sql.operator import database_clock
from jobs.models import Attempt, Job, Schedule

RUNS_SHOWN = 5
SCHEDULES_SHOWN = 100  # each costs one small index scan for its runs
ALIASES = {  # croniter's nicknames, which cron-descriptor does not read
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def describe(expression: str) -> str:
    """The expression in English ("At 03:00, Monday through Friday"); "" if it cannot say."""
    fields = ALIASES.get(expression.strip().lower(), expression).split()
    if len(fields) == 6:  # croniter's sixth field is seconds; cron-descriptor's is the first
        fields = [fields[5], *fields[:5]]
    options = Options()
    options.use_24hour_time_format = True
    try:
        return str(ExpressionDescriptor(" ".join(fields), options).get_description())
    except (FormatException, ValueError, IndexError, KeyError):
        return ""


@dataclass
class Run:
    job: Job
    started_at: datetime | None  # the claim of its latest attempt
    ended_at: datetime | None

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()


@dataclass
class ScheduleRow:
    schedule: Schedule
    description: str
    next_local: datetime | None  # next_at in the schedule's own time zone
    runs: list[Run]


def runs_query(schedule: Schedule, limit: int = RUNS_SHOWN) -> QuerySet[Job]:
    """The schedule's newest jobs. The first filter repeats the partial index's predicate word
    for word, so PostgreSQL can use the index."""
    return (
        Job.objects.filter(unique_key__startswith="schedule:", kind=schedule.kind)
        .filter(unique_key__startswith=f"schedule:{schedule.name}:")
        .only("id", "state", "attempt", "created_at", "finished_at", "unique_key")
        .order_by("-id")[:limit]
    )


def runs_of(schedules: list[Schedule]) -> dict[int, list[Run]]:
    """Each schedule's last runs, newest first, by schedule pk: one small index scan each, then
    one read of their latest attempts. (Not one UNION ALL of the scans: its summed cost estimate
    crosses PostgreSQL's JIT threshold, and compiling took 600 ms where the scans take 0.3 ms.)"""
    jobs = {s.pk: list(runs_query(s)) for s in schedules}
    latest = {(j.pk, j.attempt) for js in jobs.values() for j in js if j.attempt}
    times: dict[tuple[int, int], tuple[datetime | None, datetime | None]] = {}
    if latest:  # never an empty Q(): that would read every attempt
        wanted = Q()
        for pk, number in latest:  # (job, number): its unique index, one probe each
            wanted |= Q(job_id=pk, number=number)
        rows = Attempt.objects.filter(wanted).values("job_id", "number", "claimed_at", "ended_at")
        times = {(a["job_id"], a["number"]): (a["claimed_at"], a["ended_at"]) for a in rows}
    return {
        pk: [Run(j, *times.get((j.pk, j.attempt), (None, None))) for j in js]
        for pk, js in jobs.items()
    }


def _local(at: datetime | None, tz: str) -> datetime | None:
    if at is None:
        return None
    try:
        return at.astimezone(ZoneInfo(tz))
    except (ZoneInfoNotFoundError, ValueError):
        return None


def schedule_rows() -> tuple[datetime, list[ScheduleRow]]:
    """The database clock's now and the first SCHEDULES_SHOWN schedules by name."""
    now = database_clock()
    schedules = list(Schedule.objects.order_by("name")[:SCHEDULES_SHOWN])
    runs = runs_of(schedules)
    rows = [
        ScheduleRow(s, describe(s.cron), _local(s.next_at, s.timezone), runs[s.pk])
        for s in schedules
    ]
    return now, rows
