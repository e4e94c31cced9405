"""The webhook's deadline is bounded where it is configured.

Before, `WebhookTarget(timeout=...)` took any value: 0, a negative, NaN or infinity made every
call fail before sending ("nothing sent", retried for 24 hours, then parked), and a deadline
near the relay's 60 s lease let its next claim take the intent over from its own call still in
flight (reconciled, or, without a check_url, parked) -- now a clear
InvalidOption when the target is made, at import of the handlers module that registers it.
"""

import pytest

from jobs.core.exceptions import InvalidOption
from jobs.effects.outbox import RELAY_LEASE_SECONDS
from jobs.effects.webhook import MAX_TIMEOUT, WebhookTarget


@pytest.mark.parametrize(
    "timeout", [0, -1.0, float("nan"), float("inf"), 120, MAX_TIMEOUT + 0.1, "10", True, None]
)
def test_a_webhook_deadline_that_is_no_bounded_number_of_seconds_is_refused(timeout):
    with pytest.raises(InvalidOption, match=r"seconds, more than 0 and at most"):
        WebhookTarget(timeout=timeout)


@pytest.mark.parametrize("timeout", [0.05, 1, 10.0, MAX_TIMEOUT])
def test_a_webhook_deadline_within_the_bound_is_kept(timeout):
    assert WebhookTarget(timeout=timeout).timeout == float(timeout)


def test_the_longest_deadline_is_well_within_the_relays_lease():
    assert 2 * MAX_TIMEOUT < RELAY_LEASE_SECONDS


def test_the_webhooks_own_deadline_ends_before_the_relays_which_ends_well_inside_its_lease():
    from jobs.effects import outbox, relay, webhook

    # A webhook call is never given up on by the relay while its own deadline runs, and the
    # relay hands a call back with half its lease or more still to go (a pump every poll).
    assert webhook.MAX_TIMEOUT < relay.CALL_DEADLINE <= outbox.RELAY_LEASE_SECONDS / 2
