"""Logins are throttled (django-axes) and production security is switched on from the
environment: `check --deploy` is clean with the documented variables set."""

import io
import os
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.auth.hashers import MD5PasswordHasher
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db.models import F
from django.test import Client, override_settings
from django.urls import reverse

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def log_in(client: Client, password: str) -> int:
    url = reverse("dashboard:login")
    return client.post(url, {"username": "operator", "password": password}).status_code


def test_wrong_passwords_past_the_limit_are_refused_without_hashing(operator: User) -> None:
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    assert [log_in(client, "wrong") for _ in range(limit - 1)] == [200] * (limit - 1)
    assert log_in(client, "wrong") == 429  # the limit-th failure locks
    with (
        mock.patch.object(
            MD5PasswordHasher, "verify", autospec=True, side_effect=MD5PasswordHasher.verify
        ) as verify,
        mock.patch.object(
            MD5PasswordHasher, "encode", autospec=True, side_effect=MD5PasswordHasher.encode
        ) as encode,
    ):
        response = client.post(
            reverse("dashboard:login"), {"username": "operator", "password": "wrong"}
        )
        assert response.status_code == 429
        assert "Too many failed logins" in response.content.decode()
        assert log_in(client, "pw") == 429  # even the right password, until the cool-off
    assert verify.call_count == 0 and encode.call_count == 0  # no CPU spent on a password
    assert "_auth_user_id" not in client.session


def test_a_correct_login_succeeds_again_after_the_cool_off(operator: User) -> None:
    from axes.models import AccessAttempt  # an installed app only with the throttling on

    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "wrong")
    assert log_in(client, "pw") == 429
    # The cool-off passes (the attempts age; no sleeping).
    AccessAttempt.objects.update(
        attempt_time=F("attempt_time") - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )
    assert log_in(client, "pw") == 302
    assert client.session["_auth_user_id"] == str(operator.pk)


def test_a_successful_login_resets_the_count(operator: User) -> None:
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    assert [log_in(client, "wrong") for _ in range(limit - 1)] == [200] * (limit - 1)
    assert log_in(Client(), "pw") == 302  # one right password, from the same address
    assert [log_in(client, "wrong") for _ in range(limit - 1)] == [200] * (limit - 1)
    assert log_in(Client(), "pw") == 302  # 2 * (limit - 1) failures in all: still not locked


def admin_log_in(client: Client, password: str) -> int:
    url = reverse("admin:login")
    return client.post(url, {"username": "staff", "password": password}).status_code


def test_the_admin_login_is_throttled_too(staff: User) -> None:
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    assert admin_log_in(client, "pw") == 302  # the admin's login works, for staff
    client.logout()
    assert [admin_log_in(client, "wrong") for _ in range(limit - 1)] == [200] * (limit - 1)
    assert admin_log_in(client, "wrong") == 429  # the limit-th failure locks, here too
    response = client.post(reverse("admin:login"), {"username": "staff", "password": "pw"})
    assert response.status_code == 429  # even the right password, until the cool-off
    assert "Too many failed logins" in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.parametrize("login", ["dashboard:login", "admin:login"])
@pytest.mark.parametrize("length", [151, 256, 5000])
def test_a_username_longer_than_any_users_gets_the_forms_error_and_reaches_no_table(
    login: str, length: int
) -> None:
    """Before: the name went on to authenticate(), and django-axes' record of the failure did
    not fit its varchar(255) column -- a 500 for anyone, logged in or not."""
    from axes.models import AccessAttempt, AccessFailureLog

    response = Client().post(reverse(login), {"username": "u" * length, "password": "x"})
    assert response.status_code == 200
    assert "Ensure this value has at most 150 characters" in response.content.decode()
    assert not AccessAttempt.objects.exists() and not AccessFailureLog.objects.exists()


def test_a_username_of_150_characters_is_still_checked_and_counted(db: None) -> None:
    from axes.models import AccessAttempt

    response = Client().post(reverse("dashboard:login"), {"username": "u" * 150, "password": "x"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()
    assert AccessAttempt.objects.get().username == "u" * 150


def test_the_lockout_is_per_username_and_address(operator: User) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(Client(), "wrong")
    other = Client(REMOTE_ADDR="10.0.0.9")
    assert log_in(other, "pw") == 302  # the same account from another address still logs in


def _check_deploy(**env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "SECRET_KEY", "ALLOWED_HOSTS"))
    }
    base |= {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PALISADE_ENV_FILE": "none",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": os.environ["DATABASE_URL"],
        **env,
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )


PRODUCTION = {
    "ALLOWED_HOSTS": "ops.example.com",
    "DJANGO_HTTPS": "1",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://ops.example.com",
    "DJANGO_HSTS_INCLUDE_SUBDOMAINS": "1",
    "DJANGO_HSTS_PRELOAD": "1",
}


def test_check_deploy_is_clean_with_the_production_variables_set() -> None:
    result = _check_deploy(**PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_without_them_names_what_is_missing() -> None:
    result = _check_deploy(ALLOWED_HOSTS="ops.example.com")
    assert result.returncode != 0
    for warning in ("W004", "W008", "W012", "W016"):
        assert warning in result.stderr


def test_a_malformed_proxy_header_stops_start_up_with_a_clear_error() -> None:
    result = _check_deploy(**PRODUCTION | {"DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"})
    assert result.returncode != 0
    assert "expected 'HTTP_<HEADER>,<value>'" in result.stderr


def _settings_printed(script: str, **variables: str) -> str:
    """What `script` prints in a process of its own started with config.settings and `variables`
    (the login-throttling variables unset unless given)."""
    unset = ("LOGIN_FAILURE_LIMIT", "LOGIN_COOLOFF_MINUTES", "LOGIN_LOCKOUT_BY")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env |= {"DJANGO_SETTINGS_MODULE": "config.settings", "PALISADE_ENV_FILE": "none"}
    env |= {"SECRET_KEY": secrets.token_urlsafe(64), **variables}
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {script}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def test_the_proxy_settings_reach_django() -> None:
    script = (
        "from django.conf import settings as s; "
        "print(s.SECURE_PROXY_SSL_HEADER, s.CSRF_TRUSTED_ORIGINS, s.SESSION_COOKIE_SECURE, "
        "s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0)"
    )
    out = _settings_printed(script, **PRODUCTION)
    assert out.split() == [
        "('HTTP_X_FORWARDED_PROTO',",
        "'https')",
        "['https://ops.example.com']",
        "True",
        "True",
        "True",
        "True",
    ]


# A plain-http request and one the proxy marks as https, through Django's whole middleware
# stack as config.settings builds it from the environment.
REQUESTS = (
    "from django.test import Client; c = Client(); "
    "plain = c.get('/', HTTP_HOST='ops.example.com'); "
    "proxied = c.get('/', HTTP_HOST='ops.example.com', HTTP_X_FORWARDED_PROTO='https'); "
    "print(plain.status_code, plain.get('Location'), proxied.status_code, "
    "proxied.get('Location'), proxied.get('Strict-Transport-Security'))"
)


def test_django_https_redirects_a_plain_http_request_to_https() -> None:
    """README: "DJANGO_HTTPS=1 redirects to HTTPS" -- a request, not only a setting."""
    out = _settings_printed(REQUESTS, **PRODUCTION)
    plain, plain_to, proxied, proxied_to, hsts = out.split(maxsplit=4)
    assert (plain, plain_to) == ("301", "https://ops.example.com/")
    # Over https (as the proxy says) no redirect to https: the login page, with HSTS.
    assert proxied == "302" and proxied_to.startswith("/login/"), out
    assert hsts.strip() == "max-age=3600; includeSubDomains; preload"


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, "5 0:15:00"),  # the README's "5 wrong passwords ... for 15 minutes"
        ({"LOGIN_FAILURE_LIMIT": "3", "LOGIN_COOLOFF_MINUTES": "60"}, "3 1:00:00"),
    ],
)
def test_the_lockout_limit_and_cool_off_default_to_5_and_15_minutes(
    variables: dict[str, str], expected: str
) -> None:
    script = (
        "from django.conf import settings as s; print(s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME)"
    )
    out = _settings_printed(script, **variables)
    assert out.strip() == expected


def test_axes_reset_lifts_every_lockout(operator: User) -> None:
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "wrong")
    assert log_in(client, "pw") == 429
    call_command("axes_reset", stdout=io.StringIO())
    assert log_in(client, "pw") == 302


def test_lockout_by_address_locks_every_username_from_it(operator: User) -> None:
    User.objects.create_user("other", password="pw2")
    with override_settings(AXES_LOCKOUT_PARAMETERS=[["ip_address"]]):
        for _ in range(settings.AXES_FAILURE_LIMIT):
            log_in(Client(), "wrong")
        other = Client().post(reverse("dashboard:login"), {"username": "other", "password": "pw2"})
        assert other.status_code == 429  # another account, the same address
        assert log_in(Client(REMOTE_ADDR="10.0.0.9"), "pw") == 302  # another address


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "[['username', 'ip_address']]"),  # the default: one account from one address
        ("ip_address", "[['ip_address']]"),
        ("ip_address, username+user_agent", "[['ip_address'], ['username', 'user_agent']]"),
    ],
)
def test_login_lockout_by_sets_the_lockout_key(value: str | None, expected: str) -> None:
    script = "from django.conf import settings as s; print(s.AXES_LOCKOUT_PARAMETERS)"
    variables = {} if value is None else {"LOGIN_LOCKOUT_BY": value}
    assert _settings_printed(script, **variables).strip() == expected
