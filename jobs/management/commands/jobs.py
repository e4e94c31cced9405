"""`manage.py jobs status|list|show|requeue|cancel|retry|copy|prune|queues|intents` -- the
operator's terminal (`queues`: jobs/management/queues.py; `intents retry`:
jobs/management/intents.py).

Reads go through the same selectors the screens use; every change goes through jobs.ops.actions ->
jobs.core.transitions with the same fencing, permission and LogEntry audit as the admin. The acting
Django user is --user (default: $JOBS_OPERATOR, else the login name), and must be staff with the
job "change" permission. `prune` (retention, jobs.ops.retention) deletes finished jobs older than N
days with their history, in batches; it is a maintenance task for cron or a deploy hook.
"""

import argparse
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.core import identity
from jobs.core.states import JobState
from jobs.management import intents as intents_cli
from jobs.management import queues as queues_command
from jobs.management.terminal import Printable
from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from jobs.ops import actions, retention
from jobs.ops.describe import effective_lease, effective_max_attempts, seconds
from jobs.ops.lease_hint import lease_hints
from jobs.ops.metrics import collect_families

LIST_LIMIT = 1000
# Never printed, so never decoded: a raw-SQL row Python cannot decode (nested past its limit, a
# number of 5,001 digits) must not end a listing of other jobs, nor its own `show`.
JSON_COLUMNS = ("payload", "progress", "result")


def _first_line(text: str, width: int = 100) -> str:
    line = (text or "").strip().splitlines()[-1:] or [""]
    return line[0][:width]


def job_id(text: str) -> int:
    """A job id from argv: a whole number of at least 1 (ids start at 1). `-5` or `0` was
    dropped without a word ("0 changed, 0 skipped"); one past bigint is still no such job."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a job id: {text[:80]!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a job id: {value} (ids start at 1)")
    return value


class Command(BaseCommand):
    help = (
        "Operate jobs without a browser: status, list, show, requeue, cancel, retry, copy, prune, "
        "queues."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="command", required=True)
        sub.add_parser("status", help="queues, running leases, totals and the lease hint")
        ls = sub.add_parser("list", help="newest jobs first")
        self._filters(ls)
        ls.add_argument("--limit", type=int, default=20)
        show = sub.add_parser("show", help="one job with its attempt history")
        show.add_argument("job_id", type=job_id)
        for name in actions.ACTIONS:
            act = sub.add_parser(name, help=f"{name} jobs (fenced, audited)")
            act.add_argument("job_ids", type=job_id, nargs="*")
            self._filters(act)
            act.add_argument(
                "--all-matching", action="store_true", help="every job matching the filters"
            )
            act.add_argument("--user", default=None, help="the Django user acting")
            act.add_argument(
                "--limit", type=int, default=None, help="stop after this many jobs (default: all)"
            )
            act.add_argument(
                "--after", type=int, default=0, help="only jobs with a greater id (to go on)"
            )
        prune = sub.add_parser(
            "prune", help="delete finished jobs older than N days with their history (batched)"
        )
        prune.add_argument("--older-than-days", type=float, required=True)
        prune.add_argument("--batch", type=int, default=1000, help="jobs per transaction")
        prune.add_argument("--pause", type=float, default=0.0, help="seconds between batches")
        prune.add_argument("--dry-run", action="store_true", help="only count what would go")
        queues_command.add_parser(sub)  # queues [pause|resume|limit] (jobs/management/queues.py)
        intents_cli.add_parser(sub)

    @staticmethod
    def _filters(parser: CommandParser) -> None:
        parser.add_argument("--state", choices=JobState.values)
        parser.add_argument("--queue")
        parser.add_argument("--kind")

    def handle(self, *args: Any, **options: Any) -> None:
        # Every message of every subcommand with its control characters as \xNN: rows and
        # arguments hold text (terminal.py); a CommandError's message reaches stderr the same way.
        self.stdout, self.stderr = Printable.around(self.stdout), Printable.around(self.stderr)
        command = options["command"]
        if command == "status":
            self.status()
        elif command == "list":
            self.list(options)
        elif command == "show":
            self.show(options["job_id"])
        elif command == "prune":
            self.prune(options)
        elif command == "queues":
            queues_command.handle(options, self.stdout)
        elif command == "intents":
            intents_cli.run(options, self.stdout)
        else:
            self.act(command, options)

    def prune(self, options: dict[str, Any]) -> None:
        days = options["older_than_days"]
        if not 0 <= options["pause"] <= 3600:
            raise CommandError("--pause must be between 0 and 3600 seconds")
        try:
            if options["dry_run"]:
                self.stdout.write(f"{retention.count(days)} finished jobs would be pruned")
                return
            report = retention.prune(
                days, batch_size=options["batch"], pause_seconds=options["pause"]
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        rows = ", ".join(f"{label} {n}" for label, n in sorted(report.rows.items()))
        self.stdout.write(
            f"pruned {report.jobs} finished jobs older than {days:g} days in {report.batches} "
            f"batches ({report.seconds:.1f} s): {rows or 'nothing'}"
        )

    # -- reads ------------------------------------------------------------------------------

    def status(self) -> None:
        families = {f.name: f for f in collect_families()}

        out = self.stdout.write
        out("queues (queued, oldest due waiting):")
        ages = {
            s.labels["queue"]: s.value for s in families["jobs_queue_oldest_age_seconds"].samples
        }
        depth = families["jobs_queue_depth"].samples
        if not depth:
            out("  (none queued)")
        for s in depth:
            queue = s.labels["queue"]
            out(f"  {queue:<24} {int(s.value):>9}   {ages.get(queue, 0.0):9.1f} s")
        running = families["jobs_running"].samples[0].value
        expired = families["jobs_running_expired_leases"].samples[0].value
        out(f"running: {int(running)}   leases run out, not yet reclaimed: {int(expired)}")
        totals = [
            ("claims", "jobs_claims"),
            ("succeeded", "jobs_succeeded"),
            ("failed", "jobs_failed"),
            ("reclaims", "jobs_reclaims"),
        ]
        parts = [f"{label} {int(families[name].samples[0].value)}" for label, name in totals]
        rejected = sum(s.value for s in families["jobs_stale_writes_rejected"].samples)
        out("totals: " + ", ".join(parts) + f", stale writes rejected {int(rejected)}")

        hints = [h for h in lease_hints() if h.advice]
        out("lease hint: " + ("no sign that a lease is too short" if not hints else ""))
        for hint in hints:
            out(f"  {'TOO SHORT ' if hint.too_short else ''}{hint.advice}")

    def list(self, options: dict[str, Any]) -> None:
        jobs = self._selected(options).defer(*JSON_COLUMNS).order_by("-id")
        jobs = jobs[: max(1, min(options["limit"], LIST_LIMIT))]
        self.stdout.write(f"{'id':>10} {'state':<10} {'att':>4} {'queue':<12} {'kind':<24} updated")
        for job in jobs:
            self.stdout.write(
                f"{job.pk:>10} {job.state:<10} {job.attempt:>4} {job.queue[:12]:<12} "
                f"{job.kind[:24]:<24} {seconds(job.updated_at)}"
            )

    def show(self, job_id: int) -> None:
        job = Job.objects.filter(pk=job_id).defer(*JSON_COLUMNS).first()
        if job is None:
            raise CommandError(f"no job {job_id}")

        out = self.stdout.write
        out(f"job {job.pk}  {job.kind}  queue={job.queue}  priority={job.priority}")
        out(f"  state {job.state}, attempt {job.attempt} ({job.attempts_released} uncharged)")
        out(f"  max attempts {effective_max_attempts(job)}, lease {effective_lease(job)}")
        out(f"  run at {seconds(job.run_at)}, lease expires {seconds(job.lease_expires_at)}")
        out(f"  created {seconds(job.created_at)}, finished {seconds(job.finished_at)}")
        if job.unique_key:
            out(f"  unique key {job.unique_key!r}")
        if job.error:
            out(f"  error: {_first_line(job.error)}")
        out("attempts:")
        for a in Attempt.objects.filter(job=job).order_by("number"):
            gap = f"{a.heartbeat_gap_max:.2f} s" if a.heartbeat_gap_max is not None else "-"
            out(
                f"  #{a.number:<3} {a.outcome:<10} {a.worker[:40]:<40} claimed "
                f"{seconds(a.claimed_at)}  ended {seconds(a.ended_at)}  longest beat gap {gap}"
            )
            if a.error:
                out(f"       {_first_line(a.error)}")
        for r in RejectedWrite.objects.filter(job=job).order_by("id")[:100]:
            out(
                f"  rejected {r.write} of attempt {r.attempt_presented} (current "
                f"{r.attempt_current}, {r.state_current}) from {r.worker} at {seconds(r.at)}"
            )
        out("events (newest 20):")
        for e in reversed(JobEvent.objects.filter(job=job).order_by("-id")[:20]):
            out(f"  {seconds(e.at)}  attempt {e.attempt:<3} {e.type:<16} {e.worker[:40]}")

    # -- changes ----------------------------------------------------------------------------

    def _selected(self, options: dict[str, Any]) -> Any:
        jobs = Job.objects.all()
        for name in ("state", "queue", "kind"):
            if options.get(name):
                jobs = jobs.filter(**{name: queues_command.storable(f"--{name}", options[name])})
        return jobs

    def act(self, action: str, options: dict[str, Any]) -> None:
        username = options["user"] or os.environ.get("JOBS_OPERATOR") or identity.os_user()
        username = queues_command.storable("user", username)
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no Django user {username!r}: pass --user (a staff operator)")
        if options["all_matching"]:
            if options["job_ids"]:
                raise CommandError("give job ids or --all-matching, not both")
            target: Any = self._selected(options)
        elif options["job_ids"]:
            target = options["job_ids"]
        else:
            raise CommandError("give job ids, or --all-matching with filters")
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        done: list[actions.Report] = []
        try:
            report = actions.apply(
                action,
                target,
                user=user,
                via="cli",
                limit=options["limit"],
                after=max(0, options["after"]),
                progress=done.append,  # each chunk commits with its audit before the next
            )
        except PermissionError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            cursor = done[-1].last_id if done else options["after"]
            self.stderr.write(
                f"interrupted: jobs up to {cursor} are done and audited, the chunk after it was "
                f"rolled back; go on with --after {cursor}"
            )
            raise
        self.stdout.write(report.summary())
        for r in report.changed:
            detail = f"copied as job {r.new_job_id}" if r.new_job_id else r.reason
            self.stdout.write(f"  job {r.job_id} (attempt {r.attempt}): {detail}")
