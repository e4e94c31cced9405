"""Acting where you look: the job page's buttons and the jobs list's bulk run (dashboard/actions).

Who may press (anonymous, a read-only viewer, staff without `jobs.change_job`, a user holding it
who is not staff, staff with it), the CSRF refusal, what each action does and how it is audited,
the confirmation in the fence's words, and a bulk run over a filter that goes on, chunk by chunk,
until every matching job is reached.
"""

import json
import threading
import time
from collections.abc import Callable

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from jobs.core import transitions
from jobs.core.exceptions import LeaseLost
from jobs.core.states import JobState
from jobs.core.transitions import Fence
from jobs.models import Job, RejectedWrite
from jobs.ops import actions
from tests.dashboard.conftest import client_for

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def presser(db: None) -> User:
    """Staff who may see the dashboard and change jobs."""
    user = User.objects.create_user("presser", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_dashboard"),
        Permission.objects.get(codename="change_job"),
    )
    return user


@pytest.fixture
def presser_client(presser: User) -> Client:
    return client_for(presser)


def act_url(job: Job, action: str) -> str:
    return reverse("dashboard:job_action", args=[job.pk, action])


# -- who may press --------------------------------------------------------------------------------


def test_anonymous_is_sent_to_login_and_nothing_changes(client: Client, make_job) -> None:
    job = make_job(state=JobState.RUNNING, attempt=1)
    response = client.post(act_url(job, "cancel"))
    assert response.status_code == 302 and "/login/" in response["Location"]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_a_read_only_viewer_may_not_press(operator_client: Client, make_job) -> None:
    job = make_job(state=JobState.RUNNING, attempt=1)
    assert operator_client.get(act_url(job, "cancel")).status_code == 403
    assert operator_client.post(act_url(job, "cancel")).status_code == 403
    page = operator_client.get(reverse("dashboard:job", args=[job.pk])).content.decode()
    assert 'id="action-cancel"' not in page
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and not LogEntry.objects.exists()


def test_staff_without_change_job_may_not_press(staff_client: Client, make_job) -> None:
    job = make_job(state=JobState.FAILED, attempt=1)
    assert staff_client.post(act_url(job, "retry")).status_code == 403
    bulk = staff_client.post(
        reverse("dashboard:bulk"),
        {"action": "retry", "scope": "matching", "step": "run", "upto": job.pk},
    )
    assert bulk.status_code == 403
    page = staff_client.get(reverse("dashboard:jobs")).content.decode()
    assert 'id="bulk-form"' not in page
    job.refresh_from_db()
    assert job.state == JobState.FAILED


def test_a_user_who_is_not_staff_may_not_press_even_with_change_job(
    unstaffed: User, make_job
) -> None:
    job = make_job(state=JobState.FAILED, attempt=1)
    client = client_for(unstaffed)
    page = client.get(reverse("dashboard:job", args=[job.pk])).content.decode()
    assert not [name for name in actions.ACTIONS if f'id="action-{name}"' in page]
    assert 'id="bulk-form"' not in client.get(reverse("dashboard:jobs")).content.decode()
    for name in actions.ACTIONS:
        assert client.get(act_url(job, name)).status_code == 403
        assert client.post(act_url(job, name), {"attempt": 1}, **HTMX).status_code == 403
    for step in ("confirm", "run"):
        fields = {"action": "retry", "scope": "matching", "step": step, "upto": job.pk}
        assert client.post(reverse("dashboard:bulk"), fields).status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.FAILED and Job.objects.count() == 1
    assert not LogEntry.objects.exists()


def test_staff_with_change_job_sees_the_buttons(presser_client: Client, make_job) -> None:
    job = make_job(state=JobState.FAILED, attempt=1)
    page = presser_client.get(reverse("dashboard:job", args=[job.pk])).content.decode()
    for name in actions.ACTIONS:
        assert f'id="action-{name}"' in page
    assert 'id="bulk-form"' in presser_client.get(reverse("dashboard:jobs")).content.decode()


def test_a_post_without_csrf_is_refused(presser: User, make_job) -> None:
    job = make_job(state=JobState.RUNNING, attempt=1)
    client = Client(enforce_csrf_checks=True)
    client.force_login(presser)
    assert client.post(act_url(job, "cancel"), HTMX).status_code == 403
    bulk = client.post(
        reverse("dashboard:bulk"),
        {"action": "cancel", "scope": "matching", "step": "run", "upto": job.pk},
    )
    assert bulk.status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and not LogEntry.objects.exists()


def test_an_unknown_action_is_refused(presser_client: Client, make_job) -> None:
    job = make_job()
    assert presser_client.post(act_url(job, "delete")).status_code == 403


# -- one job --------------------------------------------------------------------------------------


def test_the_confirmation_names_the_running_attempt_and_its_worker(
    presser_client: Client, make_job
) -> None:
    job = make_job(state=JobState.RUNNING, attempt=3, worker="vm:1234")
    text = presser_client.get(act_url(job, "requeue"), **HTMX).content.decode()
    assert "attempt 3 is running on vm:1234; its later writes will be refused" in text
    assert 'name="attempt" value="3"' in text
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # looking changes nothing


def test_requeue_takes_a_running_job_back_and_the_workers_commit_is_refused(
    presser_client: Client, presser: User, make_job
) -> None:
    job = make_job(state=JobState.RUNNING, attempt=3, worker="vm:1234")
    text = presser_client.post(act_url(job, "requeue"), {"attempt": 3}, **HTMX).content.decode()
    assert "Requeue: running -&gt; queued (fenced by attempt 3)" in text
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    with pytest.raises(LeaseLost):
        transitions.commit(Fence(job.pk, 3, "vm:1234"), {"late": True})
    assert RejectedWrite.objects.filter(job=job, attempt_presented=3).exists()
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert entry.user_id == presser.pk
    assert "requeue (dashboard), fenced by attempt 3" in entry.change_message


def test_a_confirmation_for_an_attempt_that_moved_on_asks_again(
    presser_client: Client, make_job
) -> None:
    job = make_job(state=JobState.RUNNING, attempt=4, worker="vm:9")
    text = presser_client.post(act_url(job, "cancel"), {"attempt": 3}, **HTMX).content.decode()
    assert "changed since you looked (now attempt 4)" in text
    assert "attempt 4 is running on vm:9" in text
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and not LogEntry.objects.exists()


def test_cancel_retry_and_copy_report_inline_and_are_audited(
    presser_client: Client, make_job
) -> None:
    queued = make_job()
    failed = make_job(state=JobState.FAILED, attempt=2, payload={"a": 1})
    done = make_job(state=JobState.SUCCEEDED, attempt=1)
    text = presser_client.post(act_url(queued, "cancel"), **HTMX).content.decode()
    assert "Cancel: queued -&gt; cancelled" in text
    text = presser_client.post(act_url(failed, "retry"), **HTMX).content.decode()
    assert "Retry now: failed -&gt; queued (fenced by attempt 2)" in text
    text = presser_client.post(act_url(failed, "copy"), **HTMX).content.decode()
    copy = Job.objects.exclude(pk__in=[queued.pk, failed.pk, done.pk]).get()
    assert f"Copied as job {copy.pk}" in text and copy.payload == {"a": 1}
    text = presser_client.post(act_url(done, "cancel"), **HTMX).content.decode()
    assert "nothing changed (already succeeded)" in text
    messages = sorted(LogEntry.objects.values_list("object_id", "change_message"))
    assert messages == sorted(
        [
            (str(queued.pk), "cancel (dashboard), fenced by attempt 0: queued -> cancelled"),
            (str(failed.pk), "retry (dashboard), fenced by attempt 2: failed -> queued"),
            (str(failed.pk), f"enqueue a copy (dashboard): copied as job {copy.pk}"),
            (str(copy.pk), f"copy of job {failed.pk} (dashboard)"),
        ]
    )


def test_without_javascript_the_action_redirects_to_the_job_with_a_message(
    presser_client: Client, make_job
) -> None:
    job = make_job()
    confirm = presser_client.get(act_url(job, "cancel")).content.decode()
    assert "<html" in confirm and 'id="confirm-action"' in confirm
    response = presser_client.post(act_url(job, "cancel"), follow=True)
    assert response.redirect_chain[-1][0] == reverse("dashboard:job", args=[job.pk])
    assert "Cancel: queued -&gt; cancelled" in response.content.decode()


# -- many jobs ------------------------------------------------------------------------------------


def bulk(client: Client, **fields: object) -> str:
    response = client.post(reverse("dashboard:bulk"), fields, **HTMX)
    assert response.status_code == 200, response.content
    return response.content.decode()


def run_to_the_end(client: Client, fields: dict, total: int, upto: int) -> tuple[str, int]:
    """Press "go on" as the browser's hx-trigger=load does, until the run says it is done."""
    step = {"step": "run", "after": 0, "upto": upto, "total": total, "changed": 0, "skipped": "{}"}
    requests = 0
    while True:
        text = bulk(client, **fields, **step)
        requests += 1
        if 'data-done="1"' in text:
            return text, requests
        assert requests < 100
        step["after"] = int(_hidden(text, "after"))
        step["changed"] = int(_hidden(text, "changed"))
        step["skipped"] = _hidden(text, "skipped").replace("&quot;", '"')


def _hidden(text: str, name: str) -> str:
    marker = f'name="{name}" value="'
    start = text.rindex(marker) + len(marker)
    return text[start : text.index('"', start)]


def test_a_bulk_confirmation_counts_everything_matching_the_filter(
    presser_client: Client, make_job
) -> None:
    for _ in range(3):
        make_job(kind="test.echo", queue="mail")
    make_job(kind="test.echo", queue="mail", state=JobState.RUNNING, attempt=1)
    make_job(kind="test.echo", queue="other")
    text = bulk(presser_client, action="cancel", scope="matching", queue="mail", step="confirm")
    assert 'id="bulk-count">4<' in text and "every job matching queue=mail" in text
    assert "1 of them are running: each running attempt's later writes will be refused" in text
    assert Job.objects.filter(state=JobState.CANCELLED).count() == 0  # counting changes nothing


def test_a_bulk_run_over_a_filter_reaches_every_matching_job_in_chunks(
    presser_client: Client, monkeypatch: pytest.MonkeyPatch, make_job
) -> None:
    """The filter still matches the jobs it changed (kind=, not state=): the old 10,000 cap took
    the same oldest ids again on every run; the cursor goes on past them."""
    monkeypatch.setattr(actions, "CHUNK_ROWS", 4)
    monkeypatch.setattr("dashboard.actions.CHUNK_ROWS", 4)
    jobs = [make_job(kind="test.echo") for _ in range(9)]
    jobs[2] = make_job(kind="test.echo", state=JobState.SUCCEEDED, attempt=1)
    make_job(kind="test.sleep")
    upto = max(j.pk for j in jobs)
    fields = {"action": "cancel", "scope": "matching", "kind": "test.echo"}
    text = bulk(presser_client, **fields, step="confirm")
    assert 'id="bulk-count">10<' in text
    text, requests = run_to_the_end(presser_client, fields, total=10, upto=upto)
    assert requests == 3  # 10 jobs in chunks of 4
    assert 'id="bulk-changed">9<' in text and 'id="bulk-skipped">1<' in text
    assert "1 already succeeded" in text and 'value="10"' in text
    assert Job.objects.filter(kind="test.echo", state=JobState.CANCELLED).count() == 9
    assert Job.objects.get(kind="test.sleep").state == JobState.QUEUED
    assert LogEntry.objects.count() == 9


def test_a_bulk_run_leaves_jobs_created_after_the_confirmation_alone(
    presser_client: Client, make_job
) -> None:
    old = make_job()
    fields = {"action": "cancel", "scope": "matching", "kind": "test.echo"}
    new = make_job()  # arrives after the operator confirmed "1 job"
    run_to_the_end(presser_client, fields, total=1, upto=old.pk)
    assert Job.objects.get(pk=old.pk).state == JobState.CANCELLED
    assert Job.objects.get(pk=new.pk).state == JobState.QUEUED


def test_selected_rows_are_acted_on_alone(presser_client: Client, make_job) -> None:
    a, b, c = make_job(), make_job(), make_job()
    fields = {"action": "cancel", "scope": "selected", "ids": f"{a.pk},{c.pk}"}
    text = bulk(presser_client, **fields, step="confirm")
    assert 'id="bulk-count">2<' in text and "the 2 selected jobs" in text
    run_to_the_end(presser_client, fields, total=2, upto=c.pk)
    states = dict(Job.objects.values_list("pk", "state"))
    assert (states[a.pk], states[b.pk], states[c.pk]) == ("cancelled", "queued", "cancelled")


@pytest.mark.parametrize(
    "fields, error",
    [
        ({"scope": "selected"}, "select some rows first"),
        ({"scope": "selected", "ids": "1,x"}, "ids must be job numbers"),
        ({"scope": "selected", "ids": ",".join(["1"] * 1001)}, "at most 1000 selected rows"),
        ({"scope": "matching", "q": "order"}, "a search cannot be acted on as a whole"),
        ({"scope": "matching", "skipped": json.dumps(["x"])}, "not a report"),
        ({"scope": "matching", "skipped": json.dumps({"x": 2**63})}, "not a report"),
        ({"scope": "matching", "skipped": json.dumps({"x": -1})}, "not a report"),
        ({"scope": "matching", "skipped": json.dumps({"x": True})}, "not a report"),
        ({"scope": "matching", "after": "-1"}, "greater than or equal to 0"),
        ({"scope": "matching", "upto": str(2**63)}, "less than or equal to 9223372036854775807"),
        ({"scope": "matching", "total": str(2**63)}, "less than or equal to 9223372036854775807"),
        ({"scope": "matching", "changed": "-1"}, "greater than or equal to 0"),
    ],
)
def test_bad_bulk_input_gets_a_clear_error_and_changes_nothing(
    presser_client: Client, make_job, fields: dict, error: str
) -> None:
    make_job()
    text = bulk(presser_client, **{"action": "cancel", "step": "run", "upto": 10**6, **fields})
    assert error in text
    assert not Job.objects.filter(state=JobState.CANCELLED).exists()


def test_skip_counts_too_large_to_print_summed_are_refused_not_a_500(
    presser_client: Client, make_job: Callable[..., Job]
) -> None:
    """Each count is a number Python prints (4,300 digits); their sum is not: the progress
    could not be rendered. A count past a bigint is no report."""
    job = make_job()
    huge = int("9" * 4300)
    text = bulk(
        presser_client,
        action="cancel",
        scope="selected",
        ids=str(job.pk),
        step="run",
        upto=job.pk,
        total=3,
        skipped=json.dumps({"a": huge, "b": huge, "c": huge}),
    )
    assert "not a report" in text
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_hostile_skip_reasons_and_filters_render_as_text(
    presser_client: Client, make_job: Callable[..., Job]
) -> None:
    make_job(kind="<b>x</b>")
    text = bulk(
        presser_client,
        action="cancel",
        scope="matching",
        kind="<b>x</b>",
        step="run",
        upto=10**6,
        total=1,
        skipped=json.dumps({"<script>alert(1)</script>": 1}),
    )
    assert "<script>alert(1)" not in text and "&lt;script&gt;" in text
    assert "<b>x</b>" not in text


def test_a_hostile_worker_name_in_a_confirmation_renders_as_text(
    presser_client: Client, make_job: Callable[..., Job]
) -> None:
    """The fence's words name the running attempt's worker, which is whatever the worker wrote."""
    job = make_job(state=JobState.RUNNING, attempt=1, worker="<script>alert(1)</script>")
    for headers in (HTMX, {}):  # the htmx partial, and the confirmation page without JavaScript
        text = presser_client.get(act_url(job, "cancel"), **headers).content.decode()
        assert "<script>alert(1)" not in text
        assert "running on &lt;script&gt;alert(1)&lt;/script&gt;; its later writes" in text


# -- the drill button -----------------------------------------------------------------------------


def test_five_drill_presses_while_a_drill_runs_enqueue_one_drill_job(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from demo import drill

    release = threading.Event()
    monkeypatch.setattr(drill, "run", lambda job_id, timeout=60.0: release.wait(30))
    try:
        responses = [staff_client.post(reverse("dashboard:drill")) for _ in range(5)]
    finally:
        release.set()
        deadline = time.monotonic() + 30
        while drill._running.locked():  # the drill thread ends before the next test
            assert time.monotonic() < deadline
            time.sleep(0.01)  # poll interval of a deadline-bound wait
    (job,) = Job.objects.filter(kind="demo.drill")
    assert {r["Location"] for r in responses} == {reverse("dashboard:job", args=[job.pk])}
    page = staff_client.get(responses[-1]["Location"]).content.decode()
    assert f"A drill is already running (job {job.pk}): nothing enqueued." in page


def test_a_drill_job_live_in_the_database_blocks_another_press(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch, make_job
) -> None:
    """Another server process runs a drill: its job is queued or running, so nothing is added."""
    from demo import drill

    started = []
    monkeypatch.setattr(drill, "run_in_background", started.append)
    other = make_job(kind="demo.drill", state=JobState.RUNNING, attempt=1, unique_key="demo.drill")
    response = staff_client.post(reverse("dashboard:drill"))
    assert response["Location"] == reverse("dashboard:job", args=[other.pk])
    assert Job.objects.filter(kind="demo.drill").count() == 1 and not started


def test_the_drill_command_refuses_while_a_drill_job_is_live(make_job) -> None:
    from django.core.management import CommandError, call_command

    other = make_job(kind="demo.drill", state=JobState.RUNNING, attempt=1, unique_key="demo.drill")
    with pytest.raises(CommandError, match=f"a drill is already running: job {other.pk}"):
        call_command("drill", "--timeout", "1")
    assert Job.objects.filter(kind="demo.drill").count() == 1
