"""The drain's hot path does less per job without giving up a fence (issue 20, the drain).

- The claim and the commit run as prepared statements with a generic plan (planned once per
  connection, at their first run: no custom plans first, and one claim text whatever its batch
  size), on Django's own connection, whose other cursors prepare nothing;
  JOBS["PREPARED_STATEMENTS"] = False (or JOBS_PREPARED_STATEMENTS=0) turns it off. The session
  setting that plans them once is not made where Django binds on the server, nor through a
  pooler.
  A stale presentation through the prepared commit is still rejected and recorded.
- No redundant single-column job_id index on jobs_attempt / jobs_jobevent (migration 0016).
- An idle drain keeps what its next claim must know fresh while it waits, so the claim a NOTIFY
  wakes it for is one round trip.
- The commit (and the heartbeat) carry their rows as arrays: one statement text, so one prepared
  statement, whatever the batch size.
- A handler's result is encoded once, by its check; the commit sends that text as it is, its
  arrays in binary where the cursor binds on the server.
- The hot statements are planned again as the process's statement count grows
  (jobs/core/sql/plans.py): a commit first planned on a tiny jobs_attempt reads its attempt rows
  by index once the table has grown, not the whole table on every batch.
"""

import itertools
import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import jobs
from jobs.core import bounds, transitions
from jobs.core.sql import plans, rows
from jobs.core.states import JobState
from jobs.core.transitions import fence
from jobs.core.transitions import worker as transitions_worker
from jobs.core.transitions.fence import HOT_PREPARED_MAX
from jobs.models import Job, RejectedWrite
from jobs.worker import runner

pytestmark = pytest.mark.django_db(transaction=True)

W = "host-a:1"


def _prepared() -> list[tuple[int, int, str]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT generic_plans, custom_plans, statement FROM pg_prepared_statements "
            "ORDER BY prepare_time"
        )
        return list(cur.fetchall())


def _drain(n: int, batch: int, rounds: int | None = None) -> None:
    """N queued jobs; claim and commit `batch` at a time, `rounds` times (default: all)."""
    Job.objects.bulk_create([Job(kind="demo.noop", payload={}) for _ in range(n)])
    with connection.cursor() as cur:
        cur.execute("ANALYZE jobs_job")  # as the benchmark does: estimates of a deep queue
    for _ in range(rounds if rounds is not None else n // batch + 1):
        claimed = transitions.claim(W, limit=batch, lease_seconds=30)
        if not claimed:
            break
        assert transitions.commit_many([(c.fence, {"ok": 1}, "") for c in claimed]) == []


@pytest.fixture
def fresh_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's plan generation starts again at 0 (as in a fresh worker process)."""
    monkeypatch.setattr(plans, "_calls", itertools.count(1))
    monkeypatch.setattr(plans, "_start", time.monotonic())


def test_claim_and_commit_are_prepared_with_a_generic_plan(fresh_plans: None) -> None:
    connection.close()  # a fresh connection: nothing prepared yet
    # A queue deep enough for the planner's estimates to matter: 20 claims and commits of 4.
    _drain(3000, 4, rounds=20)
    statements = {s.split("AS (")[0].split()[-1]: (g, c) for g, c, s in _prepared()}
    # the claim opens with `promoted`, the commit with `done`
    assert set(statements) >= {"promoted", "done"}, statements
    for name in ("promoted", "done"):
        generic, custom = statements[name]
        # Planned once, at its first execution (jobs.core.transitions.fence._plan_once): by
        # default PostgreSQL makes a custom plan for each of a statement's first five runs.
        assert generic == 19 and custom == 0, (name, generic, custom)  # run 1: unnamed
    assert Job.objects.filter(state="succeeded").count() == 80


def test_a_drains_claims_are_one_statement_whatever_their_batch_size() -> None:
    """A drain's batch grows 1, 2, 4, ... as it starts: one text for every size, so one
    prepared statement, planned once -- not a text (and plans) per size."""
    connection.close()
    Job.objects.bulk_create([Job(kind="demo.noop", payload={}) for _ in range(40)])
    for size in (1, 2, 4, 8, 16):
        claimed = transitions.claim(W, limit=size, lease_seconds=30)
        assert len(claimed) == size
        assert transitions.commit_many([(c.fence, None, "") for c in claimed]) == []
    claims = [(g, c) for g, c, s in _prepared() if "jobs_pick" in s]
    assert claims == [(4, 0)]  # prepared at its second run: the first ran unnamed


def _plan_cache_mode() -> str:
    with connection.cursor() as cur:
        cur.execute("SHOW plan_cache_mode")
        return str(cur.fetchone()[0])


def test_planned_once_only_where_the_application_sends_no_parameters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The setting is the session's: not where Django's cursors bind on the server (the
    application's statements would get generic plans too), nor where prepared statements are
    off."""
    connection.close()
    Job.objects.bulk_create([Job(kind="demo.noop", payload={}) for _ in range(4)])
    assert transitions.claim(W, limit=1, lease_seconds=30)
    assert _plan_cache_mode() == "force_generic_plan"
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {"server_side_binding": True})
    assert transitions.claim(W, limit=1, lease_seconds=30)
    assert _plan_cache_mode() == "auto"
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {})
    connection.close()
    monkeypatch.setattr(fence, "_plan_once", lambda conn, raw: pytest.fail("not prepared"))
    jobs_off = {"PREPARED_STATEMENTS": False}
    monkeypatch.setattr(fence, "jobs_settings", lambda: type("S", (), jobs_off)())
    assert transitions.claim(W, limit=1, lease_seconds=30)
    assert _plan_cache_mode() == "auto"


def test_not_planned_once_through_a_pooler() -> None:
    """Behind a pooler the session is a shared server connection: the setting would stay on it
    for other clients. A pooler answers the start-up itself with a pid of its own; the setting
    is made only where the server's pid is the one the start-up gave."""
    connection.close()
    connection.ensure_connection()
    raw = connection.connection

    class Pooled:  # the start-up's pid as a pooler makes it up
        info = type("Info", (), {"backend_pid": raw.info.backend_pid + 1})()
        execute = raw.execute

    fence._plan_once(connection, Pooled())
    assert _plan_cache_mode() == "auto"
    fence._plan_once(connection, raw)
    assert _plan_cache_mode() == "force_generic_plan"


def test_other_cursors_of_the_connection_prepare_nothing() -> None:
    connection.close()
    _drain(8, 4)
    before = len(_prepared())
    assert before >= 2
    assert connection.connection.prepare_threshold is None  # Django's default, restored
    for _ in range(10):
        Job.objects.filter(kind="nothing").count()
    assert len(_prepared()) == before


def test_prepared_statements_can_be_turned_off(settings) -> None:  # type: ignore[no-untyped-def]
    settings.JOBS = {**getattr(settings, "JOBS", {}), "PREPARED_STATEMENTS": False}
    connection.close()
    _drain(40, 4)
    assert _prepared() == []


def test_the_commit_sends_its_arrays_in_binary_where_the_cursor_binds_on_the_server(
    settings,  # type: ignore[no-untyped-def]
) -> None:
    # Binary: no quoting scan of every result and ref on the client, no text parsing on the
    # server. Django's client-side binding cursor (prepared statements off) cannot send binary:
    # there the arrays go as text, and the commit works the same.
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        seen.append(sql)
        return execute(sql, params, many, context)

    def commits_of_a_drain() -> list[str]:
        seen.clear()
        connection.close()
        with connection.execute_wrapper(wrapper):
            _drain(8, 4)
        return [s for s in seen if "WITH done AS" in s]

    commits = commits_of_a_drain()
    assert commits and all("%(results)b::text[]" in s and "%(ids)b" in s for s in commits)
    settings.JOBS = {**getattr(settings, "JOBS", {}), "PREPARED_STATEMENTS": False}
    commits = commits_of_a_drain()
    assert commits and all("%(results)s::text[]" in s and "%(ids)s" in s for s in commits)
    assert Job.objects.filter(state="succeeded").count() == 16


def test_a_stale_commit_through_the_prepared_statement_is_rejected() -> None:
    connection.close()
    _drain(40, 4)  # the commit statement is prepared by now
    job = Job.objects.create(kind="demo.noop", payload={})
    (first,) = transitions.claim(W, limit=1, lease_seconds=30)
    assert first.fence.job_id == job.pk
    transitions.release(first.fence)
    (second,) = transitions.claim("host-b:2", limit=1, lease_seconds=30)
    assert second.fence.attempt == first.fence.attempt + 1
    rejected = transitions.commit_many([(first.fence, {"zombie": True}, "")])
    assert rejected == [first.fence]
    assert RejectedWrite.objects.filter(job=job, attempt_presented=first.fence.attempt).exists()
    job.refresh_from_db()
    assert (job.state, job.result) == ("running", None)
    assert transitions.commit_many([(second.fence, {"ok": 2}, "")]) == []
    job.refresh_from_db()
    assert (job.state, job.result) == ("succeeded", {"ok": 2})


def _attempt_seq_scans() -> int:
    """Sequential scans of jobs_attempt so far (this backend's counts flushed first)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'jobs_attempt'")
        return int(cur.fetchone()[0])


def _rounds(n: int, batch: int = 8) -> None:
    for _ in range(n):
        claimed = transitions.claim(W, limit=batch, lease_seconds=30)
        assert len(claimed) == batch
        assert transitions.commit_many([(c.fence, None, "") for c in claimed]) == []


@pytest.mark.parametrize("pinned", [False, True], ids=["replanned", "pinned"])
def test_the_commit_is_planned_again_once_jobs_attempt_has_grown(
    fresh_plans: None, monkeypatch: pytest.MonkeyPatch, pinned: bool
) -> None:
    if pinned:  # what every release before plans.py did: one plan for the connection's life
        monkeypatch.setattr(plans, "tag", lambda: "")
    connection.close()
    Job.objects.bulk_create([Job(kind="demo.noop", payload={}) for _ in range(3000)])
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE jobs_job, jobs_attempt")  # a deep queue, no attempts yet
    _rounds(10)  # 20 statements: the commit's generic plan is made while jobs_attempt is tiny
    _rounds(150)  # 320 statements in all: the generation moved on at 64 and 256 (1,200 attempts)
    before = _attempt_seq_scans()
    _rounds(40)
    scans = _attempt_seq_scans() - before
    if pinned:
        # the plan made for 40 rows reads all 1,300-1,600 rows on each of the 40 commits
        assert scans >= 40, scans
    else:
        assert scans == 0, scans
    assert Job.objects.filter(state="succeeded").count() == 200 * 8


def test_plan_generations() -> None:
    assert plans.generation(1, 0.0) == (0, 0)
    assert plans.generation(63, 3599.0) == (0, 0)
    assert plans.generation(64, 0.0) == (1, 0)
    assert plans.generation(255, 0.0) == (1, 0)
    assert plans.generation(256, 3600.0) == (2, 1)
    assert plans.generation(10**9, 3 * 3600.0)[1] == 3
    assert plans.tag().lstrip().startswith("/* plan ") and plans.tag().endswith("*/")


def test_a_connection_keeps_a_bounded_number_of_prepared_statements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each plan generation prepares the hot texts again; the older ones are deallocated."""
    connection.close()
    Job.objects.bulk_create([Job(kind="demo.noop", payload={}) for _ in range(1200)])
    counts = []
    for generation in range(24):
        monkeypatch.setattr(plans, "tag", lambda g=generation: f"\n/* plan test.{g} */")
        for size in (1, 2, 4, 8):  # each text four times: prepared on its second run
            claimed = transitions.claim(W, limit=size, lease_seconds=30)
            assert transitions.commit_many([(c.fence, None, "") for c in claimed]) == []
        counts.append(len(_prepared()))
    # one claim whatever the batch size (its size is a parameter) and one commit (its rows
    # travel as arrays): two texts a generation
    assert counts[0] == 2
    # psycopg deallocates the least recently used one each time a new text first runs, while it
    # holds more than the cap; both of a generation's texts are prepared on their second runs,
    # after that: the count settles at the cap plus two, not at 24 x 2.
    assert counts[-3:] == [HOT_PREPARED_MAX + 2] * 3, counts


def test_no_redundant_job_id_indexes() -> None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tablename, indexdef FROM pg_indexes "
            "WHERE tablename IN ('jobs_attempt', 'jobs_jobevent')"
        )
        defs = cur.fetchall()
    single = [d for t, d in defs if d.endswith("(job_id)")]
    assert single == [], single
    # the composite indexes that serve lookups by job are there
    assert any("(job_id, number)" in d for _, d in defs)
    assert any("(job_id, id)" in d for _, d in defs)


def test_an_idle_drain_keeps_the_claim_to_one_round_trip() -> None:
    Job.objects.create(kind="demo.noop", payload={})
    transitions_worker._limited.clear()
    transitions.refresh_limits(None)
    # Half a TTL later an idle drain's wait refreshes it again ...
    key = None
    seen_at, limited = transitions_worker._limited[key]
    transitions_worker._limited[key] = (
        seen_at - transitions_worker.LIMITS_TTL * 0.6,
        limited,
    )
    transitions.refresh_limits(None)
    assert time.monotonic() - transitions_worker._limited[key][0] < transitions_worker.LIMITS_TTL
    # ... so the claim the NOTIFY wakes it for is the claim statement alone.
    with CaptureQueriesContext(connection) as queries:
        assert len(transitions.claim(W, limit=1, lease_seconds=30)) == 1
    assert len(queries) == 1, [q["sql"][:80] for q in queries]


def test_the_switch_reads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.core.conf import jobs_settings

    for raw, expected in (("0", False), ("false", False), ("1", True), ("on", True)):
        monkeypatch.setenv("JOBS_PREPARED_STATEMENTS", raw)
        jobs_settings.cache_clear()
        assert jobs_settings().PREPARED_STATEMENTS is expected
    monkeypatch.setenv("JOBS_PREPARED_STATEMENTS", "maybe")
    jobs_settings.cache_clear()
    with pytest.raises(ValueError, match="true or false"):
        jobs_settings()
    monkeypatch.delenv("JOBS_PREPARED_STATEMENTS")
    jobs_settings.cache_clear()


class _Counting:
    """A JSON encoder that counts what it encodes, for the test below."""

    def __init__(self, real: Any, watched: Any) -> None:
        self.real, self.watched, self.calls = real, watched, 0

    def encode(self, value: Any) -> str:
        self.calls += value == self.watched
        return str(self.real.encode(value))


def test_a_result_is_encoded_once_by_its_check_and_sent_as_encoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runner's check of a handler's result (jobs.core.bounds.json_text) encodes it, and the
    commit sends that text as it is (jobs.core.sql.rows.JSONText): one encoding a result."""
    result = {"rows": [{"id": i, "name": "é\u2603"} for i in range(3)], "ok": True}
    checked = _Counting(bounds._ENCODER, result)
    committed = _Counting(rows._ENCODER, result)
    monkeypatch.setattr(bounds, "_ENCODER", checked)
    monkeypatch.setattr(rows, "_ENCODER", committed)
    job = jobs.enqueue("test.script", {"return": result})
    while runner.drain():
        pass
    job.refresh_from_db()
    assert (job.state, job.result) == (JobState.SUCCEEDED, result)
    assert (checked.calls, committed.calls) == (1, 0)
