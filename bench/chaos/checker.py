"""The checker: reads the history, the receiver's log, the database and the staging folder after
a run, and counts every violation of the invariants (the `must_be_zero` figures) beside what is
expected under faults and only informational.

Invariants, per job:
- every job the run enqueued exists exactly once (one job per `chaos-<i>` unique key: a wave is
  one transaction, retried only after checking that it did not land, bench/chaos/run.py);
- no job lost: every job terminal at the end;
- at most one accepted terminal write (terminal events of a job);
- the committed result and result_ref belong to the committing attempt;
- attempts 1..attempt each claimed exactly once (one Attempt row, one `claimed` event);
- charged attempts (attempt - attempts_released) <= max_attempts;
- no token-checked row holds a value from a non-current attempt of a job that succeeded, and the
  database never accepted a token-checked write while the writer's attempt was not the job's
  current running one (the audit trigger of bench/chaos/workload records every row an accepted
  UPDATE wrote, same values included, with the job row as that UPDATE saw it);
- every effect key performed at most once at the deduplicating receiver;
- every refused token-checked write the handler saw has a rejection record, and no record
  exists that no handler saw;
- no orphaned output after the janitor: every staged file belongs to a succeeded job's
  committing attempt;
- every rejected write recorded exactly once: log line = table row = metric delta
  (bench/chaos/evidence.py says what exactly is promised when a process is SIGKILLed).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg

from bench.chaos import evidence, history

TERMINAL_EVENTS = ("succeeded", "failed", "cancelled")
INVARIANTS = (
    "enqueued_key_not_exactly_one_job", "lost_jobs", "several_terminal_writes",
    "result_not_from_committing_attempt", "result_ref_not_from_committing_attempt",
    "attempts_not_each_claimed_once", "claimed_events_not_one_per_attempt",
    "charged_attempts_over_max",
    "token_row_body_not_its_token", "token_row_holds_non_current_attempt",
    "token_write_accepted_from_stale_attempt", "effect_performed_twice_at_deduplicating_receiver",
    "refusal_seen_but_not_recorded", "token_refusal_recorded_but_never_seen",
    "orphaned_outputs_left", "intent_performed_twice", "intent_performed_without_commit",
    "intent_done_but_never_performed", "intent_missing_for_a_committed_plan",
    "mail_missing_for_a_committed_plan", "mail_duplicate_not_recorded",
    "rejection_log_line_without_row", "rejection_row_without_log_line",
    "rejection_metric_delta_not_row_count",
)  # fmt: skip


def check(dsn: str, history_path: Path, receiver_calls: list[tuple[str, str, Any]],
          media_root: Path, performs: list[tuple[str, int]] | None = None,
          mails: list[str] | None = None, logs: list[Path] | None = None,
          killed: set[int] | None = None, metric_delta: float | None = None,
          lanes: dict[str, str] | None = None, faults: list[dict[str, Any]] | None = None,
          lease: float = 2.0,
          enqueued_keys: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    zero: dict[str, list[Any]] = {name: [] for name in INVARIANTS}
    info: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = {r[0]: r for r in conn.execute(
            "SELECT id, state, attempt, attempts_released, max_attempts, result, result_ref, "
            "payload, unique_key FROM jobs_job WHERE kind = 'chaos.work'"
        ).fetchall()}  # fmt: skip
        attempts: dict[int, list[int]] = defaultdict(list)
        for job, number in conn.execute("SELECT job_id, number FROM jobs_attempt ORDER BY 1, 2"):
            attempts[job].append(number)
        claimed = Counter(conn.execute(
            "SELECT job_id, attempt FROM jobs_jobevent WHERE type = 'claimed'"
        ).fetchall())  # fmt: skip
        terminal = Counter(r[0] for r in conn.execute(
            "SELECT job_id FROM jobs_jobevent WHERE type = ANY(%s)", (list(TERMINAL_EVENTS),)
        ))  # fmt: skip
        rows = conn.execute("SELECT id, fence_job_id, fence_attempt, body FROM chaos_chaosrow")
        holders = rows.fetchall()
        audit = conn.execute(
            "SELECT row_id, job_id, attempt, job_attempt, job_state FROM chaos_acceptedwrite"
        ).fetchall()
        rejected = Counter(conn.execute(
            "SELECT job_id, attempt_presented, write FROM jobs_rejectedwrite"
        ).fetchall())  # fmt: skip
        intents = {r[0]: r for r in conn.execute(
            "SELECT key, job_id, state, outcome_unknown FROM jobs_intent"
        ).fetchall()}  # fmt: skip
        resent = Counter(r[0] for r in conn.execute(
            "SELECT job_id FROM jobs_jobevent WHERE type = 'mail_resent'"
        ))  # fmt: skip
        unknown = conn.execute(
            "SELECT e.job_id, j.state FROM jobs_jobevent e JOIN jobs_job j ON j.id = e.job_id "
            "WHERE e.type = 'unresolved'"
        ).fetchall()
        orphans_removed = conn.execute(
            "SELECT count(*) FROM jobs_jobevent WHERE type = 'orphaned'"
        ).fetchone()[0]
        rejection_rows = conn.execute(
            "SELECT job_id, attempt_presented, write, worker FROM jobs_rejectedwrite"
        ).fetchall()
        outcomes = {(j, n): o for j, n, o in conn.execute(
            "SELECT job_id, number, outcome FROM jobs_attempt"
        )}  # fmt: skip
        intent_rows = conn.execute(
            "SELECT data->>'url', state, extract(epoch FROM done_at - created_at)::float, "
            "outcome_unknown, reconciled, claims FROM jobs_intent"
        ).fetchall()
        # Lease deadline (as the reaper's `expired` event recorded it) to the job's next claim:
        # jobs_reclaim_latency_seconds' own definition (jobs/core/sql/metrics.py). A reclaimed
        # job is queued again with run_at = now, so under a backlog this includes its wait.
        next_claim = conn.execute(
            "SELECT extract(epoch FROM c.at - (x.data->>'lease_expires_at')::timestamptz)::float "
            "FROM jobs_jobevent c JOIN jobs_jobevent x ON x.job_id = c.job_id "
            "AND x.attempt = c.attempt - 1 AND x.type = 'expired' "
            "WHERE c.type = 'claimed' AND x.data->>'lease_expires_at' IS NOT NULL"
        ).fetchall()
        backlog = conn.execute(  # how long jobs waited for their first claim (the queue's lag)
            "SELECT extract(epoch FROM c.at - e.at)::float FROM jobs_jobevent c "
            "JOIN jobs_jobevent e ON e.job_id = c.job_id AND e.type = 'enqueued' "
            "WHERE c.type = 'claimed' AND c.attempt = 1"
        ).fetchall()
        expired = conn.execute(
            "SELECT extract(epoch FROM a.ended_at - coalesce(a.heartbeat_at, a.claimed_at)) "
            "FROM jobs_attempt a WHERE a.outcome = 'expired'"
        ).fetchall()

    if enqueued_keys is not None:
        zero["enqueued_key_not_exactly_one_job"] = keys_not_exactly_once(
            enqueued_keys, [j[8] for j in jobs.values()]
        )
    for job, (_, state, attempt, released, max_attempts, result, ref, *_) in jobs.items():
        if state not in ("succeeded", "failed", "cancelled"):
            zero["lost_jobs"].append(job)
        if terminal[job] > 1:
            zero["several_terminal_writes"].append(job)
        if state == "succeeded":
            if not isinstance(result, dict) or result.get("attempt") != attempt:
                zero["result_not_from_committing_attempt"].append(job)
            if ref and f"attempt-{attempt}/" not in ref + "/":
                zero["result_ref_not_from_committing_attempt"].append(job)
        if attempts[job] != list(range(1, attempt + 1)):
            zero["attempts_not_each_claimed_once"].append(job)
        if any(claimed[(job, n)] != 1 for n in range(1, attempt + 1)):
            zero["claimed_events_not_one_per_attempt"].append(job)
        if max_attempts and attempt - released > max_attempts:
            zero["charged_attempts_over_max"].append(job)

    for row, job, attempt, body in holders:
        if job is None:
            continue
        if body != f"{job}:{attempt}":
            zero["token_row_body_not_its_token"].append(row)
        j = jobs.get(job)
        if j and j[1] == "succeeded" and attempt != j[2]:
            zero["token_row_holds_non_current_attempt"].append(row)
    zero["token_write_accepted_from_stale_attempt"] = stale_accepted_writes(audit)

    # Per (job, step) from the body, not per key: an effect performed again under another key
    # (say, a key that wrongly carried the attempt) is a duplicate the receiver cannot see.
    performed = Counter(
        (body.get("job"), body.get("step"))
        for _, verdict, body in receiver_calls
        if verdict == "performed" and isinstance(body, dict)
    )
    zero["effect_performed_twice_at_deduplicating_receiver"] = [
        k for k, n in performed.items() if n > 1
    ]
    info["effect_calls_deduplicated_by_receiver"] = sum(
        1 for _, verdict, _ in receiver_calls if verdict == "deduplicated"
    )

    seen_refused: Counter[tuple[int, int]] = Counter()
    begun: Counter[int] = Counter()
    lines = 0
    for line in history.read(history_path):
        lines += 1
        key = (line["job"], line["attempt"])
        if line["action"] == "begin":
            begun[line["job"]] += 1
        if line["action"] == "token_write" and line.get("outcome") == "refused":
            seen_refused[key] += 1
    for key in seen_refused:
        if not any(rejected[(key[0], key[1], w)] for w in
                   ("token_write", "heartbeat", "checkpoint", "commit", "fail")):  # fmt: skip
            zero["refusal_seen_but_not_recorded"].append(key)
    for (job, attempt, write), n in rejected.items():
        if write == "token_write" and n > seen_refused[(job, attempt)]:
            zero["token_refusal_recorded_but_never_seen"].append((job, attempt, n))

    for path in (media_root / "jobs").glob("*/attempt-*/*") if media_root.exists() else []:
        job_id, attempt = int(path.parts[-3]), int(path.parts[-2].split("-")[1])
        j = jobs.get(job_id)
        if not j or j[1] != "succeeded" or j[2] != attempt:
            zero["orphaned_outputs_left"].append(str(path))

    _check_intents_and_mail(jobs, intents, resent, performs or [], mails or [], zero, info)
    log_lines = evidence.json_lines(logs or [])
    evidence.rejections(log_lines, rejection_rows, killed or set(), metric_delta, zero, info)
    evidence.unknown_outcomes(log_lines, outcomes, faults or [], info)
    evidence.lanes(intent_rows, lanes or {}, info)
    latencies = sorted(float(r[0]) for r in expired if r[0] is not None)
    claims_after = sorted(float(r[0]) for r in next_claim if r[0] is not None)
    first_wait = sorted(float(r[0]) for r in backlog if r[0] is not None)
    info.update(
        unknown_outcome_writes=len(unknown),
        unknown_outcome_jobs_ended=dict(Counter(state for _, state in unknown)),
        orphaned_outputs_removed_by_the_janitor=orphans_removed,
        jobs=len(jobs),
        states=dict(Counter(j[1] for j in jobs.values())),
        history_lines=lines,
        duplicate_executions=sum(n - 1 for n in begun.values() if n > 1),
        stale_writes_rejected=sum(rejected.values()),
        token_writes_refused_seen_by_handlers=sum(seen_refused.values()),
        token_writes_accepted=len(audit),
        expired_attempts=len(latencies),
        lease_seconds=lease,
        reclaim_after_last_beat_p50_s=_pct(latencies, 0.5),
        reclaim_after_last_beat_p99_s=_pct(latencies, 0.99),
        next_claim_after_lease_expiry_p50_s=_pct(claims_after, 0.5),
        next_claim_after_lease_expiry_p99_s=_pct(claims_after, 0.99),
        enqueue_to_first_claim_p50_s=_pct(first_wait, 0.5),
        enqueue_to_first_claim_p99_s=_pct(first_wait, 0.99),
    )
    return {
        "must_be_zero": {k: len(v) for k, v in sorted(zero.items())},
        "examples": {k: json.loads(json.dumps(v[:5], default=str)) for k, v in zero.items() if v},
        "informational": info,
    }


def keys_not_exactly_once(enqueued: list[str], found: list[str | None]) -> list[tuple[str, int]]:
    """(key, jobs holding it) for every key the run enqueued that no job, or several, hold."""
    per_key = Counter(found)
    return [(key, per_key[key]) for key in enqueued if per_key[key] != 1]


def stale_accepted_writes(audit: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Audit rows (row_id, job_id, attempt, job_attempt, job_state) of writes the database
    accepted while the writer's attempt was not the job's current running one: a lower attempt,
    or the job not running (queued again, ended, deleted) -- whatever value the write stored."""
    return [
        (row, job, attempt, job_attempt, job_state)
        for row, job, attempt, job_attempt, job_state in audit
        if job_attempt != attempt or job_state != "running"
    ]


def _check_intents_and_mail(
    jobs: dict[int, Any], intents: dict[str, Any], resent: Counter[int],
    performs: list[tuple[str, int]], mails: list[str], zero: dict[str, list[Any]],
    info: dict[str, Any],
) -> None:  # fmt: skip
    """Intents reach the non-deduplicating receiver once, and only from a commit; every
    committed mail arrives, and each extra copy is one the platform recorded (mail_resent)."""
    performed = Counter(key for key, _ in performs)
    for key, n in performed.items():
        if n > 1:
            zero["intent_performed_twice"].append((key, n))
        row = intents.get(key)
        if row is None or jobs.get(row[1], (None, ""))[1] != "succeeded":
            zero["intent_performed_without_commit"].append(key)
    for key, (_, _job, state, _unknown) in intents.items():
        if state == "done" and not performed[key]:
            zero["intent_done_but_never_performed"].append(key)
    succeeded = {j: r for j, r in jobs.items() if r[1] == "succeeded"}
    keyed = {row[1] for row in intents.values()}
    received = Counter(mails)
    for job, row in succeeded.items():
        plan = row[7] or {}
        if plan.get("intent") and job not in keyed:
            zero["intent_missing_for_a_committed_plan"].append(job)
        if plan.get("mail"):
            copies = received[f"{job}:mail"]
            if copies == 0:
                zero["mail_missing_for_a_committed_plan"].append(job)
            if copies - 1 > resent[job]:
                zero["mail_duplicate_not_recorded"].append((job, copies, resent[job]))
    states = Counter(r[2] for r in intents.values())
    info.update(
        intents=dict(states),
        intents_failed_for_an_operator=states.get("failed", 0),
        intents_performed=sum(performed.values()),
        mails_received=len(mails),
        mail_duplicates_detected=sum(resent.values()),
    )


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)
