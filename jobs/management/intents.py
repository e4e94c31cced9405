"""`manage.py jobs intents retry ID... [--perform-again]`: retry `failed` outbox intents.

Owns: the subcommand's arguments and its output; the retry itself, its permission check and its
audit are jobs.ops.intents.retry's (the admin's action calls the same function). `--failed`
selects every failed intent (at most --limit); `--perform-again` performs an intent whose last
call's outcome is unknown without reconciling it first (a possible duplicate, accepted by the
operator).
"""

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from jobs.core import identity
from jobs.models import Intent
from jobs.ops import intents


def add_parser(sub: Any) -> None:
    """Register `intents retry` on the `jobs` command's subparsers."""
    parser = sub.add_parser("intents", help="outbox intents: retry failed ones (audited)")
    verbs = parser.add_subparsers(dest="intents_command", required=True)
    retry = verbs.add_parser("retry", help="make failed intents pending again, fresh horizon")
    retry.add_argument("intent_ids", type=int, nargs="*")
    retry.add_argument("--failed", action="store_true", help="every failed intent (--limit)")
    retry.add_argument("--perform-again", action="store_true", help="skip reconciliation")
    retry.add_argument("--user", default=None, help="the Django user acting")
    retry.add_argument("--limit", type=int, default=intents.MAX_ROWS)


def run(options: dict[str, Any], out: Any) -> None:
    username = options["user"] or os.environ.get("JOBS_OPERATOR") or identity.os_user()
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no Django user {username!r}: pass --user (a staff operator)")
    limit = options["limit"]
    if not 1 <= limit <= intents.MAX_ROWS:
        raise CommandError(f"--limit must be between 1 and {intents.MAX_ROWS}")
    if options["failed"] == bool(options["intent_ids"]):
        raise CommandError("give intent ids or --failed, not both and not neither")
    ids = options["intent_ids"] or list(
        Intent.objects.filter(state=Intent.State.FAILED)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    try:
        report = intents.retry(
            ids[:limit], user=user, via="cli", perform_again=options["perform_again"]
        )
    except (PermissionError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    out.write(report.summary())
    for job_id, key in report.retried:
        out.write(f"  intent {key} (job {job_id}): pending again")
