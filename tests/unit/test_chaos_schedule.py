"""The fault-injection suite's schedule is the seed's alone (times, kinds and victims), and its
checker counts what it says: rejection accounting (log line = table row = metric delta), stale
writes in the audit of accepted token writes, one job per enqueued key. No clusters."""

import dataclasses

import pytest

from bench.chaos import checker, evidence, nemesis


def test_one_seed_gives_one_schedule_times_kinds_and_victims() -> None:
    first = nemesis.schedule(1, 30, 40.0, nemesis.KINDS, clusters=3, workers=2)
    again = nemesis.schedule(1, 30, 40.0, nemesis.KINDS, clusters=3, workers=2)
    assert first == again
    assert len(first) == 30
    # the victim is part of the schedule: cluster, slot and every further choice
    assert all(dataclasses.is_dataclass(f) for f in first)
    assert [(f.at, f.kind, f.cluster, f.slot, f.phase, f.count, f.seconds, f.pick)
            for f in first] == [(f.at, f.kind, f.cluster, f.slot, f.phase, f.count, f.seconds,
                                 f.pick) for f in again]  # fmt: skip


def test_different_seeds_give_different_schedules() -> None:
    schedules = [nemesis.schedule(s, 30, 40.0, clusters=3, workers=2) for s in range(1, 21)]
    assert len({tuple(s) for s in schedules}) == 20
    one, two = schedules[0], schedules[1]
    assert [f.at for f in one] != [f.at for f in two]
    assert [(f.kind, f.cluster, f.slot) for f in one] != [(f.kind, f.cluster, f.slot) for f in two]


def test_every_kind_is_scheduled_and_victims_are_in_range() -> None:
    faults = nemesis.schedule(7, 30, 40.0, clusters=3, workers=2)
    assert {f.kind for f in faults} == set(nemesis.KINDS)
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    for f in faults:
        assert 0 <= f.cluster < 3 and 0 <= f.slot < 2
        if f.kind in nemesis.ON_CLUSTER_0:
            assert f.cluster == 0  # the proxy is in front of cluster 0
        if f.kind == "pooler_restart":
            assert f.cluster == 1  # PgBouncer is in front of cluster 1


def test_bad_schedule_input_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        nemesis.schedule(1, 5, 10.0, ("zombie", "meteor"))
    with pytest.raises(ValueError, match="at least 1"):
        nemesis.schedule(1, 5, 10.0, clusters=0)


def _line(write: str, job: int, attempt: int) -> dict[str, str]:
    return {
        "logger": "jobs.fencing",
        "message": f"stale {write} rejected: job={job} kind=chaos.work attempt_presented={attempt}"
        " attempt_current=3 state_current=running worker=h:1 lateness=0.1s",
    }


def test_rejections_log_line_row_and_metric_must_agree() -> None:
    rows = [(1, 1, "commit", "h:100"), (2, 1, "token_write", "h:200"), (3, 2, "heartbeat", "h:300")]
    lines = [_line("commit", 1, 1), _line("token_write", 2, 1), _line("heartbeat", 3, 2)]
    zero: dict[str, list] = {}
    info: dict = {}
    evidence.rejections(lines, rows, set(), 3.0, zero, info)
    assert not any(zero.values()), zero
    assert info["rejection_log_lines"] == info["rejection_rows"] == 3

    # a row with no line: a violation, unless its worker was SIGKILLed by the suite
    zero, info = {}, {}
    evidence.rejections(lines[:2], rows, set(), 3.0, zero, info)
    assert zero["rejection_row_without_log_line"] == [((3, 2, "heartbeat"), 1)]
    zero, info = {}, {}
    evidence.rejections(lines[:2], rows, {300}, 3.0, zero, info)
    assert not zero["rejection_row_without_log_line"]
    assert info["rejection_lines_lost_to_sigkill"] == 1

    # a line twice (or with no row) and a metric that moved by another amount
    zero, info = {}, {}
    evidence.rejections([*lines, _line("commit", 1, 1)], rows, set(), 2.0, zero, info)
    assert zero["rejection_log_line_without_row"] == [((1, 1, "commit"), 1)]
    assert zero["rejection_metric_delta_not_row_count"] == [(2.0, 3)]


def test_an_accepted_token_write_is_stale_whatever_value_it_wrote() -> None:
    # (row, job, attempt presented, the job's attempt, the job's state) as the UPDATE saw it
    current = (1, 7, 2, 2, "running")
    audit = [
        current,
        (1, 7, 1, 1, "queued"),  # issue 15: a zombie's write while its job is queued again --
        # in a long job's loop it writes the body its row already holds, and is still recorded
        (2, 7, 1, 2, "running"),  # a lower attempt while a later one runs the job
        (3, 8, 2, 2, "succeeded"),  # after the job ended
        (4, 9, 1, None, None),  # the job row gone
    ]
    assert checker.stale_accepted_writes([current]) == []
    assert checker.stale_accepted_writes(audit) == audit[1:]


def test_the_audit_trigger_records_every_accepted_update_not_only_changes() -> None:
    from importlib import import_module

    trigger = import_module("bench.chaos.workload.migrations.0001_initial").TRIGGER
    # No comparison with the row's old values: a write of the values a row already holds (a
    # long job's loop, a zombie rewriting its own rows) is recorded like any other.
    assert "OLD." not in trigger and " IF " not in trigger
    assert "AFTER UPDATE ON chaos_chaosrow" in trigger and "FOR EACH ROW" in trigger
    # STABLE: it reads the job row in the snapshot of the UPDATE that fired it
    assert "FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql STABLE" in trigger


def test_every_enqueued_key_must_hold_exactly_one_job() -> None:
    enqueued = ["chaos-0", "chaos-1", "chaos-2"]
    assert checker.keys_not_exactly_once(enqueued, ["chaos-2", "chaos-0", "chaos-1"]) == []
    # a wave retried after it landed (its jobs ended), and one that never landed
    found = ["chaos-0", "chaos-1", "chaos-0", "chaos-1", None]
    assert checker.keys_not_exactly_once(enqueued, found) == [
        ("chaos-0", 2), ("chaos-1", 2), ("chaos-2", 0)
    ]  # fmt: skip
