"""A webhook's check URL keeps its own query: the relay adds `key` and `token` to it.

Before, the check was `f"{check_url}?key=..&token=.."`: with a query already there
(`/check?auth=s3cret`) the key was swallowed into the receiver's own parameter, and with a
fragment (`/check#frag`) no query was sent at all. A receiver keeping the contract read no key,
answered 404 ("not performed") for an intent it had performed, and the relay performed it again.
Now the check's query is the check_url's own, as written, then `key` and `token`; the fragment
(never sent) is dropped; a check_url already holding `key` or `token` is refused at
`ctx.intent()`, and one stored before that check is parked for an operator, never asked.
"""

from datetime import timedelta
from urllib.parse import parse_qs

import pytest
from django.utils import timezone

import jobs
from jobs.core.exceptions import InvalidOption
from jobs.effects import outbox
from jobs.effects.webhook import WebhookTarget
from jobs.models import Intent
from tests.integration.attempts import claim
from tests.slow_receivers import fencing_receiver

pytestmark = pytest.mark.django_db(transaction=True)

TARGET = "test.check-url-webhook"
outbox.register_target(TARGET, WebhookTarget(timeout=1.0))


def _due_now() -> None:
    Intent.objects.update(next_try_at=timezone.now() - timedelta(seconds=1))


@pytest.mark.parametrize(
    ("suffix", "own"),
    [
        ("?auth=s3cret", "auth=s3cret"),
        ("#frag", ""),
        ("?auth=s3cret#frag", "auth=s3cret"),
        ("?auth=a%20b&empty=", "auth=a%20b&empty="),
    ],
)
def test_a_check_url_with_its_own_query_or_fragment_reconciles_a_timed_out_intent_once(suffix, own):
    with fencing_receiver(hang=5.0) as r:  # performs, then answers too late: outcome unknown
        job = jobs.enqueue("test.echo")
        running = claim("host-a:1")
        data = {"url": f"{r.url}/hook", "check_url": f"{r.url}/check{suffix}", "json": {}}
        running.ctx.intent("publish", TARGET, data)
        running.commit(None)
        key = f"{job.pk}:publish"
        assert outbox.relay_once("relay-a") == 1  # performed, no answer within 1 s: unknown
        _due_now()
        assert outbox.relay_once("relay-a") == 1  # the check finds it: never performed again
        row = Intent.objects.get()
        assert (row.state, row.reconciled, row.performs) == ("done", True, 1)
        assert r.performs(key) == [1]
        (check,) = r.checks
        path, _, query = check.partition("?")
        assert path == "/check"
        assert query.startswith(own)  # the receiver's own parameters, as written
        assert parse_qs(query)["key"] == [key]
        assert parse_qs(query)["token"] == ["2"]


def test_the_check_url_keeps_its_query_as_written_and_drops_its_fragment():
    check = WebhookTarget.check("http://h/c?auth=a%20b&x=#frag", "7:publish", 3)
    assert check == "http://h/c?auth=a%20b&x=&key=7%3Apublish&token=3"
    assert WebhookTarget.check("http://h/c", "7:publish", 3) == "http://h/c?key=7%3Apublish&token=3"


@pytest.mark.parametrize("query", ["?key=mine", "?token=1", "?a=1&key=", "?k%65y=x"])
def test_a_check_url_already_holding_key_or_token_is_refused_at_the_call(query):
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    data = {"url": "http://h/hook", "check_url": f"http://h/check{query}"}
    with pytest.raises(InvalidOption, match="already has"):
        running.ctx.intent("publish", "webhook", data)
    running.commit(None)
    assert not Intent.objects.exists()


def test_a_stored_check_url_holding_key_is_parked_never_performed_again():
    # A row committed before that check: its check would ask about `other`, be told 404, and
    # the relay would perform the intent again.
    with fencing_receiver() as r:
        job = jobs.enqueue("test.echo")
        key = f"{job.pk}:publish"
        data = {"url": f"{r.url}/hook", "check_url": f"{r.url}/check?key=other"}
        Intent.objects.create(
            job=job, attempt=1, step="publish", key=key, target=TARGET, data=data,
            outcome_unknown=True, performs=1, claims=1,
        )  # fmt: skip
        assert outbox.relay_once("relay-a") == 1
        row = Intent.objects.get()
        assert (row.state, row.outcome_unknown, row.performs) == ("failed", True, 1)
        assert "cannot check" in row.last_error
        assert (r.checks, r.performs(key)) == ([], [])
