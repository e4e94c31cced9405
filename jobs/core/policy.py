"""Pure decisions: retry/backoff, lease lengths, and what an expired lease means.

Owns: deciding. Never: reads a clock or the database; callers pass everything in, so tests need
no sleeps and no rows.
"""

from dataclasses import dataclass

from jobs.core.conf import JobsSettings
from jobs.core.registry import Handler


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay_seconds: float = 0.0


def max_attempts_for(
    job_max_attempts: int | None, handler: Handler | None, cfg: JobsSettings
) -> int:
    """The job's own limit wins, then the handler's, then the platform default."""
    if job_max_attempts is not None:
        return job_max_attempts
    if handler is not None and handler.max_attempts is not None:
        return handler.max_attempts
    return cfg.MAX_ATTEMPTS


def lease_seconds_for(job_lease: float | None, handler: Handler | None, cfg: JobsSettings) -> float:
    if job_lease is not None:
        return float(job_lease)
    if handler is not None and handler.lease_seconds is not None:
        return float(handler.lease_seconds)
    return cfg.LEASE_SECONDS


def heartbeat_interval(lease_seconds: float, cfg: JobsSettings) -> float:
    """Beat at least three times per lease so one slow beat never loses a healthy lease."""
    return min(cfg.HEARTBEAT_SECONDS, lease_seconds / 3.0)


def backoff_seconds(attempt: int, base: float, cap: float, jitter: float) -> float:
    """Exponential backoff base * 2^(attempt-1), capped, spread by `jitter` in [0, 1)."""
    if attempt < 1:
        raise ValueError("attempt numbers start at 1")
    raw = min(cap, base * (2 ** min(attempt - 1, 40)))
    return raw * (1.0 + 0.25 * jitter)


FAST_JOB_SECONDS = 0.05
# Quick jobs batch up to this many whatever the claim costs; beyond it see next_claim_batch.
SMALL_BATCH = 8
# Past SMALL_BATCH a batch grows while its claim took more than this share of the time its
# handlers took.
CLAIM_SHARE = 0.25


def next_claim_batch(
    current: int, seconds_per_job: float, cap: int, claim_seconds: float = 0.0
) -> int:
    """Grow the claim batch while jobs are quick; drop to one as soon as they are not.

    Claimed jobs wait in the drain behind each other. Batching only quick jobs keeps that wait
    short, and a slow job never has more than the rest of one quick batch queued behind it,
    while another worker stays free to claim the remaining work (batch-mates that wait behind a
    handler running long are handed back, jobs.worker.heartbeat.HANDOFF_SECONDS). Up to
    SMALL_BATCH the batch doubles while each job takes under FAST_JOB_SECONDS.

    Past SMALL_BATCH it grows only where the claim is what costs: while the last claim
    (`claim_seconds`) took more than CLAIM_SHARE of what its jobs' handlers took, and no further
    than the whole batch at this pace running within FAST_JOB_SECONDS; it shrinks back as claims
    get cheaper. Under a backlog every claim walks jobs_job_pick_idx from its head, over the
    entries of the jobs claimed since jobs_job was last vacuumed (a minute of them under a
    steady stream): there a claim of 8 no-op jobs can cost more than running them, and the
    batch grows until it does not. Where claims are cheap the batch stays at SMALL_BATCH, so a
    slow job that follows quick ones finds at most SMALL_BATCH - 1 batch-mates to hand back.
    """
    if seconds_per_job >= FAST_JOB_SECONDS:
        return 1
    wanted = current * 2
    if wanted > SMALL_BATCH:
        per_job = max(seconds_per_job, 1e-6)
        worth = int(claim_seconds / (CLAIM_SHARE * per_job))
        fits = int(FAST_JOB_SECONDS / per_job)
        wanted = max(SMALL_BATCH, min(wanted, worth, fits))
    return max(1, min(cap, wanted))


def charged_attempts(attempt: int, attempts_released: int) -> int:
    """Attempts that count against max_attempts: claims minus those handed back unstarted."""
    return max(1, attempt - attempts_released)


def decide_failure(
    attempt: int, max_attempts: int, cfg: JobsSettings, jitter: float, permanent: bool = False
) -> RetryDecision:
    """After the `attempt`-th charged attempt failed (or expired), retry while attempts remain --
    unless its failure is permanent (jobs.core.exceptions.PermanentFailure): each retry would
    end the same way."""
    if permanent or attempt >= max_attempts:
        return RetryDecision(retry=False)
    delay = backoff_seconds(attempt, cfg.RETRY_BASE_SECONDS, cfg.RETRY_MAX_SECONDS, jitter)
    return RetryDecision(retry=True, delay_seconds=delay)


def decide_expiry(attempt: int, max_attempts: int) -> RetryDecision:
    """An expired lease is reclaimed at once (it is already late) unless it was the last."""
    return RetryDecision(retry=attempt < max_attempts, delay_seconds=0.0)
