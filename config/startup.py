"""Refusals at start-up, before any entry point (manage.py, ASGI, WSGI) serves or works.

Two refusals, each a message on stderr and exit status 2, never a traceback:

- A bad value in the environment (`JOBS_WORKERS=two`, `LOGIN_FAILURE_LIMIT=-1`): config.settings
  raises SettingError naming the variable, the value and what it expects.
- DEBUG off and no SECRET_KEY (unset, empty or only whitespace): config.settings leaves SECRET_KEY
  empty -- never the public development key, which would let anyone forge sessions, CSRF tokens
  and django-q2's signed tasks. Django itself refuses an empty key only when something first uses
  it (the first login, the first task); `require_settings` refuses at once, with what to do.
  Settings stay importable without a key so that tools which only read them (mypy's Django
  plugin) keep working.
"""

import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class SettingError(ImproperlyConfigured):
    """An environment value config.settings cannot use; the message names the variable, the
    value and the form expected."""


MISSING_SECRET_KEY = """\
Palisade refuses to start: SECRET_KEY is not set and DEBUG is off.
  Production: set SECRET_KEY to a long random value, e.g.
      export SECRET_KEY="$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')"
  Local development: run bin/setup --dev (bin/run and bin/test do) to write a git-ignored .env,
  or export DJANGO_DEBUG=1 to use the development key.
"""


def require_settings() -> None:
    """Exit with status 2 and a message when a setting cannot be read from the environment
    (SettingError) or the settings carry no SECRET_KEY (MISSING_SECRET_KEY)."""
    try:
        key = settings.SECRET_KEY  # loads config.settings; Django raises for an empty key
    except SettingError as exc:
        sys.stderr.write(f"Palisade refuses to start: {exc}\n")
        raise SystemExit(2) from None
    except ImproperlyConfigured:
        key = ""
    if not key.strip():
        sys.stderr.write(MISSING_SECRET_KEY)
        raise SystemExit(2)
