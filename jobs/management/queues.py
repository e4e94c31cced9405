"""`manage.py jobs queues ...`: list, pause, resume and limit queues (jobs.ops.queues).

Owns: the `queues` subcommand's arguments and its text. Never: writes a control row itself --
jobs.ops.queues does, with the same validation, permission check and audit as the admin.

Who acts: `--user NAME` (or $JOBS_OPERATOR), a staff operator with the job "change" permission,
audited in Django's LogEntry like the admin's actions; without one, the change is recorded on the
queue's row as `cli (<login name>)` and in the log.
"""

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser, OutputWrapper
from django.db import connection

from jobs.core import bounds
from jobs.core.exceptions import InvalidOption
from jobs.core.sql import driver_for
from jobs.core.sql import metrics as sql_metrics
from jobs.ops import queues


def add_parser(sub: Any) -> None:
    parser: CommandParser = sub.add_parser(
        "queues", help="list queues with their controls; pause, resume or limit one (audited)"
    )
    verbs = parser.add_subparsers(dest="verb")
    for verb, text in (("pause", "claims skip the queue"), ("resume", "claims take it again")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("name")
        p.add_argument("--user", default=None, help="the Django user acting (audited)")
    limit = verbs.add_parser("limit", help="at most N jobs of the queue running at once")
    limit.add_argument("name")
    limit.add_argument("limit", help="a whole number, or 'none' to remove the limit")
    limit.add_argument("--user", default=None, help="the Django user acting (audited)")


def handle(options: dict[str, Any], out: OutputWrapper) -> None:
    verb = options.get("verb")
    if verb is None:
        show(out)
        return
    name, actor = options["name"], _actor(options.get("user"))
    try:
        if verb == "pause":
            changed = queues.pause(name, actor=actor)
            out.write(f"queue {name} {'paused' if changed else 'was already paused'}")
        elif verb == "resume":
            changed = queues.resume(name, actor=actor)
            out.write(f"queue {name} {'resumed' if changed else 'was not paused'}")
        else:
            limit = _parse_limit(options["limit"])
            queues.set_limit(name, limit, actor=actor)
            out.write(f"queue {name}: concurrency limit {'none' if limit is None else limit}")
    except (ValueError, PermissionError) as exc:
        raise CommandError(str(exc)) from None


def show(out: OutputWrapper) -> None:
    controls = queues.controls()
    running = queues.running()
    with connection.cursor() as cur:
        queued = {q: n for q, n, _ in sql_metrics.queues(driver_for(connection.vendor), cur)}
    names = sorted(set(controls) | set(running) | set(queued))
    out.write(f"{'queue':<24} {'queued':>9} {'running':>8} {'limit':>7}  state")
    if not names:
        out.write("  (no queued or running jobs, no controls)")
    for q in names[:1000]:
        c = controls.get(q, queues.QueueControl())
        limit = "-" if c.limit is None else str(c.limit)
        state = "PAUSED" if c.paused else "active"
        line = f"{q[:24]:<24} {queued.get(q, 0):>9} {running.get(q, 0):>8} {limit:>7}  {state}"
        out.write(line)  # escaped by the command's output (terminal.py), like every message


def _parse_limit(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"limit must be a whole number or 'none', not {text!r}") from None


def storable(name: str, value: str, limit: int = 200) -> str:
    """An argument the database can be asked about (a filter, a user name): a lone surrogate --
    what an argument's invalid UTF-8 bytes become -- or a NUL is a CommandError, not psycopg's
    UnicodeEncodeError or ValueError out of the query."""
    try:
        bounds.storable_text(name, value, limit)
    except InvalidOption as exc:
        raise CommandError(str(exc)) from None
    return value


def _actor(username: str | None) -> Any:
    username = username or os.environ.get("JOBS_OPERATOR")
    if not username:
        return None
    user = get_user_model().objects.filter(username=storable("user", username)).first()
    if user is None:
        raise CommandError(f"no Django user {username!r}: pass --user (a staff operator)")
    return user
