"""A webhook URL http.client could never send is refused at `ctx.intent()`, and a call that
fails before any of its request is sent is refused, never unknown.

Before, validate() accepted a space, a control character (DEL, a tab, CR LF) or a non-ASCII
character in a URL's path or query; http.client refuses them when it writes the request line
(InvalidURL, or a UnicodeEncodeError nothing caught), before a byte is sent, and the relay
recorded that as an unknown outcome: parked `failed` without a check_url, reconciled and sent
again and again with one. Percent-encoded paths and IDN host names are sent, and accepted.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

import jobs
from jobs.core.exceptions import InvalidOption
from jobs.effects import outbox
from jobs.effects.exchange import Call
from jobs.effects.webhook import Refused, WebhookTarget
from jobs.models import Intent
from tests.integration.attempts import claim
from tests.receiver import receiver

pytestmark = pytest.mark.django_db(transaction=True)

UNSENDABLE = ["/a b", "/caf\u00e9", "/x?q=\u00e9", "/x\x7f", "/x\ty", "/x\r\nX-Injected: 1"]


@pytest.mark.parametrize("name", ["url", "check_url"])
@pytest.mark.parametrize("path", UNSENDABLE)
def test_a_webhook_url_http_client_could_never_send_is_refused_at_the_call(name, path):
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    data = {"url": "http://h/hook", "check_url": "http://h/check", "json": {}}
    data[name] = f"http://h{path}"
    with pytest.raises(InvalidOption, match=r"percent-encode"):
        running.ctx.intent("publish", "webhook", data)
    running.commit(None)
    assert not Intent.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "http://h/caf%C3%A9?q=%C3%A9#fr%C3%A9",
        "http://b\u00fccher.example/hook",  # an IDN host: resolved and sent in its IDNA form
        "http://h/hook#caf\u00e9",  # a fragment is never sent
        "https://user:p%20w@h:8443/hook?a=1&b=",
    ],
)
def test_a_sendable_url_is_accepted(url):
    WebhookTarget().validate({"url": url, "check_url": url.replace("/hook", "/check")})


@pytest.mark.parametrize("path", ["/caf\u00e9", "/a b"])
def test_an_exchange_that_fails_before_sending_is_refused_and_sends_nothing(path):
    with receiver() as r:
        with pytest.raises(Refused, match="nothing sent"):
            Call(f"{r.url}{path}", 2.0).run("POST", b"{}", {})
        assert r.posts() == 0


def _due_now() -> None:
    Intent.objects.update(next_try_at=timezone.now() - timedelta(seconds=1))


@pytest.mark.parametrize("check", [False, True])
def test_a_stored_url_that_cannot_be_sent_is_refused_never_unknown(check):
    # A row committed before validate() refused such URLs.
    with receiver() as r:
        job = jobs.enqueue("test.echo")
        data = {"url": f"{r.url}/caf\u00e9", "json": {}}
        if check:
            data["check_url"] = f"{r.url}/check"
        Intent.objects.create(
            job=job, attempt=1, step="publish", key=f"{job.pk}:publish", target="webhook",
            data=data,
        )  # fmt: skip
        for _ in range(3):
            assert outbox.relay_once("relay-a") == 1
            _due_now()
        row = Intent.objects.get()
        assert (row.state, row.outcome_unknown, row.failures) == ("pending", False, 3)
        assert row.last_error.startswith("Refused: ")
        assert row.reconciled is False
        assert r.posts() == 0
