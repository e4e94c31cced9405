"""Settings read from the environment: a list tolerates the spaces people type after commas, and a
value the settings cannot use stops every entry point with a message naming the variable, its
value and the form expected -- never a bare traceback, a silent default or a server that answers
400 to every request. Real subprocesses, as an operator starts them."""

import logging
import subprocess
from pathlib import Path

import pytest

from tests.unit import test_startup as startup

KEY = "settings-env-test-key-" + "k" * 40
# Every variable these tests set, unset unless a test gives it (the runner's own must not leak).
OURS = {
    "SECRET_KEY",
    "DJANGO_DEBUG",
    "ALLOWED_HOSTS",
    "DJANGO_HTTPS",
    "DJANGO_HSTS_SECONDS",
    "DJANGO_CSRF_TRUSTED_ORIGINS",
    "PG_CONNECT_TIMEOUT",
    "JOBS_WORKERS",
    "LOGIN_FAILURE_LIMIT",
    "LOGIN_COOLOFF_MINUTES",
    "LOGIN_LOCKOUT_BY",
    "Q_POLL",
    "Q_TIMEOUT",
    "Q_RETRY",
    "Q_LOG_LEVEL",
    "JOBS_LOG_LEVEL",
    "JOBS_LOG_FORMAT",
    "EMAIL_URL",
    "EMAIL_TIMEOUT",
    "DEFAULT_FROM_EMAIL",
}


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`python *args` as tests/unit/test_startup.py runs it (an embedded SQLite file of this
    test's own, no `.env`), with none of OURS but those the test gives, and KEY unless it gives
    one."""
    return startup.run(args, tmp_path, unset=frozenset(OURS), **{"SECRET_KEY": KEY, **env})


def printed(tmp_path: Path, script: str, **env: str) -> str:
    done = run(["-c", f"import django; django.setup(); {script}"], tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


# -- lists: `a, b` is two items --------------------------------------------------------------


def test_spaced_allowed_hosts_are_stripped_and_a_request_to_each_is_served(tmp_path):
    script = (
        "from django.conf import settings; from django.test import Client; "
        "print(settings.ALLOWED_HOSTS); "
        "print(*(Client(HTTP_HOST=h).get('/login/').status_code "
        "for h in ('a.example.com', '127.0.0.1')))"
    )
    out = printed(tmp_path, script, ALLOWED_HOSTS=" a.example.com , 127.0.0.1,, ")
    assert out.splitlines() == ["['a.example.com', '127.0.0.1']", "200 200"]


def test_spaced_csrf_trusted_origins_and_lockout_keys_are_stripped(tmp_path):
    script = (
        "from django.conf import settings as s; "
        "print(s.CSRF_TRUSTED_ORIGINS); print(s.AXES_LOCKOUT_PARAMETERS)"
    )
    out = printed(
        tmp_path,
        script,
        DJANGO_CSRF_TRUSTED_ORIGINS="https://a.example.com , https://b.example.com",
        LOGIN_LOCKOUT_BY="username + ip_address, ip_address",
    )
    assert out.splitlines() == [
        "['https://a.example.com', 'https://b.example.com']",
        "[['username', 'ip_address'], ['ip_address']]",
    ]


def test_unset_or_blank_numbers_take_their_defaults(tmp_path):
    script = (
        "from django.conf import settings as s; "
        "print(s.JOBS_WORKERS, s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME, s.SECURE_HSTS_SECONDS, "
        "s.Q_CLUSTER['poll'], s.Q_CLUSTER['timeout'], s.Q_CLUSTER['retry'])"
    )
    assert printed(tmp_path, script) == "2 5 0:15:00 0 0.05 1800 1860"
    assert printed(tmp_path, script, JOBS_WORKERS=" ", Q_POLL="") == "2 5 0:15:00 0 0.05 1800 1860"
    spaced = printed(tmp_path, script, JOBS_WORKERS=" 3 ", LOGIN_COOLOFF_MINUTES=" 1.5 ")
    assert spaced == "3 5 0:01:30 0 0.05 1800 1860"


# -- a bad value stops every entry point, naming what to set ----------------------------------

BAD_VALUES = [
    ("DJANGO_HSTS_SECONDS", "1h"),
    ("DJANGO_HSTS_SECONDS", "-1"),
    ("PG_CONNECT_TIMEOUT", "x"),
    ("PG_CONNECT_TIMEOUT", "0"),  # libpq: wait for ever
    ("JOBS_WORKERS", "two"),
    ("JOBS_WORKERS", "0"),
    ("LOGIN_FAILURE_LIMIT", "-1"),  # axes would refuse every login before its first try
    ("LOGIN_FAILURE_LIMIT", "0"),
    ("LOGIN_FAILURE_LIMIT", "5.5"),
    ("LOGIN_COOLOFF_MINUTES", "nan"),
    ("LOGIN_COOLOFF_MINUTES", "inf"),
    ("LOGIN_COOLOFF_MINUTES", "-5"),
    ("LOGIN_COOLOFF_MINUTES", "0"),  # axes would never lock anyone out
    ("LOGIN_COOLOFF_MINUTES", "15m"),
    ("LOGIN_LOCKOUT_BY", "ip_adress"),  # axes: a 500 on every login attempt
    ("LOGIN_LOCKOUT_BY", ","),
    ("Q_POLL", "fast"),
    ("Q_POLL", "nan"),
    ("Q_TIMEOUT", "30m"),
    ("Q_RETRY", "-1"),
    ("DJANGO_HTTPS", "ture"),  # was False: a production without HTTPS settings, silently
    ("DJANGO_DEBUG", "maybe"),
    ("JOBS_LOG_LEVEL", "verbose"),  # was logging's ValueError traceback at start
    ("Q_LOG_LEVEL", "WARN "),
    ("JOBS_LOG_FORMAT", "jsn"),  # was text lines, silently
    ("EMAIL_URL", "https://mail.example.com"),
    ("EMAIL_URL", "smtp://mail.example.com:twentyfive"),
    ("EMAIL_TIMEOUT", "0"),
    ("EMAIL_TIMEOUT", "30s"),
]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES, ids=[f"{n}={v}" for n, v in BAD_VALUES])
def test_a_bad_value_refuses_to_start_naming_the_variable_and_the_value(tmp_path, name, value):
    done = run(["manage.py", "check"], tmp_path, **{name: value})
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"Palisade refuses to start: {name}={value!r}: expected " in done.stderr, done.stderr
    assert "Traceback" not in done.stderr  # a message, not a crash


@pytest.mark.parametrize(
    "entry",
    [["-c", "import config.asgi"], ["-c", "import config.wsgi"], ["manage.py", "qcluster"]],
    ids=["asgi", "wsgi", "qcluster"],
)
def test_every_entry_point_refuses_a_bad_value(tmp_path, entry):
    done = run(entry, tmp_path, JOBS_WORKERS="two")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "JOBS_WORKERS='two': expected a whole number from 1 to 256" in done.stderr
    assert "Traceback" not in done.stderr


def test_log_levels_and_format_are_read_in_any_case(tmp_path):
    script = (
        "import logging; from django.conf import settings; "
        "print(logging.getLogger('jobs').level, settings.Q_CLUSTER['log_level'], "
        "settings.LOGGING['handlers']['console']['formatter'])"
    )
    out = printed(
        tmp_path, script, JOBS_LOG_LEVEL="warning", Q_LOG_LEVEL=" Error ", JOBS_LOG_FORMAT="JSON"
    )
    assert out == f"{logging.WARNING} ERROR json"
    assert printed(tmp_path, script) == f"{logging.INFO} WARNING line"


MAILER = "from django.conf import settings; print(settings.MAILERS['default'])"


def test_the_mailer_is_read_from_email_url_with_a_timeout(tmp_path):
    out = printed(tmp_path, MAILER, EMAIL_URL="smtp+tls://ops%40x:s3cret@mail.example.com:2525")
    assert eval(out) == {  # noqa: S307  our own repr of a dict of plain values
        "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {
            "host": "mail.example.com",
            "port": 2525,
            "username": "ops@x",
            "password": "s3cret",
            "use_tls": True,
            "use_ssl": False,
            "timeout": 30.0,
        },
    }
    plain = eval(printed(tmp_path, MAILER, EMAIL_TIMEOUT="2.5"))  # noqa: S307
    assert plain["OPTIONS"] | {"timeout": None} == {
        "host": "localhost", "port": 25, "username": "", "password": "", "use_tls": False,
        "use_ssl": False, "timeout": None,
    }  # fmt: skip
    assert plain["OPTIONS"]["timeout"] == 2.5
    console = eval(printed(tmp_path, MAILER, DJANGO_DEBUG="1"))  # noqa: S307
    assert console == {"BACKEND": "django.core.mail.backends.console.EmailBackend"}


def test_a_bad_email_url_is_named_without_its_password(tmp_path):
    done = run(["manage.py", "check"], tmp_path, EMAIL_URL="https://ops:s3cret@mail.example.com")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "EMAIL_URL='https://(hidden)': expected smtp://" in done.stderr, done.stderr
    assert "s3cret" not in done.stderr


def test_a_mail_server_that_never_answers_fails_the_send_within_email_timeout(tmp_path):
    # A listening socket that accepts (the kernel's backlog) and never sends SMTP's greeting:
    # with no timeout the send waited for ever (a handler held until its execution timeout).
    script = (
        "import socket, time; from django.core import mail; "
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8); "
        "from django.conf import settings; "
        "settings.MAILERS['default']['OPTIONS']['port'] = s.getsockname()[1]; "
        "began = time.monotonic()\n"
        "try:\n"
        "    mail.send_mail('s', 'b', 'a@example.com', ['b@example.com'])\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__, round(time.monotonic() - began, 1))"
    )
    out = printed(tmp_path, script, EMAIL_URL="smtp://127.0.0.1:25", EMAIL_TIMEOUT="0.5")
    name, seconds = out.split()
    assert name in {"TimeoutError", "SMTPServerDisconnected"}, out
    assert 0.4 <= float(seconds) < 5, out


def test_a_long_bad_value_is_shown_cut(tmp_path):
    done = run(["manage.py", "check"], tmp_path, Q_TIMEOUT="9" * 5000)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"Q_TIMEOUT={'9' * 60!r}...: expected a whole number" in done.stderr
    assert "9" * 61 not in done.stderr


# -- SECRET_KEY ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["", " ", " \t\n "], ids=["empty", "space", "whitespace"])
def test_a_blank_secret_key_is_refused_like_a_missing_one(tmp_path, key):
    done = run(["manage.py", "check"], tmp_path, SECRET_KEY=key)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "SECRET_KEY is not set and DEBUG is off" in done.stderr
    assert "Traceback" not in done.stderr


def test_in_debug_a_blank_secret_key_means_the_development_key(tmp_path):
    script = "from django.conf import settings; print(settings.SECRET_KEY)"
    out = printed(tmp_path, script, SECRET_KEY="  ", DJANGO_DEBUG="1")
    assert out == "palisade-insecure-development-key-change-me"
