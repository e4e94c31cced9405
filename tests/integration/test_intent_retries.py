"""Intents are not given up in two minutes, can be retried by an operator (admin and
`manage.py jobs intents retry`, audited), and retention never deletes an undelivered one."""

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

import jobs
from jobs.effects import outbox
from jobs.models import Intent, Job, JobEvent
from jobs.ops import retention
from tests.integration.attempts import claim
from tests.receiver import Received, receiver

pytestmark = pytest.mark.django_db(transaction=True)


def _commit_intent(r: Received) -> Intent:
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.intent("publish", "webhook", {"url": f"{r.url}/hook", "json": {}})
    running.commit(None)
    return Intent.objects.get(job_id=running.ctx.job_id)


def _seconds_until_next_try(row: Intent) -> float:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT EXTRACT(EPOCH FROM next_try_at - now()) FROM jobs_intent WHERE id = %s",
            [row.pk],
        )
        return float(cur.fetchone()[0])


def _due(row: Intent, **values: object) -> None:
    Intent.objects.filter(pk=row.pk).update(
        next_try_at=timezone.now() - timedelta(seconds=1), **values
    )


def test_a_refused_intent_is_retried_past_eight_failures_with_a_capped_backoff():
    with receiver() as down:
        down.failing = True  # the target refuses every call (503)
        row = _commit_intent(down)
        _due(row, failures=8)  # what main gave up at: about two minutes of 1-64 s backoff
        assert outbox.relay_once("relay-a") == 1
        row.refresh_from_db()
        assert (row.state, row.failures, row.outcome_unknown) == ("pending", 9, False)
        assert 250 < _seconds_until_next_try(row) <= outbox.BACKOFF_CAP  # 256 s

        _due(row, failures=30)
        outbox.relay_once("relay-a")
        row.refresh_from_db()
        assert row.state == "pending"
        assert outbox.BACKOFF_CAP - 5 < _seconds_until_next_try(row) <= outbox.BACKOFF_CAP


def test_an_intent_is_failed_only_once_its_retry_horizon_has_passed(settings):
    settings.JOBS = {**settings.JOBS, "INTENT_RETRY_HOURS": 1.0}
    with receiver() as down:
        down.failing = True
        row = _commit_intent(down)
        _due(row, retry_since=timezone.now() - timedelta(minutes=59))
        outbox.relay_once("relay-a")
        row.refresh_from_db()
        assert row.state == "pending"
        _due(row, retry_since=timezone.now() - timedelta(minutes=61))
        outbox.relay_once("relay-a")
        row.refresh_from_db()
        assert row.state == "failed"
        assert JobEvent.objects.filter(job_id=row.job_id, type="intent_failed").count() == 1


def _failed_intent(r: Received) -> Intent:
    row = _commit_intent(r)
    Intent.objects.filter(pk=row.pk).update(state="failed", failures=40, last_error="gone")
    return row


def test_an_operator_retries_a_failed_intent_from_the_admin_audited(admin_client, admin_user):
    with receiver() as r:
        row = _failed_intent(r)
        response = admin_client.post(
            "/admin/jobs/intent/",
            {"action": "retry_failed_intents", "_selected_action": [row.pk]},
            follow=True,
        )
        assert "retried 1 failed intents" in response.content.decode().lower()
        row.refresh_from_db()
        assert (row.state, row.failures) == ("pending", 0)
        entry = LogEntry.objects.get(object_id=str(row.job_id))
        assert entry.user_id == admin_user.pk and "retried (admin)" in entry.change_message
        assert JobEvent.objects.filter(job_id=row.job_id, type="intent_retried").exists()
        assert outbox.relay_once("relay-a") == 1
        assert r.verdicts(row.key) == ["performed"]


def test_an_operator_retries_failed_intents_from_the_command_line_audited(admin_user):
    with receiver() as r:
        row = _failed_intent(r)
        out = StringIO()
        call_command(
            "jobs", "intents", "retry", "--failed", "--user", admin_user.username, stdout=out
        )
        assert "retried 1 failed intents" in out.getvalue()
        row.refresh_from_db()
        assert row.state == "pending"
        assert "(cli)" in LogEntry.objects.get(object_id=str(row.job_id)).change_message

        nobody = User.objects.create_user("nobody", password="x")
        Intent.objects.filter(pk=row.pk).update(state="failed")
        with pytest.raises(Exception, match="may not retry"):
            call_command("jobs", "intents", "retry", str(row.pk), "--user", nobody.username)
        assert Intent.objects.get(pk=row.pk).state == "failed"


def _parked_intent(r: Received) -> Intent:
    """A relay died mid-call (outcome unknown) on a webhook without `check_url`: the next relay
    cannot reconcile it, so it parks it `failed` without calling the target."""
    row = _commit_intent(r)
    Intent.objects.filter(pk=row.pk).update(
        state="performing",
        claims=1,
        performs=1,
        outcome_unknown=True,
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    assert outbox.relay_once("relay-a") == 1
    row.refresh_from_db()
    assert (row.state, row.outcome_unknown) == ("failed", True)
    return row


def _operator_retry(via: str, row: Intent, client: Client, user: User, again: bool) -> None:
    if via == "admin":
        action = "perform_failed_intents_again" if again else "retry_failed_intents"
        response = client.post(
            "/admin/jobs/intent/", {"action": action, "_selected_action": [row.pk]}, follow=True
        )
        assert "retried 1 failed intents" in response.content.decode().lower()
    else:
        flags = ["--perform-again"] if again else []
        out = StringIO()
        call_command(
            "jobs", "intents", "retry", str(row.pk), *flags, "--user", user.username, stdout=out
        )
        assert "retried 1 failed intents" in out.getvalue()


@pytest.mark.parametrize("via", ["admin", "cli"])
def test_an_operators_retry_reconciles_an_unknown_outcome_and_only_perform_again_calls(
    via, admin_client, admin_user
):
    with receiver() as r:
        row = _parked_intent(r)

        _operator_retry(via, row, admin_client, admin_user, again=False)
        row.refresh_from_db()
        assert (row.state, row.outcome_unknown) == ("pending", True)
        assert outbox.relay_once("relay-a") == 1  # reconciled first: the target cannot check
        row.refresh_from_db()
        assert (row.state, row.outcome_unknown, row.performs) == ("failed", True, 1)
        assert r.posts() == 0  # parked again, the receiver never called

        _operator_retry(via, row, admin_client, admin_user, again=True)
        row.refresh_from_db()
        assert (row.state, row.outcome_unknown) == ("pending", False)
        assert outbox.relay_once("relay-a") == 1
        row.refresh_from_db()
        assert (row.state, row.reconciled, row.performs) == ("done", False, 2)
        assert r.verdicts(row.key) == ["performed"]  # exactly one call

    messages = list(
        LogEntry.objects.filter(object_id=str(row.job_id))
        .order_by("id")
        .values_list("change_message", flat=True)
    )
    assert messages == [
        f"intent {row.key} retried ({via})",
        f"intent {row.key} performed again without reconciling ({via})",
    ]
    retried = JobEvent.objects.filter(job_id=row.job_id, type="intent_retried").order_by("id")
    assert [e.data["perform_again"] for e in retried] == [False, True]


def test_an_operators_retry_restarts_the_retry_horizon(settings, admin_user):
    settings.JOBS = {**settings.JOBS, "INTENT_RETRY_HOURS": 1.0}
    with receiver() as down:
        down.failing = True  # refuses every call (503)
        row = _commit_intent(down)
        committed_long_ago = timezone.now() - timedelta(hours=2)  # past the horizon
        Intent.objects.filter(pk=row.pk).update(
            state="failed", failures=40, retry_since=committed_long_ago
        )
        call_command(
            "jobs",
            "intents",
            "retry",
            str(row.pk),
            "--user",
            admin_user.username,
            stdout=StringIO(),
        )
        row.refresh_from_db()
        assert row.retry_since > timezone.now() - timedelta(minutes=1)
        assert outbox.relay_once("relay-a") == 1  # refused again: within the new horizon
        row.refresh_from_db()
        assert (row.state, row.failures) == ("pending", 1)

        _due(row, retry_since=timezone.now() - timedelta(minutes=61))  # an hour after the retry
        outbox.relay_once("relay-a")
        row.refresh_from_db()
        assert row.state == "failed"


def test_retention_never_deletes_a_job_with_an_undelivered_intent():
    with receiver() as r:
        pending, failed, done = _commit_intent(r), _failed_intent(r), _commit_intent(r)
        Intent.objects.filter(pk=done.pk).update(state="done")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET finished_at = now() - interval '30 days', "
            "updated_at = now() - interval '30 days'"
        )
    assert retention.count(7) == 1
    report = retention.prune(7)
    assert report.jobs == 1
    assert set(Job.objects.values_list("pk", flat=True)) == {pending.job_id, failed.job_id}
    assert set(Intent.objects.values_list("pk", flat=True)) == {pending.pk, failed.pk}
