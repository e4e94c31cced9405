"""Promises of docs/operations.md ("Admin and `manage.py jobs`", "Queue controls",
"Retention") that had no test of their own: a copy carries no unique key, adding a job in the
admin needs `jobs.add_job`, queue-control rows are never deleted, and prune keeps a job whose
outbox intent is undelivered."""

import pytest
from django.contrib.auth.models import Permission, User

from jobs.core.states import JobState
from jobs.models import Intent, Job, QueueControl
from jobs.ops import actions, queues, retention
from tests.integration.test_retention import age

pytestmark = pytest.mark.django_db


def _staff(name: str, *codenames: str) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return User.objects.get(pk=user.pk)  # permission cache fresh


def test_a_copy_has_no_unique_key_so_it_runs_beside_the_live_job_that_holds_it(make_job):
    """ "enqueue a copy (through `jobs.enqueue`, validated again; the copy has no unique key)":
    a copy of a live keyed job is a second job, not the duplicate the key would make it."""
    live = make_job(kind="test.echo", payload={"a": 1}, unique_key="order-1")
    finished = make_job(kind="test.echo", state=JobState.FAILED, attempt=1, unique_key="order-2")
    user = _staff("ops", "view_job", "change_job")
    report = actions.apply("copy", [live.pk, finished.pk], user=user, via="test")
    copies = Job.objects.filter(pk__in=[c.new_job_id for c in report.changed])
    assert len(report.changed) == 2 and list(report.skipped) == []
    assert sorted(copies.values_list("unique_key", flat=True), key=str) == [None, None]
    assert live.pk not in {c.pk for c in copies}


def test_adding_a_job_in_the_admin_needs_the_add_job_permission(client):
    """ "Permissions: acting needs staff + `jobs.change_job` ...; adding needs `jobs.add_job`"."""
    client.force_login(_staff("acts", "view_job", "change_job"))
    assert client.get("/admin/jobs/job/add/").status_code == 403
    assert client.post("/admin/jobs/job/add/", {"kind": "test.echo"}).status_code == 403
    client.force_login(_staff("adds", "view_job", "add_job"))
    assert client.get("/admin/jobs/job/add/").status_code == 200
    assert not Job.objects.exists()


def test_queue_control_rows_are_never_deleted_from_the_admin(admin_client):
    """ "Queue controls ... In the admin: ... Rows are never deleted": not even by a superuser,
    neither one by one nor by the bulk action."""
    queues.pause("mail", actor=None)
    row = QueueControl.objects.get(queue="mail")
    page = admin_client.get(f"/admin/jobs/queuecontrol/{row.pk}/delete/")
    assert page.status_code == 403
    deleting = admin_client.post(f"/admin/jobs/queuecontrol/{row.pk}/delete/", {"post": "yes"})
    assert deleting.status_code == 403
    listing = admin_client.get("/admin/jobs/queuecontrol/")
    assert listing.status_code == 200 and b"delete_selected" not in listing.content
    admin_client.post(
        "/admin/jobs/queuecontrol/",
        {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"},
    )
    assert QueueControl.objects.filter(pk=row.pk, paused=True).exists()


def test_prune_keeps_a_job_whose_intent_is_pending_performing_or_failed(make_job):
    """ "nor is a job with an undelivered outbox intent (pending, performing or failed)"; one
    whose intents are all done goes, and its intents with it."""
    owed = {}
    for state in ("pending", "performing", "failed", "done"):
        job = make_job(kind="test.echo", state=JobState.SUCCEEDED, attempt=1)
        Intent.objects.create(
            job=job, attempt=1, step="hook", key=f"{job.pk}:hook", target="webhook", state=state
        )
        age(job, 10)
        owed[state] = job.pk
    assert retention.count(7) == 1
    assert retention.prune(7).jobs == 1
    assert set(Job.objects.values_list("pk", flat=True)) == {
        owed["pending"],
        owed["performing"],
        owed["failed"],
    }
    assert not Intent.objects.filter(job_id=owed["done"]).exists()
