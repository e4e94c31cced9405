"""Create the demo superuser and a read-only operator (if missing); enqueue demo jobs."""

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

import jobs


class Command(BaseCommand):
    help = "Create the demo users and enqueue demo jobs (sleep, flaky, render, report, noop)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--jobs", type=int, default=12, help="how many demo jobs to enqueue")

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("DEMO_ADMIN_USER", "admin")
        password = os.environ.get("DEMO_ADMIN_PASSWORD", "palisade")
        user_model = get_user_model()
        if not user_model.objects.filter(username=username).exists():
            user_model.objects.create_superuser(username, f"{username}@example.com", password)
            self.stdout.write(f"created superuser {username!r} with password {password!r}")
        if not user_model.objects.filter(username="viewer").exists():
            viewer = user_model.objects.create_user("viewer", password=password)
            viewer.groups.add(Group.objects.get(name="operators"))  # read-only: sees, never acts
            self.stdout.write(f"created read-only operator 'viewer' with password {password!r}")
        count = options["jobs"]
        with transaction.atomic():
            for i in range(count):
                if i % 5 == 0:
                    jobs.enqueue("demo.sleep", {"seconds": 1 + i % 5})
                elif i % 5 == 1:
                    jobs.enqueue("demo.flaky", {"fail_rate": 0.5})
                elif i % 5 == 2:
                    jobs.enqueue("demo.render", {"pages": 1 + i % 4})
                elif i % 5 == 3:
                    jobs.enqueue("demo.report", {"name": f"report-{i}", "rows": i})
                else:
                    jobs.enqueue("demo.noop", {"n": i})
        self.stdout.write(f"enqueued {count} demo jobs")
