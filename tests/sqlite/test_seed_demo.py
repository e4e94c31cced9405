"""`bin/run` seeds the demo on its embedded SQLite once: a restart adds no jobs, `--add` does."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db.models.functions import Now

from demo.management.commands.seed_demo import SEEDED_KINDS
from jobs.models import Job

pytestmark = pytest.mark.django_db


def demo_jobs() -> int:
    return Job.objects.filter(kind__in=SEEDED_KINDS).count()


def test_a_second_start_enqueues_no_more_demo_jobs():
    call_command("seed_demo")
    assert demo_jobs() == 12
    call_command("seed_demo")  # bin/run's second start
    assert demo_jobs() == 12
    assert get_user_model().objects.filter(username__in=["admin", "viewer"]).count() == 2


def test_the_seed_is_still_skipped_once_the_demo_jobs_have_run():
    call_command("seed_demo")
    Job.objects.filter(kind__in=SEEDED_KINDS).update(state="succeeded", finished_at=Now())
    call_command("seed_demo")
    assert demo_jobs() == 12


def test_more_demo_jobs_on_demand():
    call_command("seed_demo")
    call_command("seed_demo", add=3)
    assert demo_jobs() == 15
