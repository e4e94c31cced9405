"""One receiver is one lane however its URL is spelled: the lane is stored with the intent by the
commit (jobs.core.lanes), the relay's claim leaves a full lane out by equality on it, and the
relay counts its calls in flight by the same value -- so a hanging receiver spelled four ways
holds two of the relay's eight slots, not all of them. A URL that cannot be parsed is a lane of
its own and never fails a batch-mate's commit; 0024 fills the lane of rows it finds."""

import importlib
import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command
from django.db import connection

import jobs
from jobs.context import Held, JobContext
from jobs.core import transitions
from jobs.core.lanes import UNPARSED
from jobs.effects import outbox, relay
from jobs.models import Intent, Job
from jobs.worker import completer
from jobs.worker.heartbeat import Finished
from tests.integration.attempts import claim
from tests.integration.test_claim_plans import near, pages
from tests.slow_receivers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = [  # one receiver, four spellings
    "http://dead.example/hook",
    "HTTP://dead.example/hook",
    "http://dead.example:80/hook",
    "http://relay@DEAD.example./hook",
]
HEALTHY = "http://healthy.example/hook"
DEAD_LANE = "webhook http://dead.example"


def _commit_intents(target: str, urls: list[str]) -> list[str]:
    """One job whose commit records one intent per URL; their keys."""
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    for n, url in enumerate(urls):
        running.ctx.intent(f"s{n}", target, {"url": url, "json": {}})
    running.commit(None)
    return [f"{job.pk}:s{n}" for n in range(len(urls))]


def _plant_one_receiver_spelled_four_ways(target: str) -> str:
    """Two intents per spelling of the dead receiver, then one for the healthy one (last in
    claim order); the healthy one's key."""
    _commit_intents(target, DEAD * 2)
    (healthy,) = _commit_intents(target, [HEALTHY])
    return healthy


class _HangingOnOneHost:
    """A target whose calls to one host hang until released; every other call returns at once."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.hanging = 0
        self.performed: list[str] = []

    def perform(self, key: str, data: Any, token: int) -> None:
        if (urlsplit(data["url"]).hostname or "").rstrip(".") == self.host:
            with self.lock:
                self.hanging += 1
            self.release.wait(30)
        with self.lock:
            self.performed.append(key)


def test_a_receiver_spelled_four_ways_holds_only_its_own_two_slots():
    # Before: http://h, HTTP://h, http://h:80 and http://user@h. were four lanes, so eight calls
    # to the one hanging receiver took all eight of the relay's threads and the healthy
    # receiver's intent was never claimed.
    target = _HangingOnOneHost("dead.example")
    outbox.register_target("test.hanging-lanes", target)
    healthy = _plant_one_receiver_spelled_four_ways("test.hanging-lanes")
    pool = relay.Relay("relay-a")  # THREADS = 8, PER_LANE = 2
    try:
        deadline = time.monotonic() + 5
        while healthy not in target.performed:
            assert time.monotonic() < deadline, "the healthy receiver waited for the dead one"
            if not pool.pump():
                pool.freed.wait(0.05)  # until a call ends, or the next look
        wait_for(lambda: sum(pool.in_flight().values()) == 2, 5, "the healthy call never ended")
        assert pool.in_flight() == {"test.hanging-lanes http://dead.example": 2}
        # A call is in flight from its claim on; its thread reaches perform() a moment later.
        wait_for(lambda: target.hanging == 2, 5, "the dead receiver's two calls never began")
        assert pool.pump() == 0  # the dead lane is full under every spelling
    finally:
        target.release.set()
        wait_for(lambda: not pool.in_flight(), 10, "a released call never ended")


def test_a_full_lane_is_left_out_of_the_claim_under_every_spelling():
    healthy = _plant_one_receiver_spelled_four_ways("webhook")
    taken = outbox.claim("relay-a", limit=8, per_lane=2, busy={DEAD_LANE: 2})
    assert [(c.key, c.lane) for c in taken] == [(healthy, "webhook http://healthy.example")]


def test_a_claim_takes_at_most_per_lane_of_one_receiver_spelled_four_ways():
    healthy = _plant_one_receiver_spelled_four_ways("webhook")
    taken = outbox.claim("relay-a", limit=8, per_lane=2)
    assert [c.lane for c in taken].count(DEAD_LANE) == 2
    assert healthy in [c.key for c in taken] and len(taken) == 3


class _AnyData:
    """A target of the application's that checks nothing at `ctx.intent()` (the webhook refuses
    a URL it could never call there: test_outbox.py)."""

    def perform(self, key: str, data: Any, token: int) -> None:
        pass


def test_the_batch_commit_stores_each_intents_lane_and_a_bad_url_fails_no_batch_mate():
    outbox.register_target("test.any-data", _AnyData())
    spellings = {
        "HTTP://Ops:secret@Dead.Example.:80/x": "test.any-data http://dead.example",
        "http://dead.example:99999/x": f"test.any-data {UNPARSED}",  # a bad port
        "http://[::1/x": f"test.any-data {UNPARSED}",  # a bad address
    }
    for _ in range(len(spellings) + 1):
        jobs.enqueue("test.echo")
    claimed = transitions.claim("host-a:1", limit=len(spellings) + 1, lease_seconds=30)
    finished, expected = [], {}
    rows = [*spellings.items(), (None, "test.any-data")]
    for c, (url, named) in zip(claimed, rows, strict=True):
        held = Held(c.fence, 30)
        data = {"json": {}} if url is None else {"url": url, "json": {}}
        JobContext(held, c.kind, c.payload).intent("publish", "test.any-data", data)
        finished.append(Finished(held, c, None, time.monotonic()))
        expected[c.fence.job_id] = named
    completer.commit(finished)
    assert set(Job.objects.values_list("state", flat=True)) == {"succeeded"}
    assert dict(Intent.objects.values_list("job_id", "lane")) == expected


def test_a_row_planted_through_the_orm_gets_its_lane():
    job = jobs.enqueue("test.echo")
    common = {"job": job, "attempt": 1, "target": "webhook"}
    Intent.objects.create(step="a", key=f"{job.pk}:a", data={"url": DEAD[1]}, **common)
    Intent.objects.bulk_create(
        [Intent(step="b", key=f"{job.pk}:b", data={"url": DEAD[3]}, **common)]
    )
    assert set(Intent.objects.values_list("lane", flat=True)) == {DEAD_LANE}


class _Decoy(dict):
    """A handler's dict whose items() -- what json encodes, so what is stored and called --
    name one receiver, while its own storage names another origin for every intent."""

    def __init__(self, real: str, n: int) -> None:
        super().__init__(url=f"http://decoy-{n}.example/", json={})
        self.real = real

    def items(self):  # type: ignore[override]
        return [("url", self.real), ("json", {})]


def test_the_lane_is_named_from_the_data_as_stored_not_from_the_handlers_object():
    # Before, the lane was read from the live object while its JSON text was stored: each of
    # these intents got a decoy lane of its own, so one hanging receiver, called by all of
    # them, could take every slot of the relay.
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    for n in range(3):
        running.ctx.intent(f"s{n}", "webhook", _Decoy(DEAD[n], n))
    running.commit(None)
    rows = list(Intent.objects.values_list("data", "lane"))
    assert {data["url"] for data, _ in rows} == {DEAD[0], DEAD[1], DEAD[2]}
    assert {lane for _, lane in rows} == {DEAD_LANE}


def _intent_columns() -> set[str]:
    with connection.cursor() as cur:
        return {c.name for c in connection.introspection.get_table_description(cur, "jobs_intent")}


def test_the_migration_fills_the_lane_of_the_intents_it_finds_and_goes_back(monkeypatch):
    migration = importlib.import_module("jobs.migrations.0024_intent_lane")
    monkeypatch.setattr(migration, "CHUNK", 2)  # several chunks from five rows
    rows = {
        "a": ("webhook", {"url": DEAD[0]}, DEAD_LANE),
        "b": ("webhook", {"url": DEAD[2]}, DEAD_LANE),
        "c": ("webhook", {"url": HEALTHY}, "webhook http://healthy.example"),
        "d": ("webhook", {"url": 5}, f"webhook {UNPARSED}"),
        "e": ("mail", {"to": "ops@example.com"}, "mail"),
    }
    job = Job.objects.create(kind="test.echo")
    try:
        call_command("migrate", "jobs", "0023", verbosity=0)
        assert "lane" not in _intent_columns()
        with connection.cursor() as cur:
            for step, (target, data, _) in rows.items():
                cur.execute(
                    "INSERT INTO jobs_intent (job_id, attempt, step, key, target, data) "
                    "VALUES (%s, 1, %s, %s, %s, %s::jsonb)",
                    [job.pk, step, f"{job.pk}:{step}", target, json.dumps(data)],
                )
        call_command("migrate", "jobs", "0024", verbosity=0)
    finally:
        call_command("migrate", "jobs", verbosity=0)
    assert dict(Intent.objects.values_list("step", "lane")) == {
        step: named for step, (_, _, named) in rows.items()
    }


BACKLOG = 20_000


def _plant_backlog(lane_name: str, n: int = BACKLOG) -> None:
    """`n` due intents in one lane, older than everything else (a hanging receiver's backlog)."""
    job = Job.objects.create(kind="test.echo")
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs_intent (job_id, attempt, step, key, target, lane, data, next_try_at) "
            "SELECT %s, 1, 'b' || g, %s || ':b' || g, 'webhook', %s, "
            "jsonb_build_object('url', 'http://dead.example/hook', 'json', repeat('x', 500)), "
            "clock_timestamp() - interval '1 hour' + g * interval '1 ms' "
            "FROM generate_series(1, %s) g",
            [job.pk, str(job.pk), lane_name, n],
        )
        cur.execute("ANALYZE jobs_intent")


def test_a_full_lanes_backlog_costs_the_claim_nothing():
    # Before jobs_intent_open_lane_idx, every pump of a relay walked a hanging receiver's whole
    # backlog to leave it out (here 1,800 pages against 5; 100,000 queued: 30 ms a pump, 150 ms when
    # the lane was a prefix match on data->>'url').
    def relay_claim() -> None:
        taken = outbox.claim("relay-a", limit=8, per_lane=2, busy={DEAD_LANE: 2})
        assert len(taken) == 3 and DEAD_LANE not in {c.lane for c in taken}
        Intent.objects.filter(pk__in=[c.id for c in taken]).update(state="pending")  # due again

    _commit_intents("webhook", [HEALTHY])
    _plant_backlog("webhook http://other.example", 3)  # another lane, due: two of it are taken
    baseline = pages(relay_claim, "SKIP LOCKED")
    _plant_backlog(DEAD_LANE)
    loaded = pages(relay_claim, "SKIP LOCKED")
    assert loaded <= near(baseline), (baseline, loaded)
