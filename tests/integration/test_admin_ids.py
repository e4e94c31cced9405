"""Ids from the admin's URLs and forms: an id no row can have (a NUL byte, which PostgreSQL's
text refuses; "abc" for a numeric id) is refused with a clear answer -- a 400 for a URL path
holding NUL (config/middleware.py), an action refused with a message (jobs/admin/common.py,
CheckedLookups) -- never a 500, on every admin screen, and the screen works on."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.utils import timezone
from django_q.models import Success

from jobs.core.states import JobState
from jobs.models import Job, QueueControl

pytestmark = pytest.mark.django_db


# Before: a 500 for each but the last (DataError: PostgreSQL text fields cannot contain NUL): a
# record whose id is text, and the admin's "view on site", looked the id up as it came. A NUL
# byte in a URL's path names nothing anywhere.
@pytest.mark.parametrize(
    "path",
    [
        "/admin/jobs/queuecontrol/%00/change/",
        "/admin/jobs/queuecontrol/a%00b/history/",
        "/admin/django_q/success/%00/delete/",
        "/admin/django_q/failure/a%00b/change/",
        "/admin/r/{queuecontrol}/%00/",
        "/admin/r/{success}/a%00b/",
        "/jobs/%00/",
    ],
)
def test_a_url_path_holding_nul_is_a_bad_request(admin_client, path):
    types = {
        "queuecontrol": ContentType.objects.get_for_model(QueueControl).pk,
        "success": ContentType.objects.get_for_model(Success).pk,
    }
    response = admin_client.get(path.format(**types))
    assert response.status_code == 400
    assert b"NUL" in response.content
    assert admin_client.get("/admin/jobs/queuecontrol/").status_code == 200


@pytest.mark.asyncio
async def test_under_asgi_too_a_url_path_holding_nul_is_a_bad_request(async_client):
    # The production server runs the middleware's async half.
    response = await async_client.get("/admin/r/1/%00/")
    assert response.status_code == 400 and b"NUL" in response.content


# Before: each was a 500 -- ValueError ("Field 'id' expected a number but got 'abc'") for a
# numeric id, DataError for a NUL in a text one -- on our screens and Django's own alike.
@pytest.mark.parametrize(
    "screen, action, selected",
    [
        ("jobs/job", "cancel_jobs", "abc"),
        ("jobs/job", "requeue_jobs", "1.5"),
        ("jobs/job", "cancel_jobs", "\x00"),
        ("jobs/intent", "retry_failed_intents", "abc"),
        ("jobs/queuecontrol", "pause_queues", "a\x00b"),
        ("auth/user", "delete_selected", "abc"),
        ("auth/group", "delete_selected", "x" * 5000),
    ],
)
def test_an_action_on_a_selection_no_row_can_be_is_refused_and_changes_nothing(
    admin_client, make_job, screen, action, selected
):
    job = make_job()
    response = admin_client.post(
        f"/admin/{screen}/",
        {"action": action, "_selected_action": [str(job.pk), selected], "index": "0"},
    )
    assert response.status_code == 302 and response["Location"] == f"/admin/{screen}/"
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("nothing was done" in m for m in said), said
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED  # the good id is not acted on
    assert not LogEntry.objects.exists()
    assert admin_client.get(f"/admin/{screen}/").status_code == 200


def test_an_action_on_a_selection_of_real_ids_still_acts(admin_client, make_job):
    job = make_job()
    response = admin_client.post(
        "/admin/jobs/job/",
        {"action": "cancel_jobs", "_selected_action": [str(job.pk), "9" * 30], "index": "0"},
    )
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_axes_clean_up_of_expired_login_attempts_works_from_the_admin(admin_client, settings):
    # Before: a 500 whatever was selected (AttributeError: no `axes_attempt_time` on a request
    # that is not a login). Attempts past the cool-off are deleted; a recent one stays.
    old, _recent = (
        AccessAttempt.objects.create(
            username=name,
            ip_address="10.0.0.1",
            user_agent="ua",
            failures_since_start=1,
            get_data="",
            post_data="",
            http_accept="",
            path_info="/login/",
        )  # fmt: skip
        for name in ("old", "recent")
    )
    AccessAttempt.objects.filter(pk=old.pk).update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(minutes=1)
    )
    response = admin_client.post(
        "/admin/axes/accessattempt/",
        {"action": "cleanup_expired_attempts", "_selected_action": [str(old.pk)], "index": "0"},
    )
    assert response.status_code == 302
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["recent"]
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said == ["Cleaned up 1 expired access attempts."]
