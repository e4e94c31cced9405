"""`manage.py qcluster`: django-q2's workers plus Palisade's embedded scheduler.

django-q2's own command starts the cluster (sentinel, workers, pusher, monitor) in child
processes and returns. This one then runs the embedded scheduler (dispatch + lease reaper) in the
main process until the cluster stops, so one command is all a deployment needs beside the web
server.
"""

import os
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as DjangoQClusterCommand

from jobs.scheduler import EmbeddedScheduler


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
        if options.get("no_scheduler"):
            cluster.sentinel.join()
            return

        def stopped() -> bool:
            return cluster.stop_event is None or not cluster.sentinel.is_alive()

        try:
            EmbeddedScheduler().run(should_stop=stopped)
        finally:
            cluster.stop()
