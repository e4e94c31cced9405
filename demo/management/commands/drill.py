"""`manage.py drill`: stage a real zombie on the running local cluster and watch the fence."""

import argparse
import math
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo import drill


class Command(BaseCommand):
    help = (
        "Enqueue a slow job, SIGSTOP the local qcluster worker that claims it past its lease, "
        "let another worker commit it, SIGCONT the zombie and show its rejected write."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--seconds", type=seconds(0.1, 60), default=3.0, help="the slow job's duration"
        )
        parser.add_argument(
            "--timeout", type=seconds(1, 3600), default=60.0, help="deadline of each wait"
        )
        parser.add_argument(
            "--task", action="store_true", help="drill a django.tasks @task (demo.tasks.drill)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # SIGTERM/SIGHUP (bin/run stopping, a closed terminal) end the drill as Ctrl-C does: by
        # an exception, so drill.run's `finally` resumes a worker it holds stopped. By default
        # they ended the process on the spot and left that worker SIGSTOPped.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _interrupt)
        try:
            self.run_drill(options)
        except Interrupted as exc:
            raise CommandError(f"drill interrupted by {exc}; no worker is left stopped") from None

    def run_drill(self, options: dict[str, Any]) -> None:
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


def seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds within [low, high] (not NaN, not infinite)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"{text!r} is not a number from {low} to {high}")
        return value

    return parse


class Interrupted(BaseException):
    """A stop signal, raised where the drill is (BaseException: no `except Exception` eats it)."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)
