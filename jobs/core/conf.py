"""Typed view of settings.JOBS with JOBS_<KEY> environment overrides.

Owns: reading configuration. Never: caches across `override_settings` (the cache is cleared on
setting_changed), so tests can change a knob per test.
"""

import os
from dataclasses import dataclass, fields
from functools import cache

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from jobs.core import bounds
from jobs.core.exceptions import InvalidOption


@dataclass(frozen=True)
class JobsSettings:
    LEASE_SECONDS: float = 30.0
    HEARTBEAT_SECONDS: float = 10.0
    REAPER_SECONDS: float = 1.0
    POLL_SECONDS: float = 0.5
    DRAIN_SECONDS: float = 10.0
    # A drain run by a worker that finds no work waits this long for a NOTIFY (claiming again at
    # once when one comes, and every POLL_SECONDS regardless) before it returns: the idle
    # wake-up in milliseconds. 0 = return at once (wake-up through django-q2's broker poll).
    IDLE_WAIT_SECONDS: float = 10.0
    # A direct (session) connection for LISTEN when DATABASE_URL goes through a transaction
    # pooler such as PgBouncer, where LISTEN does not work; "" = DATABASE_URL.
    LISTEN_URL: str = ""
    CLAIM_BATCH: int = 64  # the most; the drain grows to it only for quick jobs (jobs.core.policy)
    # The drain's hot statements (claim, commit, heartbeat, fail, release) as server-side
    # prepared statements on PostgreSQL (jobs.core.transitions.fence.hot_cursor). False behind a
    # transaction pooler that cannot keep prepared statements (PgBouncer before 1.21, or without
    # max_prepared_statements). False turns the enqueue's off too (ENQUEUE_PREPARE below).
    PREPARED_STATEMENTS: bool = True
    MAX_ATTEMPTS: int = 3
    MAX_PAYLOAD_BYTES: int = 256 * 1024
    # The enqueue statement as a server-side prepared statement: "auto" (unless the connection
    # goes through a pooler), "on", "off" (jobs/models/prepared.py, docs/operations.md).
    ENQUEUE_PREPARE: str = "auto"
    RETRY_BASE_SECONDS: float = 2.0
    RETRY_MAX_SECONDS: float = 3600.0
    QUEUES: tuple[str, ...] | None = None
    STAGING_STORAGE: str = "default"
    ORPHAN_GRACE_SECONDS: float = 3600.0
    INTENT_RETRY_HOURS: float = 24.0  # an intent's failures are retried this long, then `failed`
    # Operating under faults (docs/operations.md, "Shutdown and database outages").
    SHUTDOWN_GRACE_SECONDS: float = 20.0  # SIGTERM: running handlers may finish within this
    DB_TIMEOUT_SECONDS: float = 10.0  # longest one platform round trip may wait before it is cut
    UNKNOWN_OUTCOME_SECONDS: float = 60.0  # a worker stops resolving an unknown final write
    OUTAGE_LOG_SECONDS: float = 30.0  # a persisting outage is logged again at most this often
    UNRESOLVED_DIR: str = ""  # spool of writes given up on; "" = <project>/var/unresolved


def _coerce(name: str, raw: object, default: object, label: str) -> object:
    """`raw` as the type of `default`; `label` names where it came from in an error."""
    if name == "QUEUES":
        if raw is None or raw == "":
            return None
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, list | tuple | set | frozenset) or not all(
            isinstance(q, str) for q in items
        ):
            raise ValueError(
                f"{label} must be a list of queue names (or one text, the names separated by "
                f"commas), not {repr(raw)[:100]}"
            )
        return tuple(q.strip() for q in items if q.strip()) or None
    if isinstance(default, str):
        if isinstance(raw, os.PathLike):  # UNRESOLVED_DIR = BASE_DIR / "var" / "unresolved"
            raw = os.fspath(raw)
        if not isinstance(raw, str):
            raise ValueError(f"{label} = {repr(raw)[:100]} is not text")
        if "\x00" in raw:
            raise ValueError(f"{label} = {repr(raw)[:100]} holds a NUL character")
        return raw
    if isinstance(default, bool) and isinstance(raw, str):  # an environment override
        if raw.strip().lower() in {"1", "true", "yes", "on"}:
            return True
        if raw.strip().lower() in {"0", "false", "no", "off"}:
            return False
        raise InvalidOption(f"{label} must be true or false (1/0), not {raw!r}")
    if isinstance(default, bool) or default is None:
        return raw
    if isinstance(default, int) and (
        isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer())
    ):  # int() would make 1.5 a silent 1, True a 1
        raise ValueError(f"{label} = {raw!r} is not a whole number")
    try:
        return type(default)(raw)  # type: ignore[call-arg]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{label} = {raw!r} is not a {type(default).__name__}") from exc


@cache
def jobs_settings() -> JobsSettings:
    configured = dict(getattr(settings, "JOBS", {}) or {})
    unknown = set(configured) - {f.name for f in fields(JobsSettings)}
    if unknown:
        raise ValueError(f"unknown JOBS settings: {sorted(unknown)}")
    values = {}
    labels = {}  # an error names the environment variable when the value came from there
    for f in fields(JobsSettings):
        variable = f"JOBS_{f.name}"
        if variable in os.environ:
            raw, labels[f.name] = os.environ[variable], variable
        else:
            raw, labels[f.name] = configured.get(f.name, f.default), f"JOBS[{f.name!r}]"
        values[f.name] = _coerce(f.name, raw, f.default, labels[f.name])
    cfg = JobsSettings(**values)  # type: ignore[arg-type]
    _check_ranges(cfg, labels)
    return cfg


def _check_ranges(cfg: JobsSettings, labels: dict[str, str]) -> None:
    """Refuse settings that would overflow a statement or starve the platform (jobs.core.bounds)."""
    checks = [
        ("LEASE_SECONDS", bounds.LEASE_SECONDS, False),
        ("HEARTBEAT_SECONDS", (0.05, bounds.LEASE_SECONDS[1]), False),
        ("REAPER_SECONDS", (0.05, 3600.0), False),
        ("POLL_SECONDS", (0.01, 3600.0), False),
        ("DRAIN_SECONDS", (0.1, 24 * 3600.0), False),
        ("IDLE_WAIT_SECONDS", (0.0, 24 * 3600.0), False),
        ("CLAIM_BATCH", (1, 1000), True),
        ("MAX_ATTEMPTS", bounds.MAX_ATTEMPTS, True),
        ("MAX_PAYLOAD_BYTES", (1, 64 * 1024 * 1024), True),
        ("RETRY_BASE_SECONDS", bounds.RETRY_SECONDS, False),
        ("RETRY_MAX_SECONDS", bounds.RETRY_SECONDS, False),
        ("ORPHAN_GRACE_SECONDS", (0.0, 365 * 24 * 3600.0), False),
        ("INTENT_RETRY_HOURS", (0.0, 365 * 24.0), False),
        ("SHUTDOWN_GRACE_SECONDS", (0.0, 24 * 3600.0), False),
        ("DB_TIMEOUT_SECONDS", (0.1, 3600.0), False),
        ("UNKNOWN_OUTCOME_SECONDS", (0.1, 24 * 3600.0), False),
        ("OUTAGE_LOG_SECONDS", (0.1, 24 * 3600.0), False),
    ]
    for name, limits, integer in checks:
        try:
            bounds.number_in(labels[name], getattr(cfg, name), limits, integer=integer)
        except InvalidOption as exc:
            raise ValueError(str(exc)) from None
    _check_names(cfg, labels)


# jobs.models.prepared.CHOICES, whose keys these are (tests/unit/test_conf.py keeps them in step).
ENQUEUE_PREPARE_VALUES = frozenset({"auto", "on", "true", "1", "off", "false", "0"})


def _check_names(cfg: JobsSettings, labels: dict[str, str]) -> None:
    """Refuse names that cannot work, here rather than at each use: queues no job can carry (the
    workers would serve nothing), an ENQUEUE_PREPARE every enqueue would refuse, a staging
    storage every staged output would fail on. InvalidOption, a ValueError (jobs.E001), as the
    enqueue raised for an ENQUEUE_PREPARE it refused."""
    for queue in cfg.QUEUES or ():
        if not bounds.QUEUE_NAME.match(queue):
            raise InvalidOption(
                f"{labels['QUEUES']} {queue[:100]!r} is not a queue name: it must match "
                f"{bounds.QUEUE_NAME.pattern}"
            )
    if cfg.ENQUEUE_PREPARE.strip().lower() not in ENQUEUE_PREPARE_VALUES:
        raise InvalidOption(
            f"{labels['ENQUEUE_PREPARE']} = {cfg.ENQUEUE_PREPARE[:100]!r}: use 'auto' (the "
            "default), 'on' or 'off'"
        )
    storages = getattr(settings, "STORAGES", None) or {}
    if cfg.STAGING_STORAGE not in storages:
        raise InvalidOption(
            f"{labels['STAGING_STORAGE']} = {cfg.STAGING_STORAGE[:100]!r} is not a key of "
            f"STORAGES {sorted(storages)}"
        )


@receiver(setting_changed)
def _reset(setting: str, **kwargs: object) -> None:
    if setting == "JOBS":
        jobs_settings.cache_clear()
