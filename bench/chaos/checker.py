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
- the application's own rows inserted and deleted through fenced_create / fenced_bulk_create /
  fenced_delete: no row inserted, and none deleted, by an attempt that was not the job's current
  running one in that statement's own snapshot (a second audit trigger records every accepted
  INSERT and DELETE of chaos_chaositem, a DELETE under each deleter fenced_delete named), and a
  succeeded job's items are exactly its committing attempt's (each attempt deletes what earlier
  attempts left, so a zombie's insert accepted after that would stay);
- a "messy" first attempt (a transaction left open, a session parameter changed, a thread left
  running: jobs/worker/hygiene.py) harms only itself: what it wrote in the open transaction is
  rolled back and the attempt does not succeed, no other attempt fails of its mess, and its
  worker goes on claiming;
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
import re
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
    "item_created_by_stale_attempt", "item_deleted_by_stale_attempt",
    "items_not_the_committing_attempts", "mess_open_transaction_committed",
    "mess_open_transaction_attempt_succeeded", "mess_hit_another_attempt",
    "mess_worker_stopped_claiming",
)  # fmt: skip
# A history action whose refusal (outcome "refused") the handler saw: each is one rejection row.
FENCED_ACTIONS = ("token_write", "item_create", "item_delete", "items_txn")
# What another attempt's error would say if a mess had leaked into it: a transaction left open
# (hygiene's own message for a handler that itself returned normally -- nothing after it; a
# handler whose connection died under it gets the same first line and then its traceback --
# or Django's), or a read-only session parameter.
MESS_LEAKED = re.compile(
    r"\Athe handler returned [^\n]*\Z|TransactionManagementError|durable atomic block|"
    r"read-only transaction"
)
# After a mess, its worker must claim again if the run's workers claimed at least this many more.
CLAIMS_AFTER_MESS = 20


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
        items = conn.execute("SELECT job, attempt, name FROM chaos_chaositem").fetchall()
        changes = conn.execute(
            "SELECT op, item_id, job_id, attempt, job_attempt, job_state FROM chaos_acceptedchange"
        ).fetchall()
        marks = conn.execute("SELECT job, attempt FROM chaos_messmark").fetchall()
        attempt_rows = conn.execute(
            "SELECT job_id, number, worker, outcome, coalesce(error, ''), "
            "extract(epoch FROM claimed_at)::float, extract(epoch FROM ended_at)::float "
            "FROM jobs_attempt"
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
    refused_by_action: Counter[str] = Counter()
    for line in history.read(history_path):
        lines += 1
        key = (line["job"], line["attempt"])
        if line["action"] == "begin":
            begun[line["job"]] += 1
        if line["action"] in FENCED_ACTIONS and line.get("outcome") == "refused":
            seen_refused[key] += 1
            refused_by_action[line["action"]] += 1
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

    zero["item_created_by_stale_attempt"] = stale_changes(changes, "insert")
    zero["item_deleted_by_stale_attempt"] = stale_changes(changes, "delete")
    zero["items_not_the_committing_attempts"] = items_not_committing(jobs, items)
    _check_messes(jobs, attempt_rows, marks, killed or set(), faults or [], zero, info)
    info.update(
        items_inserts_accepted=sum(1 for c in changes if c[0] == "insert"),
        items_deletes_accepted=sum(1 for c in changes if c[0] == "delete"),
        items_left=len(items),
        refusals_seen_by_write=dict(sorted(refused_by_action.items())),
    )
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


def stale_changes(changes: list[tuple[Any, ...]], op: str) -> list[tuple[Any, ...]]:
    """Audit rows (op, item, writer's job, writer's attempt, the job's attempt, the job's state)
    of INSERTs or DELETEs the database accepted while the writer was not the job's current
    running attempt in that statement's snapshot -- or that named no writer at all."""
    return [
        c for c in changes
        if c[0] == op and (c[2] is None or c[4] != c[3] or c[5] != "running")
    ]  # fmt: skip


def items_not_committing(jobs: dict[int, Any], items: list[tuple[int, int, str]]
                         ) -> list[tuple[Any, ...]]:  # fmt: skip
    """(job, expected, found) for every succeeded job whose items are not exactly its committing
    attempt's `item-<k>` rows (no scratch row, no earlier attempt's, none missing), and for
    items of a job the run never had."""
    found: dict[int, Counter[tuple[int, str]]] = defaultdict(Counter)
    for job, attempt, name in items:
        found[job][(attempt, name)] += 1
    out = []
    for job, row in jobs.items():
        if row[1] != "succeeded":
            continue
        n = int((row[7] or {}).get("items", 0))
        expected = Counter((row[2], f"item-{k}") for k in range(n))
        if found.get(job, Counter()) != expected:
            out.append((job, sorted(expected), sorted(found.get(job, Counter()).elements())))
    out += [(job, [], sorted(c.elements())) for job, c in found.items() if job not in jobs]
    return out


def _check_messes(jobs: dict[int, Any], attempts: list[tuple[Any, ...]],
                  marks: list[tuple[int, int]], killed: set[int], faults: list[dict[str, Any]],
                  zero: dict[str, list[Any]], info: dict[str, Any]) -> None:  # fmt: skip
    """A messy first attempt harms itself alone: its open transaction's row rolled back and the
    attempt not succeeded; no other attempt failed of a leaked mess; its worker claims again."""
    from bench.chaos.clusters import worker_pid

    zero["mess_open_transaction_committed"] = list(marks)
    by_key = {(a[0], a[1]): a for a in attempts}
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    messy = set()
    for job, row in jobs.items():
        mess = (row[7] or {}).get("mess")
        first = by_key.get((job, 1))
        if not mess or first is None:
            continue
        messy.add((job, 1))
        outcomes[mess][first[3]] += 1
        if mess in ("atomic", "begin") and first[3] == "succeeded":
            zero["mess_open_transaction_attempt_succeeded"].append((job, mess))
        worker, claimed, ended = first[2], first[5], first[6]
        if ended is None or worker_pid(worker) in killed:
            continue
        later = [a for a in attempts if a[5] > ended]
        if len(later) < CLAIMS_AFTER_MESS or any(a[2] == worker for a in later):
            continue
        # A cluster stopped while it ran or before its worker had had CLAIMS_AFTER_MESS claims'
        # time to claim again: its worker may be gone. (Any stop ending after the claim excused
        # it, however late: one SIGTERM near the end of a run excused every mess before it.)
        chances = sorted(a[5] for a in later)[CLAIMS_AFTER_MESS - 1]
        if any(f.get("kind") == "term_cluster" and f.get("wall", 0) + f.get("seconds", 0) >= claimed
               and f.get("wall", 0) <= chances for f in faults):  # fmt: skip
            continue
        zero["mess_worker_stopped_claiming"].append((job, mess, worker, len(later)))
    zero["mess_hit_another_attempt"] = [
        (a[0], a[1], a[4][:120]) for a in attempts
        if (a[0], a[1]) not in messy and MESS_LEAKED.search(a[4])
    ]  # fmt: skip
    info["messy_first_attempts_by_outcome"] = {m: dict(c) for m, c in sorted(outcomes.items())}


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
