"""The cron page's rows: each schedule in words, its next tick and its last runs.

Owns: read-only queries for /cron/ and describing a cron expression in English (cron-descriptor).
Never writes: disable, enable and run now are jobs/ops/cron_controls.py's, called by
dashboard/operate.py.

A schedule's runs are the jobs whose unique key is `schedule:<name>:<tick>` (ticks and "run
now" alike): read newest first on the partial index jobs_job_schedule_runs_idx (kind, id WHERE
unique_key LIKE 'schedule:%'), RUNS_SHOWN per schedule, so the page never scans the job table;
on PostgreSQL every schedule's runs and their attempts come in one statement (RUNS_SQL).
"""

import functools
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cron_descriptor import ExpressionDescriptor, FormatException, Options
from django.db import connection, transaction
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


@functools.lru_cache(maxsize=1024)
def describe(expression: str) -> str:
    """The expression in English ("At 03:00, Monday through Friday"); "" if it cannot say.
    Kept per process (cron-descriptor loads its translations on every call: 1-2 ms each)."""
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


# Each schedule's newest runs and their latest attempts in one statement (PostgreSQL): a LATERAL
# scan of the partial index per schedule. JIT is off for it: the planner prices each scan for the
# worst case (every run of the kind), and 100 of them cross jit_above_cost -- compiling took
# 600 ms where the scans take 0.3 ms (the UNION ALL this replaces was tried and hit exactly that).
RUNS_SQL = """
SELECT j.id, j.state, j.attempt, j.unique_key, j.created_at, j.finished_at, s.pk AS schedule_pk,
       a.claimed_at AS run_started_at, a.ended_at AS run_ended_at
  FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS s(pk, kind, prefix)
 CROSS JOIN LATERAL (
       SELECT id, state, attempt, unique_key, created_at, finished_at FROM jobs_job
        WHERE unique_key LIKE 'schedule:%%' AND kind = s.kind
          AND starts_with(unique_key, s.prefix)
        ORDER BY id DESC LIMIT %s) AS j
  LEFT JOIN jobs_attempt a ON a.job_id = j.id AND a.number = j.attempt
 ORDER BY s.pk, j.id DESC
"""


def runs_of(schedules: list[Schedule]) -> dict[int, list[Run]]:
    """Each schedule's last runs, newest first, by schedule pk. PostgreSQL: one statement
    (RUNS_SQL). Elsewhere: one small index scan per schedule, then one read of their latest
    attempts."""
    if not schedules:
        return {}
    if connection.vendor == "postgresql":
        return _runs_in_one_statement(schedules)
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


def _runs_in_one_statement(schedules: list[Schedule]) -> dict[int, list[Run]]:
    params = [
        [s.pk for s in schedules],
        [s.kind for s in schedules],
        [f"schedule:{s.name}:" for s in schedules],
        RUNS_SHOWN,
    ]
    runs: dict[int, list[Run]] = {s.pk: [] for s in schedules}
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL jit = off")
        for job in Job.objects.raw(RUNS_SQL, params):
            started, ended = job.run_started_at, job.run_ended_at  # type: ignore[attr-defined]
            runs[job.schedule_pk].append(Run(job, started, ended))  # type: ignore[attr-defined]
    return runs


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
