"""Read-only queries for the dashboard's screens. Never writes.

Every query here must stay fast at a million jobs: lists walk an index in order and stop after a
page (keyset pagination on `id`, newest first), aggregates over history read a bounded window of
the newest rows, and lease health reads only running jobs (the partial index jobs_job_lease_idx).
"""

import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, Lookup, Max, OuterRef, Q, QuerySet, Subquery, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Coalesce, Greatest, Left, TruncMinute
from django.utils import timezone

from dashboard import timeline
from dashboard.filters import SCAN_ROWS, bounded_ids, driver_of, filtered
from dashboard.timeline import MINOR_TYPES
from jobs.core.sql.metrics import rescued
from jobs.core.states import JobState
from jobs.models import Attempt, IdempotencyKey, Intent, Job, JobEvent, RejectedWrite, StagedOutput

PAGE_SIZE = 50
# Text search inside payloads scans at most this many jobs per page, newest first (no GIN index:
# see dashboard/migrations/0001_initial.py); the page's "older" link searches the next window.
# An id or unique key is not bounded. JSON containment
# (`{"order": 7}`) on PostgreSQL, else the JSON text is searched like any other text.
SEARCH_WINDOW = 20_000


class _AsciiIContains(Lookup):  # type: ignore[type-arg]
    """`lhs ILIKE '%rhs%'` in the "C" collation: case folds ASCII letters only, byte by byte.

    For an ASCII search text this finds what UPPER(...) LIKE in the database's locale finds
    (short of exotic letters whose upper case is ASCII, such as the long s, "ſ"), for less: on
    the 50,000 newest payloads 31-39 ms against 46-97 ms (psql, alternated, loaded machine);
    the locale's ILIKE and UPPER convert every payload to wide characters first. Used
    on PostgreSQL only; SQLite's LIKE already folds ASCII only."""

    lookup_name = "ascii_icontains"
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f'({lhs}) COLLATE "C" ILIKE {rhs}', (*lhs_params, *rhs_params)


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


HISTORY_EVENTS = 50_000  # sparklines read at most this many of the newest events
SPARK_MINUTES = 30


def _storable_json(value: Any) -> bool:
    """Whether `jsonb` can hold `value`: no NaN or infinity, no NUL in a key or a string, no
    key or string UTF-8 cannot encode (a lone surrogate, which JSON's "\\ud800" escape makes)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, str) and ("\x00" in item or not _utf8(item)):
            return False
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _search(qs: QuerySet[Job], q: str, before: int | None = None) -> QuerySet[Job]:
    return _searched(qs, q, before)[0]


def _searched(qs: QuerySet[Job], q: str, before: int | None) -> tuple[QuerySet[Job], int | None]:
    """The jobs matching the search, and the floor of the window it examined: a payload search
    looks at the SEARCH_WINDOW newest jobs below `before` (ids above the floor); None when the
    search is exact (an id or a unique key, on their indexes)."""
    q = q.strip()
    if q.isascii() and q.isdigit() and len(q) <= 18:  # an id that fits a bigint
        return qs.filter(Q(pk=int(q)) | Q(unique_key=q)), None
    if Job.objects.filter(unique_key=q).exists():  # one probe of its index: a key is exact
        return qs.filter(unique_key=q), None
    top = before - 1 if before else (Job.objects.aggregate(m=Max("id"))["m"] or 0)
    floor = top - SEARCH_WINDOW
    if q.startswith("{") and connection.features.supports_json_field_contains:
        try:
            wanted = json.loads(q)
        except (ValueError, RecursionError):
            wanted = None
        if isinstance(wanted, dict):
            if not _storable_json(wanted):  # NaN, 1e999, a NUL, "\ud800": no payload holds one
                return qs.none(), floor
            return qs.filter(pk__gt=floor, payload__contains=wanted), floor
    if connection.vendor == "postgresql" and q.isascii():
        found = _AsciiIContains(Cast("payload", TextField()), f"%{_like_escaped(q)}%")
        return qs.filter(found, pk__gt=floor), floor
    text = qs.annotate(payload_text=Cast("payload", TextField()))
    return text.filter(pk__gt=floor, payload_text__icontains=q), floor


@dataclass(frozen=True)
class JobPage:
    jobs: list[Job]
    next_before: int | None  # the keyset cursor of the next (older) page, None on the last
    # A bounded scan stopped before the page filled: what it searched, and where to go on.
    scanned: str = ""


def job_page(filters: dict[str, Any]) -> JobPage:
    """One page of jobs, newest first, after the `before` cursor, matching the filters. Bounded:
    one filter is served by its index; several examine at most SCAN_ROWS rows of the first."""
    ids = bounded_ids(filters)
    if ids is None:
        qs = filtered(filters, Job.objects.all())
        if filters.get("before"):
            qs = qs.filter(pk__lt=filters["before"])
    else:  # the search still needs every candidate; without one, a page of them is enough
        qs = Job.objects.filter(pk__in=ids if filters.get("q") else ids[: PAGE_SIZE + 1])
    floor = None
    if filters.get("q"):
        qs, floor = _searched(qs, filters["q"], filters.get("before"))
    rows = list(qs.order_by("-id").defer("payload", "result", "progress", "error")[: PAGE_SIZE + 1])
    more = len(rows) > PAGE_SIZE
    if more:
        return JobPage(rows[:PAGE_SIZE], rows[PAGE_SIZE - 1].pk)
    if ids is None and floor is not None and floor > 0:  # the window ended before the page did
        older = Job.objects.filter(pk__lte=floor).order_by("-id").values_list("pk", flat=True)
        below = older.first()
        if below is None:  # nothing older: the search is complete
            return JobPage(rows, None)
        searched = f"the newest {SEARCH_WINDOW:,} jobs for this text (older ones: next page)"
        if filters.get("before"):
            searched = f"{SEARCH_WINDOW:,} jobs below {filters['before']} for this text " + (
                "(older ones: next page)"
            )
        return JobPage(rows, below + 1, searched)  # the next window starts at an older job
    if ids is None:
        return JobPage(rows, None)
    drive = driver_of(filters)
    assert drive is not None
    beyond = drive[0].values_list("pk", flat=True)[SCAN_ROWS : SCAN_ROWS + 1]
    if not beyond:  # the driver held no more rows than the bound: the page is complete
        return JobPage(rows, None)
    searched = f"the newest {SCAN_ROWS:,} jobs with {drive[1]} (older ones: next page)"
    return JobPage(rows, beyond[0] + 1, searched)  # the next page: the first row not examined


def any_on_list(filters: dict[str, Any], ids: list[int]) -> bool:
    """Whether any of these jobs passes the list's filters and search (one query over them)."""
    if not ids:
        return False
    qs = filtered(filters, Job.objects.filter(pk__in=ids))
    if filters.get("q"):
        qs = _search(qs, filters["q"], filters.get("before"))
    return qs.exists()


def jobs_by_id(ids: list[int]) -> list[Job]:
    return list(Job.objects.filter(pk__in=ids).defer("payload", "result", "progress", "error"))


@dataclass
class JobDetail:
    job: Job
    attempts: list[Attempt]
    events: list[JobEvent]  # every boundary event (claims, expiries, commits, failures, ...)
    minor: list[tuple[int, str, datetime, int]]  # the newest minor ones, binned (minor_marks)
    log: list[JobEvent]  # the newest LOG_ROWS events, for the event log table
    rejected: list[RejectedWrite]
    events_total: int
    payload_json: str = ""
    result_json: str = ""
    effects: list[IdempotencyKey] = field(default_factory=list)
    outputs: list[StagedOutput] = field(default_factory=list)  # each with .shown_status
    intents: list[Intent] = field(default_factory=list)
    attempts_total: int = 0  # more than len(attempts) when only the newest are shown
    rejected_total: int = 0


@dataclass
class Newest:
    """The newest `limit` rows of a query, oldest first, and whether there were more."""

    rows: list[Any]
    more: bool
    query: QuerySet[Any]

    def total(self) -> int:
        return self.query.count() if self.more else len(self.rows)


def _newest(qs: QuerySet[Any], key: str, limit: int) -> Newest:
    """A job can have thousands of attempts, boundary events and rejected writes (a zombie's
    every beat is one): its page showed them all (3,000 attempts and 5,000 rejected writes, a
    3.7 MB page in 3.5 s). Its page now draws and lists the newest of each."""
    rows = list(qs.order_by(f"-{key}")[: limit + 1])
    return Newest(rows[:limit][::-1], len(rows) > limit, qs)


MINOR_LIMIT = 10_000  # heartbeats/checkpoints drawn (collapsed) on the timeline
ATTEMPT_ROWS = 100  # the newest attempts drawn and listed on a job's page
BOUNDARY_ROWS = 1_000  # the newest boundary events (claims, expiries, ...) it draws
REJECTED_ROWS = 200  # the newest rejected writes it draws and lists
LOG_ROWS = 50  # the job page's event log: the newest; older ones on job_events pages
EVENT_PAGE_ROWS = 100
EVENT_DATA_CHARS = 2_000  # of an event's data in the event log


def _with_data_text(events: QuerySet[JobEvent]) -> QuerySet[JobEvent]:
    """Events whose data is read as (the start of its) text, never decoded: a raw-SQL row
    nested past Python's limit, or holding a number of more than 4,300 digits, made the job's
    page and its events pages a 500; a data of megabytes made them that size."""
    text = Left(Cast("data", TextField()), EVENT_DATA_CHARS + 1)
    return events.defer("data").annotate(data_text=text)


SHOWN_JSON_CHARS = 64 * 1024  # of a payload or result on the job page


def _shown_json(text: str | None) -> str:
    """JSON as the database holds it, pretty-printed; cut, or raw, if it is huge or undecodable.

    Read as text and never decoded as a model field: a row inserted by raw SQL can hold JSON
    too large to render or too deep for Python to decode, and the page must still open.
    """
    if text is None or text == "null":
        return ""
    if len(text) >= SHOWN_JSON_CHARS:
        return f"{text}\n… (the first {SHOWN_JSON_CHARS:,} characters)"
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=True)
    except (ValueError, RecursionError):
        return text


def job_detail(job_id: int, now: datetime | None = None) -> JobDetail | None:
    job = (
        Job.objects.filter(pk=job_id)
        .defer("payload", "result", "progress")
        .annotate(
            payload_text=Left(Cast("payload", TextField()), SHOWN_JSON_CHARS),
            result_text=Left(Cast("result", TextField()), SHOWN_JSON_CHARS),
        )
        .first()
    )
    if job is None:
        return None
    attempts = _newest(Attempt.objects.filter(job_id=job_id), "number", ATTEMPT_ROWS)
    events_qs = JobEvent.objects.filter(job_id=job_id)
    # `rescued`: an expired event written by a rescue (its worker process died), read by the
    # database from the data that stays undecoded here (a raw-SQL row may hold anything).
    drawn = (
        events_qs.exclude(type__in=MINOR_TYPES)
        .defer("data")
        .annotate(rescued=RawSQL(rescued(connection.vendor, "jobs_jobevent"), []))
    )
    if attempts.more:  # the boundaries of the attempts shown (and of none: enqueued, ...)
        drawn = drawn.filter(Q(attempt__gte=attempts.rows[0].number) | Q(attempt__lt=1))
    boundaries = _newest(drawn, "id", BOUNDARY_ROWS)
    rejected = _newest(RejectedWrite.objects.filter(job_id=job_id), "id", REJECTED_ROWS)
    newest_minor = events_qs.filter(type__in=MINOR_TYPES).order_by("-id")[:MINOR_LIMIT]
    seen = newest_minor.aggregate(n=Count("id"), last=Max("at"))
    axis = timeline.bounds(
        attempts.rows, boundaries.rows, rejected.rows, now or timezone.now(), seen["last"]
    )
    minor = minor_marks(job_id, *axis) if axis and seen["n"] else []
    log = list(_with_data_text(events_qs).order_by("-id")[:LOG_ROWS])[::-1]
    total = (
        len(boundaries.rows) + seen["n"]
        if seen["n"] < MINOR_LIMIT and not (attempts.more or boundaries.more)
        else events_qs.count()
    )
    return JobDetail(
        job,
        attempts.rows,
        boundaries.rows,
        minor,
        log,
        rejected.rows,
        total,
        attempts_total=attempts.total(),
        rejected_total=rejected.total(),
        payload_json=_shown_json(job.payload_text),  # type: ignore[attr-defined]
        result_json=_shown_json(job.result_text),  # type: ignore[attr-defined]
        effects=list(
            IdempotencyKey.objects.filter(job_id=job_id)
            .defer("result")  # up to a payload's size each: only its start is shown
            .annotate(result_text=Left(Cast("result", TextField()), 200))
            .order_by("id")[:WRITE_ROWS]
        ),
        outputs=_outputs(job_id, {a.number: a.outcome for a in attempts.rows}),
        intents=list(
            Intent.objects.filter(job_id=job_id).defer("data").order_by("id")[:WRITE_ROWS]
        ),
    )


MinorBin = tuple[int, str, datetime, int]  # attempt, type, newest at, count


def minor_marks(job_id: int, start: datetime, end: datetime) -> list[MinorBin]:
    """The newest MINOR_LIMIT heartbeats/checkpoints of a job, counted per attempt, type and
    percent of the timeline's axis [start, end] -- the bins timeline.build draws -- as (attempt,
    type, newest at, count): the database groups them, so a job with thousands of beats sends a
    few hundred rows, not thousands. Elsewhere than PostgreSQL: one row per mark, count 1."""
    newest = JobEvent.objects.filter(job_id=job_id, type__in=MINOR_TYPES).order_by("-id")
    if connection.vendor != "postgresql":
        rows = newest.values_list("attempt", "type", "at")[:MINOR_LIMIT]
        return [(attempt, type_, at, 1) for attempt, type_, at in rows]
    sql, params = newest.values("attempt", "type", "at")[:MINOR_LIMIT].query.sql_with_params()
    span = max((end - start).total_seconds(), 0.001)  # as timeline._Axis places a mark
    # The percent in float8 (date_part, not extract: extract's numeric made this the page's
    # slowest statement, 16 ms for 5,000 beats): floor(round(p, 3)) is floor(p + 0.0005).
    place = "least(greatest(date_part('epoch', m.at - %s) / %s::float8, 0), 1) * 100"
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT m.attempt, m.type, max(m.at), count(*) FROM ({sql}) AS m "
            f"GROUP BY m.attempt, m.type, floor({place} + 0.0005)",
            [*params, start, span],
        )
        return [tuple(row) for row in cur.fetchall()]  # type: ignore[misc]


@dataclass(frozen=True)
class EventPage:
    events: list[JobEvent]  # newest first
    next_before: int | None  # the keyset cursor of the next (older) page, None on the last


def job_events(job_id: int, before: int | None) -> EventPage:
    """A page of a job's events older than `before` (an event id), newest first: one backward
    scan of jobs_event_job_idx (job_id, id) that stops after a page."""
    qs = _with_data_text(JobEvent.objects.filter(job_id=job_id))
    if before is not None:
        qs = qs.filter(pk__lt=before)
    rows = list(qs.order_by("-id")[: EVENT_PAGE_ROWS + 1])
    more = len(rows) > EVENT_PAGE_ROWS
    return EventPage(rows[:EVENT_PAGE_ROWS], rows[EVENT_PAGE_ROWS - 1].pk if more else None)


WRITE_ROWS = 200  # effects, staged outputs and intents shown per job


def _outputs(job_id: int, outcomes: dict[int, str]) -> list[StagedOutput]:
    """Staged outputs with what they are now: a `staged` row of a committed attempt is promoted
    (the janitor records that lazily), of an attempt that ended otherwise an orphan-to-be."""
    rows = list(StagedOutput.objects.filter(job_id=job_id).order_by("attempt", "id")[:WRITE_ROWS])
    for row in rows:
        shown = row.status
        if shown == StagedOutput.Status.STAGED:
            outcome = outcomes.get(row.attempt)
            if outcome == "succeeded" and not row.is_spare:  # a spare is never promoted
                shown = "promoted"
            elif outcome != "running":
                shown = "orphan (awaiting the janitor)"
        row.shown_status = shown  # type: ignore[attr-defined]
    return rows


def rejected_feed(limit: int = 100) -> list[RejectedWrite]:
    """The newest rejected writes with their job's kind: the job's JSON columns are never read
    (a raw-SQL row Python cannot decode must not take the feed down; they can be large)."""
    rows = RejectedWrite.objects.select_related("job").defer(
        "job__payload", "job__result", "job__progress", "job__error"
    )
    return list(rows.order_by("-id")[:limit])


def lateness(rejected: RejectedWrite, expired_at: dict[tuple[int, int], datetime]) -> float | None:
    """Seconds between the presented attempt's lease expiry and its rejected write."""
    when = expired_at.get((rejected.job_id, rejected.attempt_presented))
    return (rejected.at - when).total_seconds() if when else None


def expiries_for(rows: list[RejectedWrite]) -> dict[tuple[int, int], datetime]:
    """When each presented attempt lost its lease (its `expired` event), for "how late"."""
    wanted = Q()
    for r in rows:
        wanted |= Q(job_id=r.job_id, attempt=r.attempt_presented)
    if not rows:
        return {}
    events = JobEvent.objects.filter(wanted, type="expired").values_list("job_id", "attempt", "at")
    return {(j, a): at for j, a, at in events}


@dataclass
class Overview:
    by_state: dict[str, int]
    by_queue: dict[str, dict[str, int]]
    succeeded_per_min: list[int]
    failed_per_min: list[int]
    rejected_per_min: list[int]
    expired_running: int
    oldest_queued: datetime | None
    states: list[tuple[str, str]] = field(default_factory=lambda: list(JobState.choices))
    # When the newest HISTORY_EVENTS events begin, if that is inside the charts' SPARK_MINUTES:
    # the charts count nothing before it (a stream writes 50,000 events in seconds). Else None.
    history_since: datetime | None = None
    history_events: int = HISTORY_EVENTS
    queues_more: int = 0  # queues left out of by_queue (OVERVIEW_QUEUES)

    @property
    def queue_rows(self) -> list[tuple[str, dict[str, int]]]:
        """by_queue's (queue, counts), for the template: `by_queue.items` there is the key
        "items" first, so a queue of that name took the method's place."""
        return list(self.by_queue.items())


def _per_minute(counts: dict[datetime, int], now: datetime) -> list[int]:
    """Counts keyed by minute -> one value per minute of the last SPARK_MINUTES, oldest first."""
    ago = Counter({int((now - minute).total_seconds() // 60): n for minute, n in counts.items()})
    return [ago.get(m, 0) for m in range(SPARK_MINUTES - 1, -1, -1)]


def _minutes(qs: QuerySet[Any], start: datetime, **match: Any) -> dict[datetime, int]:
    """Rows per minute since `start` among the newest HISTORY_EVENTS ids (a pk range scan)."""
    top = qs.aggregate(m=Max("id"))["m"] or 0
    rows = (
        qs.filter(id__gt=top - HISTORY_EVENTS, at__gte=start, **match)
        .annotate(minute=TruncMinute("at"))
        .values("minute")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {r["minute"]: r["n"] for r in rows}


def _window_since(qs: QuerySet[Any], start: datetime) -> datetime | None:
    """When the newest HISTORY_EVENTS ids of `qs` begin, if a row the charts leave out (an older
    id) falls after `start` (three pk lookups). Ids have gaps (a rolled-back insert still took
    its id): the range alone holding rows only after `start` is no evidence of rows left out."""
    top = qs.aggregate(m=Max("id"))["m"] or 0
    if top <= HISTORY_EVENTS:
        return None
    left_out = qs.filter(id__lte=top - HISTORY_EVENTS).order_by("-id").values_list("at", flat=True)
    newest_left_out = left_out.first()
    if newest_left_out is None or newest_left_out < start:
        return None
    first = qs.filter(id__gt=top - HISTORY_EVENTS).order_by("id").values_list("at", flat=True)
    at = first.first()
    return at if at is not None and at > start else None


def _counts(qs: QuerySet[Job]) -> dict[tuple[str, str], int]:
    rows = qs.values_list("queue", "state").annotate(n=Count("id")).order_by()
    return {(queue, state): n for queue, state, n in rows}


def _live_counts() -> dict[tuple[str, str], int]:
    """Queued and running jobs, exact: each walks its own partial index (pick / lease)."""
    return _counts(Job.objects.queued()) | _counts(Job.objects.running())


TERMINAL_COUNTS_SECONDS = 10.0
_terminal: tuple[float, dict[tuple[str, str], int]] | None = None
_terminal_lock = threading.Lock()


def _terminal_counts() -> dict[tuple[str, str], int]:
    """Finished jobs by queue and state. Counting them scans the whole table (about 200 ms at a
    million rows), and they only ever grow, so one count serves this process for
    TERMINAL_COUNTS_SECONDS; queued and running counts are always exact."""
    global _terminal
    with _terminal_lock:
        if _terminal is None or time.monotonic() - _terminal[0] > TERMINAL_COUNTS_SECONDS:
            _terminal = (time.monotonic(), _counts(Job.objects.terminal()))
        return _terminal[1]


# Queues the overview's table lists: every queue name a job ever carried is a row (one per
# tenant, say), and the overview is pushed to every open one once a second -- 3,000 queues made
# each push 1.3 MB. The busiest are kept: most queued and running, then most jobs in all.
OVERVIEW_QUEUES = 100


def _busiest_queues(by_queue: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    live = (JobState.QUEUED, JobState.RUNNING)

    def rank(item: tuple[str, dict[str, int]]) -> tuple[int, int, str]:
        queue, counts = item
        return (-sum(counts.get(s, 0) for s in live), -sum(counts.values()), queue)

    return dict(sorted(sorted(by_queue.items(), key=rank)[:OVERVIEW_QUEUES]))


def overview(now: datetime | None = None) -> Overview:
    now = now or timezone.now()
    start = (now - timedelta(minutes=SPARK_MINUTES)).replace(second=0, microsecond=0)
    by_state: dict[str, int] = {}
    by_queue: dict[str, dict[str, int]] = {}
    for (queue, state), n in (_live_counts() | _terminal_counts()).items():
        by_state[state] = by_state.get(state, 0) + n
        by_queue.setdefault(queue, {})[state] = n
    oldest = Job.objects.due().order_by("run_at").values_list("run_at", flat=True).first()
    events = JobEvent.objects.all()
    shown = _busiest_queues(by_queue)
    return Overview(
        by_state,
        shown,
        _per_minute(_minutes(events, start, type="succeeded"), now),
        _per_minute(_minutes(events, start, type="failed"), now),
        _per_minute(_minutes(RejectedWrite.objects.all(), start), now),
        Job.objects.expired_leases().count(),
        oldest,
        history_since=_window_since(events, start),
        history_events=HISTORY_EVENTS,
        queues_more=len(by_queue) - len(shown),
    )


@dataclass
class Lease:
    job: Job
    worker: str
    attempt_heartbeat_at: datetime | None
    worker_last_seen: datetime | None

    @property
    def expired(self) -> bool:
        return self.job.lease_expires_at is not None and self.job.lease_expires_at < timezone.now()

    @property
    def zombie_suspect(self) -> bool:
        """The lease ran out, yet its worker was seen alive afterwards (other attempts beat)."""
        seen, lease = self.worker_last_seen, self.job.lease_expires_at
        return self.expired and seen is not None and lease is not None and seen > lease


@dataclass
class Workers:
    leases: list[Lease]
    workers: list[dict[str, Any]]  # worker, last_seen, holds (job ids)
    unresolved_expired: list[Attempt]  # expired attempts whose worker has not been heard since


RECENT_ATTEMPTS = 2_000  # workers are "live" if seen among the newest attempts


def workers(now: datetime | None = None) -> Workers:
    now = now or timezone.now()
    current = Attempt.objects.filter(job=OuterRef("pk"), number=OuterRef("attempt"))
    running = list(
        Job.objects.running()
        .annotate(
            worker=Subquery(current.values("worker")[:1]),
            attempt_beat=Subquery(current.values("heartbeat_at")[:1]),
        )
        .defer("payload", "result", "progress", "error")
        .order_by("lease_expires_at")[:500]
    )
    recent = Attempt.objects.filter(id__gt=(_max_id(Attempt) - RECENT_ATTEMPTS))
    seen = dict(
        recent.values("worker")
        .annotate(
            last=Max(
                Greatest(
                    "claimed_at",
                    Coalesce("heartbeat_at", "claimed_at"),
                    Coalesce("ended_at", "claimed_at"),
                )
            )
        )
        .order_by()
        .values_list("worker", "last")
    )
    leases = [
        Lease(j, j.worker or "", j.attempt_beat, seen.get(j.worker or ""))  # type: ignore[attr-defined]
        for j in running
    ]
    holds: dict[str, list[int]] = {}
    for lease in leases:
        holds.setdefault(lease.worker, []).append(lease.job.pk)
    table = [
        {"worker": w, "last_seen": at, "holds": holds.get(w, [])}
        for w, at in sorted(seen.items(), key=lambda kv: kv[1], reverse=True)
        if holds.get(w) or now - at < timedelta(minutes=5)
    ]
    return Workers(leases, table, _unresolved_expired(recent))


def _max_id(model: Any) -> int:
    return model.objects.aggregate(m=Max("id"))["m"] or 0


def _unresolved_expired(recent: QuerySet[Attempt]) -> list[Attempt]:
    """Expired attempts with no write of theirs recorded since: the worker may still be running.
    Not a rescued one: its worker process was seen dead by its cluster (no zombie can follow)."""
    expired = list(recent.filter(outcome="expired").order_by("-id")[:200])
    if not expired:
        return []
    jobs = {a.job_id for a in expired}
    heard = set(
        RejectedWrite.objects.filter(job_id__in=jobs).values_list("job_id", "attempt_presented")
    )
    died = {
        (job_id, attempt)
        for job_id, attempt, rescue in JobEvent.objects.filter(job_id__in=jobs, type="expired")
        .annotate(rescue=RawSQL(rescued(connection.vendor, "jobs_jobevent"), []))
        .values_list("job_id", "attempt", "rescue")
        if rescue
    }
    return [a for a in expired if (a.job_id, a.number) not in heard | died][:50]


def latest_event_id() -> int:
    return JobEvent.objects.aggregate(m=Max("id"))["m"] or 0
