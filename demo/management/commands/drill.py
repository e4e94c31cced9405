"""`manage.py drill`: stage a real zombie on the running local cluster and watch the fence."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo import drill


class Command(BaseCommand):
    help = (
        "Enqueue a slow job, SIGSTOP the local qcluster worker that claims it past its lease, "
        "let another worker commit it, SIGCONT the zombie and show its rejected write."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=3.0, help="the slow job's duration")
        parser.add_argument("--timeout", type=float, default=60.0, help="deadline of each wait")
        parser.add_argument(
            "--task", action="store_true", help="drill a django.tasks @task (demo.tasks.drill)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        enqueue = drill.enqueue_drill_task if options["task"] else drill.enqueue_drill_job
        job = enqueue(options["seconds"])
        if getattr(job, "duplicate", False):
            raise CommandError(f"a drill is already running: job {job.pk}; nothing was enqueued")
        self.stdout.write(f"drill job {job.pk} enqueued; waiting for a worker to claim it")
        try:
            result = drill.run(job.pk, timeout=options["timeout"])
        except drill.DrillError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"job {result.job_id}: worker {result.zombie_pid} was stopped past its lease, "
            f"attempt 2 committed, and attempt 1's stale {result.rejected_write} was rejected. "
            f"See /jobs/{result.job_id}/"
        )
