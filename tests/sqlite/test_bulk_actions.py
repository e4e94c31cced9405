"""Bulk operator actions on the embedded SQLite default: chunks by cursor, each with its audit;
an id no INTEGER holds is "no such job", as on PostgreSQL."""

from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command

from jobs.core import transitions
from jobs.core.states import JobState
from jobs.models import Job
from jobs.ops import actions


@pytest.mark.django_db(transaction=True)
def test_chunks_commit_with_their_audit_and_an_interrupted_run_goes_on_after_its_cursor(
    make_job, monkeypatch
):
    user = User.objects.create_superuser("root", password="pw")
    monkeypatch.setattr(actions, "CHUNK_ROWS", 2)
    jobs = [make_job() for _ in range(5)] + [make_job(state=JobState.RUNNING, attempt=1)]
    calls = []

    def cancel_until_interrupted(job_id: int, actor: str) -> transitions.OperatorResult:
        calls.append(job_id)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return transitions.cancel(job_id, actor)

    monkeypatch.setitem(actions.ACTIONS, "cancel", cancel_until_interrupted)
    with pytest.raises(KeyboardInterrupt):
        actions.apply("cancel", Job.objects.all(), user=user, via="test")
    cancelled = set(Job.objects.filter(state="cancelled").values_list("id", flat=True))
    assert cancelled == {jobs[0].pk, jobs[1].pk}
    assert set(LogEntry.objects.values_list("object_id", flat=True)) == {str(i) for i in cancelled}
    monkeypatch.setitem(actions.ACTIONS, "cancel", transitions.cancel)
    rest = actions.apply("cancel", Job.objects.all(), user=user, via="test", after=jobs[1].pk)
    assert len(rest.changed) == 4 and Job.objects.filter(state="cancelled").count() == 6
    assert LogEntry.objects.count() == 6


@pytest.mark.django_db
@pytest.mark.parametrize("beyond", [2**63, 10**20])
def test_an_id_no_integer_holds_is_no_such_job_and_the_others_are_done(
    make_job, admin_client, beyond
):
    """It used to raise OverflowError, which ended the CLI's action (job 1 was not cancelled)
    and made the admin's button a 500."""
    job, other = make_job(), make_job()
    out = StringIO()
    call_command("jobs", "cancel", str(job.pk), str(beyond), "--user", "admin", stdout=out)
    assert "cancel: 1 changed, 1 skipped (1 no such job)" in out.getvalue()
    response = admin_client.post(f"/admin/jobs/job/{beyond}/act/cancel/", follow=True)
    assert f"No job {beyond}: nothing to cancel." in response.content.decode()
    assert dict(Job.objects.values_list("pk", "state")) == {
        job.pk: JobState.CANCELLED,
        other.pk: JobState.QUEUED,
    }
