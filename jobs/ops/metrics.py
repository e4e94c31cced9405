"""Prometheus metrics at /metrics, derived from the database at scrape time.

Owns: the catalogue (every metric name is declared once, in CATALOGUE), the collector, and the
view. Never: counts in memory what a worker did -- workers, schedulers and web servers are
separate processes (often separate hosts), so every number here is read from the job tables,
which every process writes. Any web process answers the same numbers (but after a prune: see
Hazards), and a restart loses nothing. (prometheus_client's multiprocess mode would need one
shared directory on one host and loses counts when a worker is SIGKILLed mid-write; the tables
already hold every event.)

Counters come from rows that are only ever added (events, rejected writes). A scrape must stay
cheap with millions of rows, so each process reads every row once: it keeps a running tally up
to the newest id it has read and, on each scrape, reads only the rows after it (a primary-key
range), so a scrape costs what was written since the last one, not the size of the table. An id
skipped over because its transaction had not committed yet is looked for again on later scrapes
(jobs/ops/history.py keeps that tally). The first scrape of a process reads the whole history
once (its cost at a million jobs is in docs/); rows older than SETTLE_SECONDS are then taken as
settled.

Gauges (queue depth, oldest due job, running and expired leases) are read live through partial
indexes. Extending: `register(source)` adds a callable returning metric families (see
`gauge_family`) to every scrape.

Hazards: deleting old rows (pruning jobs) makes a counter go down in a process that starts
after it (Prometheus reads the decrease as a counter reset, which rate() tolerates); a process
already running keeps the pruned events in its tally until every row it counted is gone, so
until it restarts, web processes differ by them (docs/operations.md, metrics).
"""

import hmac
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from jobs.core.conf import jobs_settings
from jobs.core.sql import driver_for
from jobs.core.sql import metrics as sql
from jobs.core.sql.operator import database_clock
from jobs.core.states import EventType, Write
from jobs.effects import outbox
from jobs.ops import history, queues
from jobs.ops.lease_hint import lease_hints

logger = logging.getLogger("jobs.metrics")

SETTLE_SECONDS = 10.0  # the first scrape of a process takes rows older than this as settled
MAX_QUEUE_LABELS = 100  # more queues than this are summed under queue="_other"
MAX_KIND_LABELS = 100  # jobs_lease_too_short: more kinds than this are one kind="_other"

ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 10)

CATALOGUE = {
    "jobs_stale_writes_rejected_total": "Fenced writes that changed zero rows, by write.",
    "jobs_claims_total": "Claims (each made a new attempt).",
    "jobs_reclaims_total": (
        "Attempts reclaimed: leases the reaper found expired, and rescues of the jobs of a "
        "worker process seen dead (their expired event's data says worker_exited)."
    ),
    "jobs_succeeded_total": "Jobs committed as succeeded.",
    "jobs_failed_total": "Jobs that ended failed (last attempt failed or expired, or poisoned).",
    "jobs_effects_deduplicated_total": "Effects not performed again: the sum of repeats.",
    "jobs_mail_resent_total": "Mails sent again under one key: detected possible duplicates.",
    "jobs_orphaned_outputs": "Staged outputs found orphaned (JobEvent rows of type orphaned).",
    "jobs_running_expired_leases": "Running jobs whose lease has run out, not yet reclaimed.",
    "jobs_queue_depth": "Queued jobs, by queue (due now or later).",
    "jobs_queue_oldest_age_seconds": "How long the oldest due job of a queue has waited.",
    "jobs_running": "Jobs running now.",
    "jobs_outbox_pending_intents": "Intents waiting for the relay (pending or being performed).",
    "jobs_outbox_oldest_pending_age_seconds": "Age of the oldest intent not yet performed.",
    "jobs_outbox_relay_reperforms_total": "Intents the relay took up again after an earlier claim.",
    "jobs_outbox_reconciliation_mismatches_total": "Intents decided by a target's reconciliation.",
    "jobs_outbox_failed_intents": "Intents that ended failed after their retries.",
    "jobs_events_total": "Job events, by type.",
    "jobs_attempts_per_success": "Attempts a job took to succeed.",
    "jobs_wasted_work_seconds_total": "Runtime of attempts whose commit was rejected.",
    "jobs_heartbeat_gap_seconds": (
        "Longest silence without an accepted beat, from the claim, per ended attempt (one never "
        "beaten only if reclaimed); a reclaim counts the silence up to it: a lease's expiry, or "
        "a rescue of a dead worker process (its expired event says worker_exited)."
    ),
    "jobs_reclaim_latency_seconds": (
        "Lease expiry to the next claim of that job (rescues, reclaimed before their lease "
        "ran out, are left out)."
    ),
    "jobs_enqueue_to_start_seconds": "Job due (enqueued or run_at) to its first claim.",
    "jobs_lease_too_short": "1 for a kind whose recent heartbeat gaps approach its lease.",
    "jobs_metrics_malformed_events_total": "Event rows left out of a figure: a value unreadable.",
    "jobs_metrics_scrape_seconds": "Time this scrape took to collect (almost all of it queries).",
    "jobs_queue_paused": "1 for a queue an operator paused (claims skip it).",
    "jobs_queue_concurrency_limit": "A queue's limit of jobs running at once, across clusters.",
    "jobs_queue_running": "Jobs running now, by queue.",
}


_lock = threading.Lock()
_event_tally = history.Incremental("jobs_jobevent", history.events)
_rejection_tally = history.Incremental("jobs_rejectedwrite", history.rejections)


def _outbox() -> Iterable[Metric]:
    """The outbox relay's figures (jobs.effects.outbox.counts, read from jobs_intent)."""
    c = outbox.counts()
    yield _gauge("jobs_outbox_pending_intents", c["pending_intents"])
    yield _gauge("jobs_outbox_oldest_pending_age_seconds", c["oldest_pending_age_seconds"])
    yield _counter("jobs_outbox_relay_reperforms_total", c["relay_reperforms"])
    yield _counter("jobs_outbox_reconciliation_mismatches_total", c["reconciliation_mismatches"])
    yield _gauge("jobs_outbox_failed_intents", c["failed_intents"])


def _queue_controls() -> Iterable[Metric]:
    """Paused queues, limits and running jobs per queue (jobs.ops.queues), at most
    MAX_QUEUE_LABELS queues each: paused and limited by name, running the most first. Each family
    is capped on its own: cut from the controlled queues by name, the first hundred limited
    queues left no series to a paused queue named after them."""
    controls = queues.controls().items()
    paused = [q for q, c in controls if c.paused][:MAX_QUEUE_LABELS]
    limits = [(q, c.limit) for q, c in controls if c.limit][:MAX_QUEUE_LABELS]
    running = dict(list(queues.running().items())[:MAX_QUEUE_LABELS])
    for name, values in (
        ("jobs_queue_paused", dict.fromkeys(paused, 1.0)),
        ("jobs_queue_concurrency_limit", dict(limits)),
        ("jobs_queue_running", running),
    ):
        yield gauge_family(name, CATALOGUE[name], values, "queue")


_sources: list[Callable[[], Iterable[Metric]]] = [_outbox, _queue_controls]


def register(source: Callable[[], Iterable[Metric]]) -> None:
    """Add metric families to every scrape (e.g. outbox counts); declare names in CATALOGUE."""
    if source not in _sources:
        _sources.append(source)


def gauge_family(name: str, doc: str, values: Mapping[str, float], label: str) -> Metric:
    """One gauge with a label per key: `gauge_family("jobs_outbox", "...", counts(), "status")`."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([str(key)], float(value))
    return family


def _counter(name: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name.removesuffix("_total"), CATALOGUE[name], value=value)


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, CATALOGUE[name], value=value)


def _histogram(hist: history.Hist, name: str, bounds: Sequence[float]) -> HistogramMetricFamily:
    points = [(repr(float(b)), float(n)) for b, n in zip(bounds, hist.buckets, strict=True)]
    return HistogramMetricFamily(
        name, CATALOGUE[name], buckets=[*points, ("+Inf", float(hist.count))], sum_value=hist.total
    )


def _success_histogram(counts: Counter[int]) -> HistogramMetricFamily:
    cumulative = [sum(n for a, n in counts.items() if a <= b) for b in ATTEMPT_BUCKETS]
    total = sum(counts.values())
    hist = history.Hist(cumulative, total, float(sum(a * n for a, n in counts.items())))
    return _histogram(hist, "jobs_attempts_per_success", ATTEMPT_BUCKETS)


def _queue_families(rows: list[tuple[str, int, float | None]]) -> list[Metric]:
    # Configured queues (and "default") are always present, at 0 when empty: an alert on a
    # missing series is easy to get wrong. They are kept beside the MAX_QUEUE_LABELS fullest
    # others, never summed into "_other": with more queues than that, an empty `default` (or a
    # configured queue whose one job has waited an hour) lost its series, and its alert went quiet.
    known = set(jobs_settings().QUEUES or ()) | {"default"}
    found = {r[0]: r for r in rows}
    always = [found.get(q, (q, 0, None)) for q in sorted(known)]
    others = sorted((r for r in rows if r[0] not in known), key=lambda r: (-r[1], r[0]))
    kept, rest = always + others[:MAX_QUEUE_LABELS], others[MAX_QUEUE_LABELS:]
    if rest:
        ages = [r[2] for r in rest if r[2] is not None]
        kept.append(("_other", sum(r[1] for r in rest), max(ages) if ages else None))
    depth = GaugeMetricFamily("jobs_queue_depth", CATALOGUE["jobs_queue_depth"], labels=["queue"])
    age_name = "jobs_queue_oldest_age_seconds"
    age = GaugeMetricFamily(age_name, CATALOGUE[age_name], labels=["queue"])
    for queue, n, oldest in kept:
        depth.add_metric([queue], n)
        age.add_metric([queue], max(0.0, oldest or 0.0))
    return [depth, age]


def _lease_family() -> Metric:
    """jobs_lease_too_short for at most MAX_KIND_LABELS kinds, those too short first: a kind is
    whatever a row holds (raw SQL can plant thousands, each failed once), and one series per
    kind of the last 10,000 attempts made a scrape as large as that. The rest: kind="_other"."""
    hints = sorted(lease_hints(), key=lambda h: (not h.too_short, h.kind))
    values = {h.kind: 1.0 if h.too_short else 0.0 for h in hints[:MAX_KIND_LABELS]}
    if hints[MAX_KIND_LABELS:]:
        values["_other"] = max(1.0 if h.too_short else 0.0 for h in hints[MAX_KIND_LABELS:])
    return gauge_family("jobs_lease_too_short", CATALOGUE["jobs_lease_too_short"], values, "kind")


def collect_families() -> list[Metric]:
    """Every metric family of one scrape (all from the database)."""
    started = time.perf_counter()
    driver = driver_for(connection.vendor)
    cutoff = database_clock() - timedelta(seconds=SETTLE_SECONDS)
    with _lock:
        tally = _event_tally.total(cutoff) + _rejection_tally.total(cutoff)
    with connection.cursor() as cur:
        queue_rows = sql.queues(driver, cur)
        running, expired = sql.running(driver, cur)
        deduplicated = sql.effects_deduplicated(cur)
    ev = tally.events
    rejected = CounterMetricFamily(
        "jobs_stale_writes_rejected",
        CATALOGUE["jobs_stale_writes_rejected_total"],
        labels=["write"],
    )

    for write in Write.values:
        rejected.add_metric([write], tally.rejected.get(write, 0))
    events = CounterMetricFamily("jobs_events", CATALOGUE["jobs_events_total"], labels=["type"])
    for kind in sorted(set(EventType.values) | set(ev)):
        events.add_metric([kind], ev.get(kind, 0))
    families: list[Metric] = [
        rejected,
        _counter("jobs_claims_total", ev["claimed"]),
        _counter("jobs_reclaims_total", ev["expired"]),
        _counter("jobs_succeeded_total", ev["succeeded"]),
        _counter("jobs_failed_total", ev["failed"] + ev["poisoned"]),
        _counter("jobs_effects_deduplicated_total", deduplicated),
        _counter("jobs_mail_resent_total", ev["mail_resent"]),
        _gauge("jobs_orphaned_outputs", ev["orphaned"]),
        _gauge("jobs_running_expired_leases", expired),
        _gauge("jobs_running", running),
        *_queue_families(queue_rows),
        events,
        _success_histogram(tally.success_attempts),
        _counter("jobs_wasted_work_seconds_total", tally.wasted),
        _histogram(tally.gaps, "jobs_heartbeat_gap_seconds", history.GAP_BUCKETS),
        _histogram(tally.reclaims, "jobs_reclaim_latency_seconds", history.RECLAIM_BUCKETS),
        _histogram(tally.starts, "jobs_enqueue_to_start_seconds", history.START_BUCKETS),
        _counter("jobs_metrics_malformed_events_total", tally.malformed),
    ]

    families.append(_lease_family())
    for source in _sources:
        families.extend(source())
    families.append(_gauge("jobs_metrics_scrape_seconds", time.perf_counter() - started))
    return families


class _DatabaseCollector(Collector):
    def collect(self) -> Iterable[Metric]:
        return collect_families()


def render() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DatabaseCollector())
    return generate_latest(registry)


def _token() -> str:
    return str(
        getattr(settings, "JOBS_METRICS_TOKEN", "") or os.environ.get("JOBS_METRICS_TOKEN", "")
    )


def allowed(request: HttpRequest) -> bool:
    """A bearer token (JOBS_METRICS_TOKEN), or a logged-in staff user."""
    token = _token()
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and getattr(user, "is_staff", False))


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        response = HttpResponse("metrics need a bearer token or a staff login\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(render(), content_type="text/plain; version=0.0.4; charset=utf-8")
