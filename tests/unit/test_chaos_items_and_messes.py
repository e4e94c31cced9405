"""The fault-injection suite's checks of the application rows handlers insert and delete through
fenced_create / fenced_bulk_create / fenced_delete, and of the "messy" jobs that leave their
worker's connection or process unfit (bench/chaos/checker.py). No clusters."""

from importlib import import_module
from typing import Any

from bench.chaos import checker


def _job(state: str, attempt: int, plan: dict[str, Any]) -> tuple[Any, ...]:
    # (id, state, attempt, attempts_released, max_attempts, result, result_ref, payload, key)
    return (0, state, attempt, 0, 25, None, None, plan, None)


def test_an_insert_or_delete_is_stale_unless_its_writer_ran_the_job_in_that_snapshot() -> None:
    # (op, item, writer's job, writer's attempt, the job's attempt, the job's state)
    accepted = [("insert", 1, 7, 2, 2, "running"), ("delete", 1, 7, 2, 2, "running")]
    stale = [
        ("insert", 2, 7, 1, 2, "running"),  # a zombie's insert while attempt 2 runs the job
        ("insert", 3, 7, 2, 2, "queued"),  # while its job is queued again (expired)
        ("insert", 4, 9, 1, None, None),  # the job row gone
    ]
    deletes = [
        ("delete", 5, 7, 1, 2, "running"),
        ("delete", 6, 8, 3, 3, "succeeded"),
        ("delete", 7, None, None, None, None),  # a delete that named no deleter
    ]
    changes = accepted + stale + deletes
    assert checker.stale_changes(changes, "insert") == stale
    assert checker.stale_changes(changes, "delete") == deletes


def test_a_succeeded_job_holds_exactly_its_committing_attempts_items() -> None:
    jobs = {
        1: _job("succeeded", 2, {"items": 2}),
        2: _job("succeeded", 1, {"items": 1}),
        3: _job("succeeded", 3, {"items": 1}),
        4: _job("succeeded", 1, {}),
        5: _job("failed", 4, {"items": 1}),  # not judged: no attempt committed
    }
    items = [
        (1, 2, "item-0"), (1, 2, "item-1"),  # as it should be
        (2, 1, "item-0"), (2, 1, "scratch"),  # a scratch row never deleted
        (3, 2, "item-0"), (3, 3, "item-0"),  # an earlier attempt's item (a zombie's insert)
        (5, 1, "item-0"),
        (99, 1, "item-0"),  # a job the run never had
    ]  # fmt: skip
    assert checker.items_not_committing(jobs, items) == [
        (2, [(1, "item-0")], [(1, "item-0"), (1, "scratch")]),
        (3, [(3, "item-0")], [(2, "item-0"), (3, "item-0")]),
        (99, [], [(1, "item-0")]),
    ]
    # a missing item is caught too (a delete that took the committing attempt's own rows)
    assert checker.items_not_committing({1: jobs[1]}, items[:1]) == [
        (1, [(2, "item-0"), (2, "item-1")], [(2, "item-0")])
    ]


def _attempt(job: int, n: int, worker: str, outcome: str, error: str = "",
             claimed: float = 0.0, ended: float | None = 1.0) -> tuple[Any, ...]:  # fmt: skip
    return (job, n, worker, outcome, error, claimed, ended)


def test_a_mess_harms_only_its_own_attempt() -> None:
    jobs = {1: _job("succeeded", 2, {"mess": "atomic"}), 2: _job("succeeded", 1, {})}
    hygiene = "the handler returned inside a transaction.atomic() block it never left"
    attempts = [
        _attempt(1, 1, "h:10", "failed", hygiene, 0.0, 1.0),
        _attempt(1, 2, "h:11", "succeeded", "", 4.0, 5.0),
        _attempt(2, 1, "h:10", "succeeded", "", 2.0, 3.0),  # its worker claimed again
        # a handler whose connection died under it: hygiene's first line, then its own error --
        # that attempt's own failure, not a mess that leaked into it
        _attempt(
            3,
            1,
            "h:12",
            "failed",
            "the handler returned with a transaction open: its "
            "writes there were rolled back\nTraceback ...\nOperationalError",
            2.0,
            3.0,
        ),
    ]
    zero: dict[str, list[Any]] = {name: [] for name in checker.INVARIANTS}
    info: dict[str, Any] = {}
    checker._check_messes(jobs, attempts, [], set(), [], zero, info)
    assert not any(zero.values()), zero
    assert info["messy_first_attempts_by_outcome"] == {"atomic": {"failed": 1}}

    # the mess leaked: its row committed, the attempt succeeded, the next job on that worker
    # failed in the transaction it inherited (or read-only), the worker never claimed again
    leaked = [
        _attempt(1, 1, "h:10", "succeeded", "", 0.0, 1.0),
        _attempt(
            2,
            1,
            "h:11",
            "failed",
            "ReadOnlySqlTransaction: cannot execute UPDATE in a read-only transaction",
            2.0,
            3.0,
        ),  # fmt: skip
        *[_attempt(100 + i, 1, "h:11", "succeeded", "", 2.0 + i, 3.0 + i) for i in range(20)],
    ]
    zero = {name: [] for name in checker.INVARIANTS}
    checker._check_messes(jobs, leaked, [(1, 1)], set(), [], zero, info)
    assert zero["mess_open_transaction_committed"] == [(1, 1)]
    assert zero["mess_open_transaction_attempt_succeeded"] == [(1, "atomic")]
    assert [a[:2] for a in zero["mess_hit_another_attempt"]] == [(2, 1)]
    assert zero["mess_worker_stopped_claiming"] == [(1, "atomic", "h:10", 21)]

    # ... unless its worker was SIGKILLed, or a cluster SIGTERMed, by the suite since -- or
    # while it ran (a stop begun just before the mess, still under way: seed 3, 2026-12-06)
    stops = ([{"kind": "term_cluster", "wall": 1.5, "seconds": 1.3}],
             [{"kind": "term_cluster", "wall": -0.5, "seconds": 1.3}])  # fmt: skip
    for killed, faults in (({10}, []), (set(), stops[0]), (set(), stops[1])):
        zero = {name: [] for name in checker.INVARIANTS}
        checker._check_messes(jobs, leaked, [], killed, faults, zero, info)
        assert zero["mess_worker_stopped_claiming"] == []
    # a stop that was over before the mess began excuses nothing
    zero = {name: [] for name in checker.INVARIANTS}
    old_stop = [{"kind": "term_cluster", "wall": -3.0, "seconds": 1.3}]
    checker._check_messes(jobs, leaked, [], set(), old_stop, zero, info)
    assert len(zero["mess_worker_stopped_claiming"]) == 1
    # nor does one begun after its worker had let CLAIMS_AFTER_MESS claims go by (the 20th
    # later claim is at 20.0): a SIGTERM near a run's end excused every mess before it
    zero = {name: [] for name in checker.INVARIANTS}
    late_stop = [{"kind": "term_cluster", "wall": 100.0, "seconds": 1.3}]
    checker._check_messes(jobs, leaked, [], set(), late_stop, zero, info)
    assert len(zero["mess_worker_stopped_claiming"]) == 1


def test_the_item_audit_records_inserts_and_deletes_by_their_writers() -> None:
    trigger = import_module("bench.chaos.workload.migrations.0002_items_and_messes").TRIGGER
    assert "AFTER INSERT OR DELETE ON chaos_chaositem" in trigger and "FOR EACH ROW" in trigger
    # a DELETE's writers are the deleters fenced_delete named, not the row's previous token
    assert "current_setting('palisade.fenced_deleters', true)" in trigger
    # STABLE: the job row as the statement that fired it saw it
    assert "FUNCTION chaos_item_audit() RETURNS trigger LANGUAGE plpgsql STABLE" in trigger


def test_the_plans_are_the_seeds_alone_and_every_long_job_writes_items() -> None:
    import random

    from bench.chaos import run

    def plans(seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        return [run.plan(rng, 30) for _ in range(300)]

    one = plans(1)
    assert one == plans(1) and one != plans(2)
    assert all(p["items"] for p in one if p["seconds"])  # a zombie in the loop meets them
    assert {p["mess"] for p in one} == set(run.MESSES)  # every mess in the small run
    assert 0 < sum(1 for p in one if p["mess"]) < 40


def test_the_proxy_reads_the_rows_of_the_commit_statement_as_cluster_0_sends_it() -> None:
    from bench.chaos.proxy import COMMIT_MARKER, commit_rows

    # The commit's rows as psycopg's ClientCursor renders the four arrays (cluster 0 runs with
    # JOBS_PREPARED_STATEMENTS=0, so Django's client-side binding cursor sends them as text),
    # each with the smallest integer type its values fit
    text = (
        b"UPDATE jobs_job j SET state = 'succeeded', result = v.result::jsonb, result_ref = v.ref"
        b" FROM unnest('{12,70000,3}'::int4[]::bigint[], '{1,2,30}'::int2[]::int[], "
        b"E'{x,y,z}'::text[], '{a,b,c}'::text[]) AS v(id, attempt, result, ref)"
    )
    assert COMMIT_MARKER in text
    assert commit_rows(text) == [(12, 1), (70000, 2), (3, 30)]
    assert commit_rows(b"(5::bigint, 2::int, '{}')") == [(5, 2)]  # the earlier VALUES rows
