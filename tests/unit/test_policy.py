import pytest

from jobs.core import policy
from jobs.core.conf import JobsSettings
from jobs.core.registry import Handler

CFG = JobsSettings(RETRY_BASE_SECONDS=2.0, RETRY_MAX_SECONDS=60.0, MAX_ATTEMPTS=3)


def test_backoff_doubles_per_attempt():
    delays = [policy.backoff_seconds(a, 2.0, 1000.0, jitter=0.0) for a in (1, 2, 3, 4)]
    assert delays == [2.0, 4.0, 8.0, 16.0]


def test_backoff_is_capped_even_for_huge_attempt_numbers():
    assert policy.backoff_seconds(500, 2.0, 60.0, jitter=0.0) == 60.0


def test_jitter_spreads_by_at_most_a_quarter():
    assert policy.backoff_seconds(1, 2.0, 60.0, jitter=0.999) == pytest.approx(2.0 * 1.24975)


def test_backoff_rejects_attempt_zero():
    with pytest.raises(ValueError):
        policy.backoff_seconds(0, 2.0, 60.0, jitter=0.0)


def test_a_failure_with_attempts_left_is_retried_with_backoff():
    decision = policy.decide_failure(attempt=2, max_attempts=3, cfg=CFG, jitter=0.0)
    assert decision.retry and decision.delay_seconds == 4.0


def test_the_last_attempt_failing_is_final():
    assert not policy.decide_failure(attempt=3, max_attempts=3, cfg=CFG, jitter=0.0).retry


def test_an_attempt_beyond_the_limit_is_final():
    assert not policy.decide_failure(attempt=5, max_attempts=3, cfg=CFG, jitter=0.0).retry


def test_a_permanent_failure_is_final_with_attempts_left():
    decision = policy.decide_failure(attempt=1, max_attempts=3, cfg=CFG, jitter=0.0, permanent=True)
    assert decision == policy.RetryDecision(retry=False)


def test_an_expired_lease_is_requeued_at_once_unless_it_was_the_last_attempt():
    assert policy.decide_expiry(1, 3) == policy.RetryDecision(retry=True, delay_seconds=0.0)
    assert not policy.decide_expiry(3, 3).retry


def test_max_attempts_prefers_job_then_handler_then_default():
    h = Handler("k", lambda ctx: None, max_attempts=7)
    assert policy.max_attempts_for(2, h, CFG) == 2
    assert policy.max_attempts_for(None, h, CFG) == 7
    assert policy.max_attempts_for(None, None, CFG) == 3


def test_lease_prefers_job_then_handler_then_default():
    h = Handler("k", lambda ctx: None, lease_seconds=12)
    assert policy.lease_seconds_for(5, h, CFG) == 5.0
    assert policy.lease_seconds_for(None, h, CFG) == 12.0
    assert policy.lease_seconds_for(None, None, CFG) == CFG.LEASE_SECONDS


def test_heartbeat_beats_at_least_three_times_per_lease():
    assert policy.heartbeat_interval(3.0, JobsSettings(HEARTBEAT_SECONDS=10.0)) == 1.0
    assert policy.heartbeat_interval(300.0, JobsSettings(HEARTBEAT_SECONDS=10.0)) == 10.0


def test_the_claim_batch_doubles_while_jobs_are_quick_up_to_the_cap():
    sizes = [1]
    for _ in range(5):
        sizes.append(policy.next_claim_batch(sizes[-1], 0.001, cap=8))
    assert sizes == [1, 2, 4, 8, 8, 8]


def test_the_claim_batch_drops_to_one_after_a_slow_job():
    assert policy.next_claim_batch(8, 2.0, cap=8) == 1


def test_past_eight_the_claim_batch_grows_only_while_the_claim_costs_more_than_a_quarter():
    def settle(per_job: float, claim: float) -> int:
        size = 1
        for _ in range(12):
            size = policy.next_claim_batch(size, per_job, cap=64, claim_seconds=claim)
        return size

    # Cheap claims (a fresh table): quick jobs batch up to SMALL_BATCH, as before.
    assert settle(0.0002, 0.0003) == policy.SMALL_BATCH == 8
    assert settle(0.001, 0.0005) == 8
    # A claim walking a long dead head (4 ms) for no-op jobs of 0.2 ms: up to the cap.
    assert settle(0.0002, 0.004) == 64
    # 1 ms jobs behind a 4 ms claim: 16 of them take four times the claim.
    assert settle(0.001, 0.004) == 16
    # Never past what the whole batch runs within FAST_JOB_SECONDS: 3 ms jobs stop at 16.
    assert settle(0.003, 1.0) == 16
    # 10 ms and 40 ms jobs stay at SMALL_BATCH whatever the claim costs.
    assert settle(0.010, 1.0) == 8
    assert settle(0.040, 1.0) == 8
    # The batch shrinks back as claims get cheaper, never below SMALL_BATCH; a slow job drops it.
    assert policy.next_claim_batch(64, 0.0002, cap=64, claim_seconds=0.001) == 20
    assert policy.next_claim_batch(64, 0.0002, cap=64, claim_seconds=0.0001) == 8
    assert policy.next_claim_batch(64, 0.2, cap=64, claim_seconds=1.0) == 1
