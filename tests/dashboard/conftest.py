"""Dashboard fixtures: users in each role and a planted zombie story (two overlapping attempts)."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client

from jobs.models import Attempt, Job, JobEvent, RejectedWrite


@pytest.fixture
def staff(db: None) -> User:
    """An operator who may press: staff with the drill permission."""
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="dashboard"))
    return user


@pytest.fixture
def operator(db: None) -> User:
    """The read-only role: a member of the "operators" group (made by the migration)."""
    user = User.objects.create_user("operator", password="pw")
    group, _ = Group.objects.get_or_create(name="operators")  # a flushed database lost it
    group.permissions.add(Permission.objects.get(codename="view_dashboard"))
    user.groups.add(group)
    return user


#: Every permission a press asks for: the drill's, the job actions' and queue controls', cron's.
PRESS_PERMISSIONS = [
    "dashboard.view_dashboard",
    "dashboard.run_drill",
    "jobs.change_job",
    "jobs.change_schedule",
]


@pytest.fixture
def unstaffed(db: None) -> User:
    """Not staff, yet holding every permission a press asks for: only the `is_staff` half of
    each check stands between this user and a write."""
    user = User.objects.create_user("unstaffed", password="pw")
    for name in PRESS_PERMISSIONS:
        app_label, codename = name.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    user = User.objects.get(pk=user.pk)  # permissions are cached per instance
    assert user.has_perms(PRESS_PERMISSIONS) and not user.is_staff
    return user


@pytest.fixture
def outsider(db: None) -> User:
    return User.objects.create_user("outsider", password="pw")


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def staff_client(staff: User) -> Client:
    return client_for(staff)


@pytest.fixture
def operator_client(operator: User) -> Client:
    return client_for(operator)


def _db_now() -> Any:
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


@pytest.fixture
def zombie_story(make_job: Callable[..., Job]) -> Job:
    """Attempt 1 expired, attempt 2 committed, then attempt 1's commit was refused."""
    job = make_job(state="succeeded", attempt=2, payload={"order": 7})
    t0 = _db_now() - timedelta(seconds=10)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    Attempt.objects.create(
        job=job,
        number=1,
        worker="host:101",
        claimed_at=at(0),
        heartbeat_at=at(0.5),
        ended_at=at(2.5),
        outcome="expired",
    )
    Attempt.objects.create(
        job=job,
        number=2,
        worker="host:102",
        claimed_at=at(3),
        heartbeat_at=at(4),
        ended_at=at(6),
        outcome="succeeded",
    )
    for attempt, type_, s, worker in [
        (1, "claimed", 0, "host:101"),
        (1, "expired", 2.5, "reaper"),
        (2, "claimed", 3, "host:102"),
        (2, "succeeded", 6, "host:102"),
        (1, "rejected", 7, "host:101"),
    ]:
        JobEvent.objects.create(job=job, attempt=attempt, type=type_, worker=worker, at=at(s))
    RejectedWrite.objects.create(
        job=job,
        attempt_presented=1,
        attempt_current=2,
        state_current="succeeded",
        worker="host:101",
        write="commit",
        at=at(7),
    )
    return job


@pytest.fixture(autouse=True)
def close_socket_connections() -> Any:
    """The live sockets query on dashboard.consumers' own threads, each keeping a connection:
    closed after each test, so the test database can be dropped at the end."""
    yield
    from dashboard import consumers

    consumers.close_connections()
