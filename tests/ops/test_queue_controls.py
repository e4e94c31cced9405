"""Queue controls (jobs.ops.queues): durable rows, validated input, audited, resume wakes."""

import re
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from jobs.core.sql.queues import ENQUEUED_CHANNEL, queue_channel
from jobs.models import QueueControl as Row
from jobs.ops import queues
from tests.conftest import raw_connection


@pytest.fixture
def admin_user(db):
    return User.objects.create_superuser("root", password="pw")


@pytest.mark.django_db
def test_pause_and_resume_are_durable_rows_and_report_whether_they_changed(admin_user):
    assert queues.controls() == {}
    assert queues.pause("mail", actor=admin_user) is True
    assert queues.pause("mail", actor=admin_user) is False  # already paused
    assert Row.objects.get(queue="mail").paused
    assert queues.controls() == {"mail": queues.QueueControl(paused=True, limit=None)}
    assert queues.resume("mail", actor=None) is True
    assert queues.resume("mail", actor=None) is False
    assert queues.controls() == {}
    assert Row.objects.get(queue="mail").changed_by.startswith("cli")


@pytest.mark.django_db
def test_a_paused_queue_is_a_control_beside_ten_thousand_queues_resumed_long_ago():
    """A queue's row stays after it is resumed (or its limit removed); controls() read the first
    10,000 rows by name and only then left out those with no control, so past 10,000 queues ever
    controlled (one per tenant) a paused one named after them was not paused on the queues page,
    in the metrics or in `jobs queues`. Found in second review."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs_queuecontrol (queue, paused, concurrency_limit) "
            "SELECT 'tenant-' || lpad(n::text, 5, '0'), false, NULL "
            "FROM generate_series(1, 10000) AS n"
        )
    queues.pause("zz-paused", actor=None)
    assert queues.controls() == {"zz-paused": queues.QueueControl(paused=True, limit=None)}


@pytest.mark.django_db
def test_a_limit_is_set_changed_and_removed(admin_user):
    queues.set_limit("mail", 3, actor=admin_user)
    assert queues.controls()["mail"] == queues.QueueControl(paused=False, limit=3)
    queues.set_limit("mail", None, actor=admin_user)
    assert queues.controls() == {}


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["", "a b", "x" * 65, None, 7, "-lead"])
def test_a_bad_queue_name_is_refused_with_the_rule(name, admin_user):
    with pytest.raises(ValueError, match="not a queue name"):
        queues.pause(name, actor=admin_user)
    with pytest.raises(ValueError, match="not a queue name"):
        queues.set_limit(name, 2, actor=admin_user)
    assert not Row.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("limit", [0, -1, 100_001, 2.5, True, "3"])
def test_a_bad_limit_is_refused_with_the_range(limit, admin_user):
    with pytest.raises(ValueError, match="whole number from 1 to 100000"):
        queues.set_limit("mail", limit, actor=admin_user)
    assert not Row.objects.exists()


@pytest.mark.django_db
def test_a_user_without_permission_may_not_control_queues():
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    with pytest.raises(PermissionError, match="may not control queues"):
        queues.pause("mail", actor=viewer)
    assert not Row.objects.exists()


@pytest.mark.django_db
def test_every_change_by_a_user_is_audited_in_the_admin_log(admin_user):
    queues.pause("mail", actor=admin_user)
    queues.pause("mail", actor=admin_user)  # no change, no entry
    queues.set_limit("mail", 4, actor=admin_user)
    queues.resume("mail", actor=admin_user)
    messages = list(
        LogEntry.objects.filter(object_id="mail")
        .order_by("id")
        .values_list("change_message", flat=True)
    )
    assert messages == ["paused", "concurrency limit none -> 4", "resumed"]


@pytest.mark.django_db(transaction=True)
def test_resume_wakes_the_listeners_of_the_queue_at_commit(admin_user):
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    queues.pause("mail", actor=admin_user)
    listener = raw_connection()
    try:
        listener.execute(f'LISTEN "{queue_channel("mail")}"')
        listener.execute(f"LISTEN {ENQUEUED_CHANNEL}")
        queues.resume("mail", actor=admin_user)
        heard = {(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=2)}
    finally:
        listener.close()
    assert heard == {(queue_channel("mail"), ""), (ENQUEUED_CHANNEL, "mail")}


@pytest.mark.django_db
def test_metrics_show_paused_queues_limits_and_running_jobs_per_queue(client, settings, make_job):
    settings.JOBS_METRICS_TOKEN = "t0ken"
    make_job(state="running", attempt=1, queue="mail")
    make_job(state="running", attempt=1, queue="mail")
    make_job(state="running", attempt=1, queue="default")
    queues.pause("mail", actor=None)
    queues.set_limit("reports", 3, actor=None)
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken")
    samples = {
        (s.name, s.labels.get("queue")): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    assert samples[("jobs_queue_paused", "mail")] == 1
    assert ("jobs_queue_paused", "reports") not in samples
    assert samples[("jobs_queue_concurrency_limit", "reports")] == 3
    assert samples[("jobs_queue_running", "mail")] == 2
    assert samples[("jobs_queue_running", "default")] == 1


@pytest.mark.django_db
def test_a_paused_queue_keeps_its_series_beside_more_limited_queues_than_the_labels(
    client, settings, monkeypatch
):
    # "1 per paused queue": the families were cut from the controlled queues by name, so the
    # first MAX_QUEUE_LABELS limited queues (one per tenant, say) left "zeta", paused, no series.
    from jobs.ops import metrics

    monkeypatch.setattr(metrics, "MAX_QUEUE_LABELS", 2)
    settings.JOBS_METRICS_TOKEN = "t0ken"
    for name in ["alpha", "beta", "gamma"]:
        queues.set_limit(name, 5, actor=None)
    queues.pause("zeta", actor=None)
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken")
    samples = {
        (s.name, s.labels.get("queue")): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    assert samples[("jobs_queue_paused", "zeta")] == 1
    limited = sorted(q for n, q in samples if n == "jobs_queue_concurrency_limit")
    assert limited == ["alpha", "beta"]


def run(*args: str) -> str:
    out = StringIO()
    call_command("jobs", "queues", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_cli_pauses_limits_resumes_and_lists_queues(admin_user, make_job):
    make_job(queue="mail")
    assert "queue mail paused" in run("pause", "mail", "--user", "root")
    assert "was already paused" in run("pause", "mail")
    assert "concurrency limit 2" in run("limit", "mail", "2", "--user", "root")
    listing = run()
    assert re.search(r"mail\s+1\s+0\s+2\s+PAUSED", listing), listing
    assert "queue mail resumed" in run("resume", "mail")
    assert "concurrency limit none" in run("limit", "mail", "none")
    assert re.search(r"mail\s+1\s+0\s+-\s+active", run()), run()
    assert LogEntry.objects.filter(object_id="mail", user=admin_user).count() == 2


@pytest.mark.django_db
def test_the_cli_refuses_bad_input_with_a_clear_error(admin_user):
    with pytest.raises(CommandError, match="whole number or 'none'"):
        run("limit", "mail", "many")
    with pytest.raises(CommandError, match="whole number from 1"):
        run("limit", "mail", "0")
    with pytest.raises(CommandError, match="not a queue name"):
        run("pause", "bad name")
    with pytest.raises(CommandError, match="no Django user"):
        run("pause", "mail", "--user", "nobody")
    assert not Row.objects.exists()


@pytest.mark.django_db
def test_the_admin_pauses_limits_and_resumes_through_the_same_audited_calls(admin_client):
    response = admin_client.post(
        "/admin/jobs/queuecontrol/add/",
        {"queue": "mail", "paused": "on", "concurrency_limit": "4"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert queues.controls() == {"mail": queues.QueueControl(paused=True, limit=4)}
    response = admin_client.post(
        "/admin/jobs/queuecontrol/",
        {"action": "resume_queues", "_selected_action": ["mail"]},
    )
    assert response.status_code == 302
    assert queues.controls() == {"mail": queues.QueueControl(paused=False, limit=4)}
    messages = set(
        LogEntry.objects.filter(object_id="mail").values_list("change_message", flat=True)
    )
    assert messages == {"paused", "concurrency limit none -> 4", "resumed"}
    assert "PAUSED" not in admin_client.get("/admin/jobs/queuecontrol/").content.decode()


@pytest.mark.django_db
def test_the_admin_refuses_a_bad_limit_with_the_range(admin_client):
    response = admin_client.post(
        "/admin/jobs/queuecontrol/add/", {"queue": "mail", "concurrency_limit": "0"}
    )
    assert response.status_code == 200
    assert "whole number from 1 to 100000" in response.content.decode()
    assert not Row.objects.exists()


@pytest.mark.django_db
def test_a_viewer_sees_the_queue_controls_but_may_not_change_them(client):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(viewer)
    assert client.get("/admin/jobs/queuecontrol/").status_code == 200
    assert client.get("/admin/jobs/queuecontrol/add/").status_code == 403
