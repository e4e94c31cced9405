"""`bin/run` seeds the demo on its embedded SQLite once: a restart adds no jobs, `--add` does;
its users are the README's admin/palisade and read-only viewer/palisade."""

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db.models import Q
from django.db.models.functions import Now
from django.test import RequestFactory

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


def test_the_demo_users_log_in_with_the_documented_password_and_viewer_only_sees(
    monkeypatch: pytest.MonkeyPatch,
):
    """README: bin/run "creates admin/palisade (and a read-only viewer/palisade)"."""
    monkeypatch.delenv("DEMO_ADMIN_USER", raising=False)
    monkeypatch.delenv("DEMO_ADMIN_PASSWORD", raising=False)
    call_command("seed_demo")
    login = RequestFactory().post("/login/")  # django-axes authenticates only with a request
    admin = authenticate(login, username="admin", password="palisade")
    assert admin is not None and admin.is_superuser and admin.is_staff
    viewer = authenticate(login, username="viewer", password="palisade")
    assert viewer is not None
    assert not viewer.is_staff and not viewer.is_superuser
    assert viewer.has_perm("dashboard.view_dashboard")
    # Every change permission (the job actions', queue controls', cron's, the admin's) and the
    # drill's: none is the viewer's.
    writes = [
        f"{app}.{codename}"
        for app, codename in Permission.objects.filter(
            Q(codename__startswith="change_") | Q(codename="run_drill")
        ).values_list("content_type__app_label", "codename")
    ]
    assert {"jobs.change_job", "jobs.change_schedule", "dashboard.run_drill"} <= set(writes)
    assert [p for p in writes if viewer.has_perm(p)] == []
