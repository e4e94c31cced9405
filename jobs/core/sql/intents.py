"""The commit's outbox intents (jobs.effects.outbox), inserted by the commit statement itself."""

from typing import Any

from jobs.core.sql.rows import dumps


def intents_cte(rows: Any, params: dict[str, Any]) -> str:
    """Outbox intents inserted only for rows that committed (the join on `done`).

    A zombie's commit matches no row, so its intents never exist; an intent for a (job, step)
    that already exists (an operator's re-run of a finished job) is the same intent, kept once.
    Empty when no row carries intents, so the plain commit statement is unchanged.
    """
    flat = [(r.id, r.attempt, intent) for r in rows for intent in r.intents]
    if not flat:
        return ""
    params.update(
        {
            "n_ids": [job_id for job_id, _, _ in flat],
            "n_attempts": [attempt for _, attempt, _ in flat],
            "n_steps": [intent.step for _, _, intent in flat],
            "n_keys": [intent.key for _, _, intent in flat],
            "n_targets": [intent.target for _, _, intent in flat],
            "n_lanes": [intent.lane for _, _, intent in flat],
            "n_data": [dumps(intent.data) for _, _, intent in flat],
        }
    )
    return """, intents AS (
                INSERT INTO jobs_intent (job_id, attempt, step, key, target, lane, data)
                SELECT iv.id, iv.attempt, iv.step, iv.key, iv.target, iv.lane, iv.data::jsonb
                  FROM unnest(%(n_ids)s::bigint[], %(n_attempts)s::int[], %(n_steps)s::text[],
                              %(n_keys)s::text[], %(n_targets)s::text[], %(n_lanes)s::text[],
                              %(n_data)s::text[])
                       AS iv(id, attempt, step, key, target, lane, data)
                  JOIN done ON done.id = iv.id AND done.attempt = iv.attempt
                ON CONFLICT (job_id, step) DO NOTHING
            )"""
