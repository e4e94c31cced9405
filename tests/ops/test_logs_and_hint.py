"""One structured line per rejected write and per reclaim; the lease-tuning hint."""

import json
import logging
import math
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.core import transitions
from jobs.core.exceptions import LeaseLost
from jobs.core.states import JobState
from jobs.core.transitions import Fence, operator
from jobs.models import Attempt, JobEvent, RejectedWrite
from jobs.ops.lease_hint import lease_hints
from jobs.ops.logs import JsonFormatter
from jobs.worker.reaper import reap

pytestmark = pytest.mark.django_db


def _json_lines(caplog, event):
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(r)) for r in caplog.records]
    return [line for line in lines if line.get("event") == event]


def test_a_rejected_write_logs_one_json_line_with_its_evidence(make_job, caplog):
    job = make_job(kind="test.echo", state=JobState.RUNNING, attempt=3)
    with caplog.at_level(logging.WARNING, logger="jobs.fencing"), pytest.raises(LeaseLost):
        transitions.commit(Fence(job.pk, 2, "host-z:9"), {"late": True})
    (line,) = _json_lines(caplog, "stale_write_rejected")
    assert line["job_id"] == job.pk and line["kind"] == "test.echo"
    assert (line["write"], line["attempt_presented"], line["attempt_current"]) == ("commit", 2, 3)
    assert line["worker"] == "host-z:9" and "lateness_seconds" in line


def test_a_reclaim_logs_its_evidence(make_job, caplog):
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-2, worker="host-a:1")
    with caplog.at_level(logging.WARNING, logger="jobs.fencing"):
        assert reap("reaper:1") == 1
    (line,) = _json_lines(caplog, "reclaim")
    assert line["job_id"] == job.pk and line["worker"] == "host-a:1"
    assert line["lease_expires_at"] and "last_heartbeat" in line
    event = JobEvent.objects.get(job=job, type="expired")
    assert event.data["lease_expires_at"] == line["lease_expires_at"]


def _ended(make_job, kind, gap, outcome="succeeded", n=5):
    for _ in range(n):
        job = make_job(kind=kind, state=JobState.SUCCEEDED, attempt=1)
        Attempt.objects.create(
            job=job,
            number=1,
            worker="w:1",
            claimed_at=job.created_at,
            outcome=outcome,
            heartbeat_gap_max=gap,
        )
        JobEvent.objects.create(job=job, attempt=1, type=outcome, worker="w:1")


def test_the_hint_says_the_lease_is_too_short_when_healthy_gaps_approach_it(make_job):
    _ended(make_job, "test.echo", gap=2.0)  # default lease 30 s: fine
    _ended(make_job, "test.sleep", gap=19.0)  # 19 s without a beat against 30 s
    hints = {h.kind: h for h in lease_hints()}
    assert not hints["test.echo"].too_short and not hints["test.echo"].advice
    assert hints["test.sleep"].too_short
    assert "19.0 s without a heartbeat" in hints["test.sleep"].advice


def test_the_hint_does_not_blame_the_lease_for_long_stalls(make_job):
    _ended(make_job, "test.sleep", gap=600.0, outcome="expired", n=2)
    (hint,) = lease_hints()
    assert not hint.too_short and "would not have saved them" in hint.advice


def test_the_hint_blames_the_lease_for_expiries_after_short_silences_with_rejected_commits(
    make_job,
):
    _ended(make_job, "test.sleep", gap=40.0, outcome="expired", n=2)  # under 3 x 30 s
    job = make_job(kind="test.sleep", state=JobState.RUNNING, attempt=2)
    RejectedWrite.objects.create(
        job=job,
        write="commit",
        attempt_presented=1,
        attempt_current=2,
        state_current="running",
        worker="w:1",
    )
    (hint,) = lease_hints()
    assert hint.too_short and hint.near_miss_expiries == 2 and hint.rejected_commits == 1
    assert "Consider 90 s" in hint.advice


def test_an_operator_action_logs_one_line_named_after_it(make_job, caplog):
    job = make_job(kind="test.echo", state=JobState.FAILED, attempt=1)
    with caplog.at_level(logging.WARNING, logger="jobs.fencing"):
        assert operator.requeue(job.pk, "alice").changed
    (line,) = _json_lines(caplog, "operator_requeue")
    assert (line["job_id"], line["attempt"], line["state_before"], line["by"]) == (
        job.pk,
        1,
        "failed",
        "alice",
    )


def test_jobs_log_format_json_prints_one_json_object_a_line():
    """The settings' console handler, switched by the variable, in a process of its own."""
    script = (
        "import logging; f = {'event': 'operator_cancel', 'action': 'cancel', 'job_id': 7}; "
        "logging.getLogger('jobs.fencing').warning('operator %(action)s', f, extra={'fields': f})"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "PALISADE_ENV_FILE": "none"}
    env |= {"SECRET_KEY": secrets.token_urlsafe(64), "JOBS_LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {script}"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (line,) = [json.loads(text) for text in done.stderr.splitlines() if text.strip()]
    assert (line["event"], line["job_id"], line["message"]) == (
        "operator_cancel",
        7,
        "operator cancel",
    )


def _strict(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    text.encode()  # what a UTF-8 stream (a file, a pipe) must be able to carry
    return json.loads(text, parse_constant=refuse)


def test_the_json_formatter_writes_json_whatever_the_fields_hold():
    cycle: list = []
    cycle.append(cycle)
    fields = {
        "gap": math.nan,
        "lateness": math.inf,
        "by_pair": {(1, 2): 3},
        "cycle": cycle,
        "text": "lone \ud800",
        "job_id": 7,
    }
    record = logging.LogRecord("jobs.x", logging.WARNING, __file__, 1, "m %s", ("\udcff",), None)
    record.fields = fields
    line = _strict(JsonFormatter().format(record))
    assert line["job_id"] == 7 and line["gap"] == "nan" and line["lateness"] == "inf"
    assert line["by_pair"] == "{(1, 2): 3}" and line["cycle"] == "[[...]]"
    assert line["text"] == "lone \ud800" and line["message"] == "m \udcff"


# What a peer may answer: a line break that starts a forged line, and a CSI sequence that would
# clear the operator's terminal.
HOSTILE = "502 bad gateway\n2026-12-07 WARNING jobs.fencing stale commit rejected: job=1\x1b[2J"


def _console_lines(records: list[logging.LogRecord]) -> list[str]:
    """The records as the settings' console handler (the text format, `bin/run`'s) writes them."""
    (console,) = logging.getLogger("jobs").handlers
    return [console.format(record) for record in records]


class _FailsWithThePeersText:
    def perform(self, key: str, data: object) -> None:
        raise RuntimeError(HOSTILE)

    def reconcile(self, key: str, data: object) -> bool | None:
        return None


@pytest.mark.django_db(transaction=True)
def test_a_peers_error_text_reaches_the_text_console_as_one_printable_line(monkeypatch, caplog):
    import jobs
    from jobs.effects import outbox, targets
    from tests.integration.attempts import claim

    monkeypatch.setitem(targets._targets, "test.peer-text", _FailsWithThePeersText())
    monkeypatch.setitem(targets._takes_token, ("test.peer-text", "perform"), False)
    monkeypatch.setitem(targets._takes_token, ("test.peer-text", "reconcile"), False)
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.intent("publish", "test.peer-text", {})
    running.commit(None)
    with caplog.at_level(logging.INFO, logger="jobs.outbox"):
        assert outbox.relay_once("relay-a") == 1
    (line,) = [t for t in _console_lines(caplog.records) if "retried" in t]
    assert "\n" not in line and "\x1b" not in line
    assert line.endswith(
        "RuntimeError: 502 bad gateway\\x0a2026-12-07 WARNING jobs.fencing "
        "stale commit rejected: job=1\\x1b[2J"
    )


def test_a_rejected_writes_resource_reaches_the_text_console_on_its_line(make_job, caplog):
    """A token write's resource names the application's rows by key, and a text key may hold
    anything a user typed."""
    from jobs.core.states import Write
    from jobs.effects.fenced import record_rejection

    job = make_job(kind="test.echo", state=JobState.RUNNING, attempt=3)
    with caplog.at_level(logging.WARNING, logger="jobs.fencing"):
        record_rejection(Fence(job.pk, 2, "host-z:9"), Write.TOKEN, f"app.Doc:{HOSTILE}", None)
    (line,) = _console_lines(caplog.records)
    assert "\n" not in line and "\x1b" not in line
    assert "attempt_presented=2 attempt_current=3 resource=app.Doc:502 bad gateway\\x0a" in line


def test_a_traceback_on_the_text_console_keeps_its_lines_and_escapes_the_rest():
    try:
        raise RuntimeError(HOSTILE)
    except RuntimeError:
        record = logging.LogRecord("jobs.outbox", logging.ERROR, __file__, 1, "failed", (), None)
        record.exc_info = sys.exc_info()
    (text,) = _console_lines([record])
    assert "\x1b" not in text
    lines = text.splitlines()
    assert (
        lines[0].endswith("ERROR jobs.outbox failed")
        and lines[1] == "  Traceback (most recent call last):"
    )
    assert lines[-2:] == [
        "  RuntimeError: 502 bad gateway",
        "  2026-12-07 WARNING jobs.fencing stale commit rejected: job=1\\x1b[2J",
    ]


def _hostile_exc_record() -> logging.LogRecord:
    try:
        raise RuntimeError(HOSTILE)
    except RuntimeError:
        record = logging.LogRecord("jobs.outbox", logging.ERROR, __file__, 1, "failed", (), None)
        record.exc_info = sys.exc_info()
    return record


def test_no_line_of_a_traceback_on_the_text_console_can_pass_for_a_record():
    """An exception's message is a peer's text too: its line breaks are kept with the traceback's,
    and the line after one began at the first column, where only a record begins. Each line of a
    traceback (and of a stack) is indented under its record. Found in second review."""
    record = _hostile_exc_record()
    record.stack_info = "Stack (most recent call last):\n  File x\n" + HOSTILE
    (text,) = _console_lines([record])
    first, *rest = text.splitlines()
    assert first.endswith("ERROR jobs.outbox failed") and len(rest) > 4
    assert all(line.startswith("  ") for line in rest), rest


def test_a_traceback_another_handler_formatted_first_is_still_escaped():
    """logging.Formatter keeps the traceback's text on the record (exc_text) for the next
    handler: a plain handler's, ESC and all, was written to the console as it was."""
    record = _hostile_exc_record()
    assert "\x1b" in logging.Formatter().format(record)  # e.g. a file handler of the site's
    (text,) = _console_lines([record])
    assert "\x1b" not in text and "\\x1b[2J" in text


class _FieldsError(Exception):
    """An API error whose fields live in a dict: a name it lacks (`__notes__`, which formatting
    its traceback reads) is a KeyError, not an AttributeError."""

    def __init__(self, fields: dict) -> None:  # type: ignore[type-arg]
        super().__init__("the API said no\x1b[2J")
        self.fields = fields

    def __getattr__(self, name: str) -> object:
        return self.fields[name]


def test_a_traceback_python_cannot_format_is_written_not_lost():
    """An application's exception (an on_finished hook's, an outbox target's) whose own code
    raises while its traceback is formatted: logging.Formatter.formatException raised out of
    format(), and the record was lost to "--- Logging error ---", in both formats. Each writes
    it as a failed job's error is written (bounds.exception_text)."""
    try:
        raise _FieldsError({"status": 402})
    except _FieldsError:
        record = logging.LogRecord(
            "jobs.reaper", logging.ERROR, __file__, 1, "hook failed", (), None
        )
        record.exc_info = sys.exc_info()
    (text,) = _console_lines([record])
    first, *rest = text.splitlines()
    assert first.endswith("ERROR jobs.reaper hook failed")
    assert all(line.startswith("  ") for line in rest), rest
    assert rest[-1] == f"  {__name__}._FieldsError: the API said no\\x1b[2J"
    exc = json.loads(JsonFormatter().format(record))["exc"]
    assert exc.endswith(f"{__name__}._FieldsError: the API said no\x1b[2J")


class _Unprintable:
    def __str__(self) -> str:
        raise ValueError("no text")

    def __repr__(self) -> str:
        raise ValueError("no repr")


@pytest.mark.parametrize(
    ("msg", "args", "shown"),
    [
        ("%d jobs reclaimed on %s", ("many", "host\x1b[2J"), "'%d jobs reclaimed on %s'"),
        ("%s and %s", ("one",), "'%s and %s'"),
        (_Unprintable(), (), "_Unprintable"),
    ],
)
def test_a_record_whose_message_cannot_be_formatted_is_written_not_lost(msg, args, shown):
    """logging.Formatter raised out of format() for a message whose args do not fit (or whose
    text raises): the handler printed "--- Logging error ---" and the record was lost, in both
    formats. Each writes what it holds instead. Found in second review."""
    record = logging.LogRecord("jobs.reaper", logging.WARNING, __file__, 1, msg, args, None)
    (line,) = _console_lines([record])
    assert "WARNING jobs.reaper" in line and shown in line
    assert "\n" not in line and "\x1b" not in line
    assert shown in json.loads(JsonFormatter().format(record))["message"]


# A line separator ends the line in many a viewer (and for str.splitlines); a bidi override or
# isolate shows the rest of the line reordered ("Trojan Source"); NEL is C1.
UNSEEN = "ok\u2028WARNING forged\u2029\u202eevil\u202c \u2066x\u2069 \u0085done"
SEEN = "ok\\u2028WARNING forged\\u2029\\u202eevil\\u202c \\u2066x\\u2069 \\x85done"


def test_line_separators_and_bidi_controls_reach_the_text_console_escaped():
    record = logging.LogRecord("jobs.outbox", logging.WARNING, __file__, 1, "%s", (UNSEEN,), None)
    (line,) = _console_lines([record])
    assert len(line.splitlines()) == 1
    assert not any(c in line for c in "\u2028\u2029\u202e\u202c\u2066\u2069\u0085")
    assert line.endswith(f"WARNING jobs.outbox {SEEN}")


def test_a_line_separator_in_a_traceback_cannot_start_a_line_of_its_own():
    try:
        raise RuntimeError(UNSEEN)
    except RuntimeError:
        record = logging.LogRecord("jobs.outbox", logging.ERROR, __file__, 1, "failed", (), None)
        record.exc_info = sys.exc_info()
    (text,) = _console_lines([record])
    first, *rest = text.splitlines()
    assert first.endswith("ERROR jobs.outbox failed")
    assert all(line.startswith("  ") for line in rest), rest
    assert rest[-1] == f"  RuntimeError: {SEEN}"


def test_a_json_line_holding_line_separators_is_one_line_and_the_same_json():
    record = logging.LogRecord("jobs.outbox", logging.WARNING, __file__, 1, "%s", (UNSEEN,), None)
    line = JsonFormatter().format(record)
    assert len(line.splitlines()) == 1
    assert not any(c in line for c in "\u2028\u2029\u202e\u202c\u2066\u2069\u0085")
    assert json.loads(line)["message"] == UNSEEN


@pytest.mark.parametrize("hostile", ["\x1b" * 100_000, "中\x1b" * 50_000, "\u2028\u202e" * 50_000])
def test_escaping_a_long_hostile_message_makes_no_python_call_per_character(hostile):
    """A regex sub called a Python function per control character: a message of 2,000,000 of
    them took 1.7 s to format. Counted in calls (a profiler's), not seconds: a loaded machine
    slows both alike."""
    from jobs.ops.logs import printable

    calls = 0

    def count(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1

    sys.setprofile(count)
    try:
        line = printable(hostile)
    finally:
        sys.setprofile(None)
    assert calls < 1_000, calls
    assert "\x1b" not in line and "\u2028" not in line and "\u202e" not in line
