import time
import pytest
from django.db import connection
from django.urls import reverse
from jobs.models import JobEvent, RejectedWrite, Attempt

pytestmark = pytest.mark.django_db
X = '<script>alert(1)</script>"\'><img src=x onerror=alert(2)>'

def log(*a):
    open("/tmp/ops_probe/log", "a").write(repr(a) + "\n")

@pytest.mark.parametrize("data", ["[" * 5000 + "]" * 5000, '{"n": 1e5000}', '{"s": "%s"}' % ("x" * 5_000_000), '{"x": "%s"}' % X.replace('"', '\\"')])
def test_probe_event_data(admin_client, make_job, data):
    job = make_job(state="running", attempt=1, worker=X)
    ev = JobEvent.objects.create(job=job, attempt=1, type="claimed", worker=X)
    JobEvent.objects.create(job=job, attempt=1, type="heartbeat", worker=X)
    with connection.cursor() as cur:
        cur.execute("UPDATE jobs_jobevent SET data = %s::jsonb WHERE id = %s", [data, ev.pk])
    for url in [reverse("dashboard:job", args=[job.pk]), f"/jobs/{job.pk}/events/", reverse("dashboard:jobs"), "/", "/rejected/", "/workers/", f"/admin/jobs/job/{job.pk}/change/", "/admin/jobs/jobevent/", f"/admin/jobs/jobevent/{ev.pk}/change/"]:
        t = time.monotonic()
        try:
            r = admin_client.get(url)
            body = r.content.decode()
            log(url, data[:12], r.status_code, len(body), "<script>alert" in body, "onerror=alert" in body and "<img src=x" in body, round(time.monotonic() - t, 2))
        except Exception as e:
            log(url, data[:12], "EXC", type(e).__name__, str(e)[:100])

def test_probe_hostile_strings(admin_client, make_job):
    job = make_job(kind=X[:100], queue="q", state="running", attempt=1, worker=X, error=X)
    Attempt.objects.filter(job=job).update(error=X)
    JobEvent.objects.create(job=job, attempt=1, type="failed", worker=X, data={"error": X})
    RejectedWrite.objects.create(job=job, attempt_presented=1, attempt_current=2, state_current=X[:16], worker=X, write="commit", resource=X[:16])
    for url in [reverse("dashboard:job", args=[job.pk]), f"/jobs/{job.pk}/events/", reverse("dashboard:jobs"), "/", "/rejected/", "/workers/", "/queues/", "/cron/", f"/admin/jobs/job/{job.pk}/change/", "/admin/jobs/job/", "/admin/jobs/jobevent/", "/admin/jobs/rejectedwrite/", "/admin/jobs/attempt/"]:
        try:
            r = admin_client.get(url)
            body = r.content.decode()
            log(url, "hostile", r.status_code, len(body), "<script>alert" in body, "<img src=x" in body)
        except Exception as e:
            log(url, "hostile", "EXC", type(e).__name__, str(e)[:100])
