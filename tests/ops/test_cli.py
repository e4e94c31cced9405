"""`manage.py jobs ...`: the same fencing, permissions and audit as the admin, as text."""

from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from jobs.core import transitions
from jobs.core.exceptions import LeaseLost
from jobs.core.states import JobState
from jobs.core.transitions import Fence
from jobs.management.commands.jobs import Command
from jobs.models import Attempt, Intent, Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_user(db):
    return User.objects.create_superuser("root", password="pw")


def run(*args: str) -> str:
    out = StringIO()
    call_command("jobs", *args, stdout=out)
    return out.getvalue()


def test_requeue_takes_a_running_job_back_fenced_and_audited(make_job, admin_user):
    job = make_job(state=JobState.RUNNING, attempt=2, worker="host-a:7")
    text = run("requeue", str(job.pk), "--user", "root")
    assert "requeue: 1 changed, 0 skipped" in text and f"job {job.pk} (attempt 2)" in text
    with pytest.raises(LeaseLost):
        transitions.commit(Fence(job.pk, 2, "host-a:7"), None)
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert "(cli), fenced by attempt 2" in entry.change_message


def test_cancel_and_retry_with_filters_report_skips(make_job, admin_user):
    failed = make_job(state=JobState.FAILED, attempt=1, queue="mail")
    make_job(state=JobState.FAILED, attempt=1, queue="other")
    done = make_job(state=JobState.SUCCEEDED, attempt=1, queue="mail")
    text = run("cancel", "--all-matching", "--queue", "mail", "--user", "root")
    assert "cancel: 0 changed, 2 skipped (1 already failed; 1 already succeeded)" in text
    text = run("retry", "--all-matching", "--queue", "mail", "--state", "failed", "--user", "root")
    assert "retry: 1 changed" in text
    failed.refresh_from_db()
    done.refresh_from_db()
    assert (failed.state, done.state) == ("queued", "succeeded")
    assert Job.objects.filter(queue="other", state="failed").count() == 1


def test_a_user_without_permission_is_refused(make_job):
    User.objects.create_user("viewer", password="pw", is_staff=True)
    job = make_job(state=JobState.FAILED, attempt=1)
    with pytest.raises(CommandError, match="may not change jobs"):
        run("retry", str(job.pk), "--user", "viewer")
    with pytest.raises(CommandError, match="no Django user"):
        run("retry", str(job.pk), "--user", "nobody")
    job.refresh_from_db()
    assert job.state == "failed"


def test_show_prints_the_attempt_history_with_seconds(make_job):
    job = make_job(kind="test.fail", state=JobState.RUNNING, attempt=2, worker="host-b:2")
    Attempt.objects.create(
        job=job, number=1, worker="host-a:1", claimed_at=job.created_at, outcome="expired"
    )
    text = run("show", str(job.pk))
    assert "max attempts 2 (handler)" in text
    assert "#1   expired" in text and "#2   running" in text and "host-a:1" in text
    assert ":" in text.split("claimed ")[1][:20] and "." in text.split("claimed ")[1][:24]


def test_show_and_list_print_a_handlers_control_characters_escaped(make_job):
    # An attempt's error is a handler's exception text, often holding what the job was given: an
    # ESC sequence in it reached the operator's terminal as it was (retitled the window here,
    # and a terminal's answerback or OSC 52 can do worse). Found in review.
    hostile = "bad input \x1b]0;pwned\x07\x1b[2J\x9b31m"
    job = make_job(kind="test.fail\x1b[8m", state=JobState.FAILED, attempt=1, error=hostile)
    Attempt.objects.create(
        job=job, number=1, worker="host\x1b[1m:1", claimed_at=job.created_at, outcome="failed",
        error=hostile,
    )  # fmt: skip
    for text in (run("show", str(job.pk)), run("list")):
        assert not any(c in text for c in "\x1b\x07\x9b"), text
    shown = run("show", str(job.pk))
    assert "bad input \\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in shown
    assert "test.fail\\x1b[8m" in run("list")


def test_list_and_status(make_job):
    make_job(queue="mail")
    make_job(state=JobState.RUNNING, attempt=1, lease_in=-3)
    listing = run("list", "--queue", "mail")
    assert "queued" in listing and "mail" in listing and "running" not in listing.split("\n", 1)[1]
    status = run("status")
    assert "mail" in status and "leases run out, not yet reclaimed: 1" in status


def test_prune_deletes_old_finished_jobs_and_says_what_it_did(make_job):
    from django.db import connection

    old, recent = make_job(state="succeeded"), make_job(state="failed")
    queued = make_job(state="queued")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET finished_at = clock_timestamp() - interval '40 days', "
            "updated_at = clock_timestamp() - interval '40 days' WHERE id = %s",
            [old.pk],
        )
    assert run("prune", "--older-than-days", "30", "--dry-run").startswith("1 finished jobs")
    assert Job.objects.filter(pk=old.pk).exists()
    out = run("prune", "--older-than-days", "30", "--batch", "10")
    assert out.startswith("pruned 1 finished jobs older than 30 days in 1 batches")
    assert set(Job.objects.values_list("pk", flat=True)) == {recent.pk, queued.pk}
    with pytest.raises(CommandError, match="older_than_days must be between"):
        run("prune", "--older-than-days", "-1")


@pytest.mark.parametrize("beyond", [2**63, 10**20])
def test_an_id_no_bigint_holds_is_no_such_job_and_the_others_are_done(make_job, admin_user, beyond):
    job = make_job()
    text = run("cancel", str(job.pk), str(beyond), "--user", "root")
    assert "cancel: 1 changed, 1 skipped (1 no such job)" in text
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


@pytest.mark.parametrize(
    "args",
    [
        ("list", "--kind", "bad\udcff"),  # invalid UTF-8 in argv becomes a lone surrogate
        ("list", "--queue", "bad\udcff"),
        ("list", "--kind", "nul\x00"),  # call_command can pass what argv cannot
        ("cancel", "1", "--user", "bad\udcff"),
        ("cancel", "--all-matching", "--kind", "bad\udcff", "--user", "root"),
        ("queues", "pause", "default", "--user", "bad\udcff"),
    ],
)
def test_an_argument_the_database_cannot_read_is_a_command_error(admin_user, args):
    with pytest.raises(CommandError, match="lone surrogates|NUL"):
        run(*args)


@pytest.mark.parametrize("bad", ["-5", "0", "-0"])
@pytest.mark.parametrize("command", ["cancel", "requeue", "show"])
def test_an_id_below_one_is_refused_not_silently_skipped(make_job, admin_user, command, bad):
    job = make_job()
    args = ("show", bad) if command == "show" else (command, str(job.pk), bad, "--user", "root")
    with pytest.raises(CommandError, match="not a job id"):
        run(*args)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED  # nothing done: the command stopped before acting


def test_queues_prints_a_hand_inserted_queue_names_control_characters_escaped(make_job):
    # `jobs queues` lists every queue a row names; one inserted by hand (not through enqueue's
    # checks) reached the terminal as it was. Found in review.
    make_job(queue="mail\x1b]0;pwned\x07")
    text = run("queues")
    assert "\x1b" not in text and "\x07" not in text, text
    assert "mail\\x1b]0;pwned\\x07" in text


def test_intents_retry_prints_a_hand_inserted_keys_control_characters_escaped(make_job, admin_user):
    # `jobs intents retry` printed each intent's key from its row as it was: one inserted by hand
    # (not through ctx.intent's step check) acted on the terminal with an ESC sequence, and its
    # \r\n forged a line of the command's output. Found in review.
    job = make_job(state=JobState.SUCCEEDED, attempt=1)
    forged = "\r\n  intent 9:payment (job 9): pending again"
    Intent.objects.create(
        job=job,
        attempt=1,
        step="publish",
        key=f"{job.pk}:publish\x1b]0;pwned\x07{forged}",
        target="webhook",
        data={"url": "http://127.0.0.1:9/hook", "json": {}},
        state=Intent.State.FAILED,
    )
    text = run("intents", "retry", "--failed", "--user", "root")
    assert not any(c in text for c in "\x1b\x07\r"), text
    assert len(text.splitlines()) == 2, text  # the summary, and one line for the one intent
    assert f"{job.pk}:publish\\x1b]0;pwned\\x07\\x0d\\x0a  intent 9:payment" in text


@pytest.mark.django_db(transaction=True)  # run_from_argv closes the connection at its end
def test_a_command_error_naming_a_hand_made_user_reaches_stderr_escaped():
    # A CommandError's message is written to stderr by Django (run_from_argv); a user name from
    # a row, made without the username validator, reached the terminal as it was.
    name = "viewer\x1b]0;pwned\x07"
    User.objects.create_user(name, password="pw", is_staff=True)  # no permission to act
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit):
        Command(stdout=out, stderr=err).run_from_argv(
            ["manage.py", "jobs", "--skip-checks", "intents", "retry", "1", "--user", name]
        )
    assert "may not retry intents" in err.getvalue()
    assert "\x1b" not in err.getvalue() and "viewer\\x1b]0;pwned\\x07" in err.getvalue()


def test_the_commands_output_takes_lazy_text_as_djangos_does_and_escapes_it():
    # Django's OutputWrapper writes a lazy translation (gettext_lazy) as its text; Printable
    # raised TypeError ("expected string or bytes-like object") on it.
    from django.core.management.base import OutputWrapper
    from django.utils.translation import gettext_lazy

    from jobs.management.terminal import Printable

    plain, wrapped = StringIO(), StringIO()
    OutputWrapper(plain).write(gettext_lazy("held \x1b[2J"))
    Printable.around(OutputWrapper(wrapped)).write(gettext_lazy("held \x1b[2J"))
    assert plain.getvalue() == "held \x1b[2J\n"
    assert wrapped.getvalue() == "held \\x1b[2J\n"


@pytest.fixture
def uid_without_a_name(monkeypatch):
    """A process as a container runs it under a uid no passwd entry names, with no USER or
    LOGNAME: what Python's getpass.getuser() meets there (pwd.getpwuid raising KeyError)."""
    import pwd

    for name in ("LOGNAME", "USER", "LNAME", "USERNAME", "JOBS_OPERATOR"):
        monkeypatch.delenv(name, raising=False)

    def unknown(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", unknown)


def test_a_queue_is_paused_from_a_uid_without_a_login_name_and_audited_by_uid(
    uid_without_a_name,
):
    import os

    from jobs.models import QueueControl

    assert run("queues", "pause", "reports").strip() == "queue reports paused"
    row = QueueControl.objects.get(queue="reports")
    assert row.paused and row.changed_by == f"cli (uid {os.getuid()})"


@pytest.mark.parametrize(
    "args", [("cancel", "1"), ("intents", "retry", "--failed")], ids=["cancel", "intents"]
)
def test_an_action_from_a_uid_without_a_login_name_asks_for_user(uid_without_a_name, args):
    with pytest.raises(CommandError, match=r"no Django user 'uid \d+': pass --user"):
        run(*args)
