"""Refusals at start-up, before any entry point (manage.py, ASGI, WSGI) serves or works.

With DEBUG off and no SECRET_KEY in the environment, config.settings leaves SECRET_KEY empty --
never the public development key, which would let anyone forge sessions, CSRF tokens and
django-q2's signed tasks. Django itself refuses an empty key only when something first uses it
(the first login, the first task); `require_secret_key` refuses at once, with what to do.
Settings stay importable without a key so that tools which only read them (mypy's Django plugin)
keep working.
"""

import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

MISSING_SECRET_KEY = """\
Palisade refuses to start: SECRET_KEY is not set and DEBUG is off.
  Production: set SECRET_KEY to a long random value, e.g.
      export SECRET_KEY="$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')"
  Local development: run bin/setup --dev (bin/run and bin/test do) to write a git-ignored .env,
  or export DJANGO_DEBUG=1 to use the development key.
"""


def require_secret_key() -> None:
    """Exit with MISSING_SECRET_KEY (status 2) when the settings carry no SECRET_KEY."""
    try:
        key = settings.SECRET_KEY  # Django raises for an empty key
    except ImproperlyConfigured:
        key = ""
    if not key:
        sys.stderr.write(MISSING_SECRET_KEY)
        raise SystemExit(2)
