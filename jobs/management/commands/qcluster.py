"""`manage.py qcluster`: django-q2's workers plus Palisade's embedded scheduler.

django-q2's own command starts the cluster (sentinel, workers, pusher, monitor) in child
processes and returns. This one then runs the embedded scheduler (dispatch + lease reaper) in the
main process until the cluster stops or a stop signal arrives, so one command is all a deployment
needs beside the web server.

Hazard (why stopping is done here, not in django-q2's signal handler): a supervisor that signals
the whole process group (systemd's default KillMode=control-group, a terminal's Ctrl-C) kills the
sentinel at the same moment. If it dies holding its stop event's lock, django-q2's handler blocks
forever in Event.set(). So the signal only asks the scheduler loop to end, and the cluster is
stopped afterwards -- skipped when the sentinel is already gone, and bounded by a deadline.
"""

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as DjangoQClusterCommand

from jobs.scheduler import EmbeddedScheduler

logger = logging.getLogger("jobs.scheduler")
STOP_GRACE_SECONDS = 30.0


class Command(DjangoQClusterCommand):
    help = "Starts django-q2's workers and Palisade's embedded scheduler (dispatch, reaper)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--no-scheduler",
            action="store_true",
            help="Run workers only (another qcluster runs the scheduler; two are harmless too).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        settings.SECRET_KEY  # noqa: B018  (django-q2 signs tasks with it)
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        cluster = Cluster()
        cluster.start()
        if options.get("run_once"):
            cluster.stop()
            return

        stop_requested = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop_requested.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)

        def stopped() -> bool:
            return stop_requested.is_set() or not cluster.sentinel.is_alive()

        try:
            if options.get("no_scheduler"):
                while not stopped():
                    stop_requested.wait(0.5)
            else:
                EmbeddedScheduler().run(should_stop=stopped)
        finally:
            stop_cluster(cluster)


def stop_cluster(cluster: Cluster) -> None:
    if not cluster.sentinel.is_alive():
        return  # gone with the same signal: nothing to stop, and its lock may be orphaned
    stopper = threading.Thread(target=cluster.stop, name="qcluster-stop", daemon=True)
    stopper.start()
    stopper.join(STOP_GRACE_SECONDS)
    if stopper.is_alive():
        logger.error("django-q2 did not stop within %.0f s; exiting anyway", STOP_GRACE_SECONDS)
