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


def next_claim_batch(current: int, seconds_per_job: float, cap: int) -> int:
    """Grow the claim batch while jobs are quick; drop to one as soon as they are not.

    Claimed jobs wait in the drain behind each other. Batching only quick jobs keeps that wait
    short, and a slow job never has more than the rest of one quick batch queued behind it,
    while another worker stays free to claim the remaining work.
    """
    if seconds_per_job < FAST_JOB_SECONDS:
        return max(1, min(cap, current * 2))
    return 1


def charged_attempts(attempt: int, attempts_released: int) -> int:
    """Attempts that count against max_attempts: claims minus those handed back unstarted."""
    return max(1, attempt - attempts_released)


def decide_failure(
    attempt: int, max_attempts: int, cfg: JobsSettings, jitter: float
) -> RetryDecision:
    """After the `attempt`-th charged attempt failed (or expired), retry while attempts remain."""
    if attempt >= max_attempts:
        return RetryDecision(retry=False)
    delay = backoff_seconds(attempt, cfg.RETRY_BASE_SECONDS, cfg.RETRY_MAX_SECONDS, jitter)
    return RetryDecision(retry=True, delay_seconds=delay)


def decide_expiry(attempt: int, max_attempts: int) -> RetryDecision:
    """An expired lease is reclaimed at once (it is already late) unless it was the last."""
    return RetryDecision(retry=attempt < max_attempts, delay_seconds=0.0)
