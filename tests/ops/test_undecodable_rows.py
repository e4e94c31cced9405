"""Raw-SQL rows Python cannot decode (valid jsonb all the same): an operator's action or listing
that meets one refuses that job alone; every other job of the selection is done or shown."""

from collections import Counter
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection

from jobs.core.states import JobState
from jobs.models import Job
from jobs.ops import actions

pytestmark = pytest.mark.django_db

HUGE = '{"n": 1e5000}'  # jsonb keeps all 5,001 digits; Python refuses an int of over 4,300
NESTED = "[" * 5000 + "]" * 5000  # beyond Python's recursion limit


def _stored(job: Job, column: str, text: str) -> int:
    with connection.cursor() as cur:
        cur.execute(f"UPDATE jobs_job SET {column} = %s::jsonb WHERE id = %s", [text, job.pk])
    return job.pk


def test_a_copy_refuses_only_the_job_holding_a_number_python_cannot_read(make_job):
    user = User.objects.create_superuser("root", password="pw")
    good, huge, nested = (make_job(payload={"n": n}) for n in range(3))
    _stored(huge, "payload", HUGE)
    _stored(nested, "payload", NESTED)
    report = actions.apply("copy", [good.pk, huge.pk, nested.pk], user=user, via="test")
    assert [r.job_id for r in report.changed] == [good.pk]
    assert Job.objects.get(pk=report.changed[0].new_job_id).payload == {"n": 0}
    assert report.skipped == Counter(
        {f"refused: {actions.UNDECODABLE_NUMBER}": 1, f"refused: {actions.UNDECODABLE}": 1}
    )
    assert Job.objects.count() == 4
    for action in ("requeue", "cancel", "retry"):  # they never read the payload
        assert actions.apply(action, [good.pk, huge.pk], user=user, via="test").processed == 2


def test_the_admin_and_the_dashboard_copy_the_others_of_a_selection(admin_client, make_job):
    good, huge = make_job(payload={"n": 1}), make_job(payload={"n": 2})
    _stored(huge, "payload", HUGE)
    page = admin_client.post(
        "/admin/jobs/job/",
        {"action": "copy_jobs", "_selected_action": [good.pk, huge.pk]},
        follow=True,
    ).content.decode()
    reason = f"refused: {actions.UNDECODABLE_NUMBER}"
    assert f"copy: 1 changed, 1 skipped (1 {reason})".lower() in page.lower()
    ids = f"{good.pk},{huge.pk}"
    data = {"action": "copy", "scope": "selected", "ids": ids, "step": "run", "upto": huge.pk}
    response = admin_client.post("/jobs/act/", data)
    assert response.status_code == 200 and 'data-done="1"' in response.content.decode()
    assert Job.objects.filter(payload={"n": 1}).count() == 3  # good, and a copy by each
    assert Job.objects.count() == 4


@pytest.mark.parametrize("column", ["payload", "progress", "result"])
def test_the_cli_lists_and_shows_a_row_python_cannot_decode(make_job, column):
    good = make_job(state=JobState.FAILED, attempt=1, payload={"n": 1})
    huge = make_job(state=JobState.FAILED, attempt=1)
    nested = make_job(state=JobState.FAILED, attempt=1)
    _stored(huge, column, HUGE)
    _stored(nested, column, NESTED)
    out = StringIO()
    call_command("jobs", "list", stdout=out)
    listed = [line.split()[0] for line in out.getvalue().splitlines()[1:]]
    assert listed == [str(nested.pk), str(huge.pk), str(good.pk)]
    for job in (huge, nested):
        out = StringIO()
        call_command("jobs", "show", str(job.pk), stdout=out)
        assert out.getvalue().startswith(f"job {job.pk}  test.echo")
