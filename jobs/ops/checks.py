"""System checks: configuration that would quietly break fencing or liveness."""

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from jobs.core.conf import jobs_settings
from jobs.ops.cron import declared


@register()
def check_transport(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    q = getattr(settings, "Q_CLUSTER", {}) or {}
    timeout, retry = q.get("timeout"), q.get("retry", 60)
    if timeout is None or retry is None or not timeout < retry:
        errors.append(
            Error(
                f"Q_CLUSTER timeout ({timeout}) must be set and below retry ({retry})",
                hint="Otherwise django-q2 redelivers a drain that is still running.",
                id="jobs.E002",
            )
        )
    if q.get("max_attempts", 0) != 1 or not q.get("ack_failures", False):
        errors.append(
            Warning(
                "Q_CLUSTER should set max_attempts=1 and ack_failures=True",
                hint="Retries belong to jobs.Job.run_at; django-q2 redeliveries are only noise.",
                id="jobs.W003",
            )
        )
    return errors


@register()
def check_jobs_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        cfg = jobs_settings()  # refuses out-of-range values (jobs.core.bounds)
    except ValueError as exc:
        return [Error(str(exc), id="jobs.E001")]
    errors: list[CheckMessage] = []
    if cfg.HEARTBEAT_SECONDS * 3 > cfg.LEASE_SECONDS:
        errors.append(
            Error(
                f"JOBS HEARTBEAT_SECONDS ({cfg.HEARTBEAT_SECONDS}) must be at most a third of "
                f"LEASE_SECONDS ({cfg.LEASE_SECONDS})",
                hint="One late beat must never lose a healthy lease.",
                id="jobs.E003",
            )
        )
    q_timeout = (getattr(settings, "Q_CLUSTER", {}) or {}).get("timeout")
    if q_timeout is not None and cfg.DRAIN_SECONDS >= q_timeout:
        errors.append(
            Error(
                f"JOBS DRAIN_SECONDS ({cfg.DRAIN_SECONDS}) must be below Q_CLUSTER timeout "
                f"({q_timeout})",
                id="jobs.E006",
            )
        )
    return errors


@register()
def check_operations(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Reaper slower than the lease, SQLite without WAL, invalid cron schedules."""
    errors: list[CheckMessage] = []
    try:
        cfg = jobs_settings()
    except ValueError:
        return []  # reported by check_jobs_settings
    if cfg.REAPER_SECONDS > cfg.LEASE_SECONDS:
        errors.append(
            Error(
                f"JOBS REAPER_SECONDS ({cfg.REAPER_SECONDS}) is longer than LEASE_SECONDS "
                f"({cfg.LEASE_SECONDS})",
                hint="A dead worker's job would wait longer for its reclaim than its lease.",
                id="jobs.E011",
            )
        )
    for alias, db in settings.DATABASES.items():
        if "sqlite3" not in str(db.get("ENGINE", "")):
            continue
        init = str((db.get("OPTIONS") or {}).get("init_command", "")).lower().replace(" ", "")
        if "journal_mode=wal" not in init:
            errors.append(
                Error(
                    f"SQLite database {alias!r} does not set journal_mode=WAL",
                    hint="Without WAL every read blocks the workers' writes (and the reverse): "
                    'set OPTIONS["init_command"] = "PRAGMA journal_mode=WAL;".',
                    id="jobs.E012",
                )
            )

    for problem in declared()[1]:
        errors.append(Error(problem, id="jobs.E010"))
    return errors


@register(Tags.database)
def check_fenced_tables(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """A FencedRow table without the check its token-checked writes' COMMIT makes (`check
    --database default`): a Warning, not an Error -- `migrate` runs these checks before it
    migrates, and is what installs it."""
    from jobs.effects.fenced import commit_checks_missing

    return [
        Warning(
            f"{label}: its table lacks an enabled jobs_fence_at_commit* trigger of this version; "
            "ctx.fenced_write(), fenced_create() and fenced_delete() refuse to write it",
            hint="Run `manage.py migrate`: it installs the check on every FencedRow table.",
            id="jobs.W040",
        )
        for alias in databases or []
        for label in commit_checks_missing(alias)
    ]
