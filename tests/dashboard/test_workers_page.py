"""The workers page tells a zombie suspect from a silent expired attempt (docs/dashboard.md).

A "zombie suspect" badge marks a running attempt whose lease expired while its worker was heard
from afterwards (a beat on another attempt); an expired attempt whose worker stayed silent is only
"lease expired", and once reclaimed it is listed under "Expired attempts not heard from since".
Every row is made by the real transitions: claims, a heartbeat, the reaper.
"""

import re

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

import jobs
from jobs.core import transitions
from jobs.core.exceptions import LeaseLost
from jobs.worker import reaper
from tests.integration.attempts import Running, claim

# transaction=True: the claims, heartbeat and reclaim run as a worker's would, committed.
pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "host-z:7"


def _lease_runs_out(job_id: int) -> None:
    """The lease expires now on the database clock: after the claim, before anything later."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET lease_expires_at = clock_timestamp() WHERE id = %s", [job_id]
        )


def _two_claims() -> tuple[Running, Running]:
    """One worker holds two jobs; the first one's lease runs out, the second's still runs."""
    jobs.enqueue("test.echo")
    jobs.enqueue("test.echo")
    stuck, other = claim(WORKER), claim(WORKER)
    assert stuck.claimed.fence.job_id != other.claimed.fence.job_id
    _lease_runs_out(stuck.claimed.fence.job_id)
    return stuck, other


def _section(html: str, heading: str) -> str:
    """The part of the page from an <h2> heading to the next one."""
    start = html.index(f"<h2>{heading}</h2>")
    end = html.find("<h2>", start + 1)
    return html[start : end if end != -1 else len(html)]


def _row(section: str, job_id: int) -> str:
    """The table row of a job in a section (exactly one)."""
    link = f'href="{reverse("dashboard:job", args=[job_id])}"'
    rows = [r for r in re.findall(r"<tr[ >].*?</tr>", section, re.S) if link in r]
    assert len(rows) == 1, (job_id, section)
    return rows[0]


def _page(client: Client) -> str:
    response = client.get(reverse("dashboard:workers"))
    assert response.status_code == 200
    return response.content.decode()


RUNNING = "Running attempts"
NOT_HEARD = "Expired attempts not heard from since"


def test_an_expired_attempt_whose_worker_beats_elsewhere_is_a_zombie_suspect(
    operator_client: Client,
) -> None:
    stuck, other = _two_claims()
    transitions.heartbeat(other.claimed.fence, 30)  # the worker is alive after the lease ran out

    running = _section(_page(operator_client), RUNNING)
    suspect = _row(running, stuck.claimed.fence.job_id)
    assert "zombie suspect" in suspect
    assert WORKER in suspect
    live = _row(running, other.claimed.fence.job_id)  # its lease holds: no badge at all
    assert "zombie suspect" not in live and "lease expired" not in live


def test_an_expired_attempt_whose_worker_stays_silent_is_listed_as_not_heard_from(
    operator_client: Client,
) -> None:
    stuck, other = _two_claims()  # no beat from the worker after the lease ran out
    job_id = stuck.claimed.fence.job_id

    row = _row(_section(_page(operator_client), RUNNING), job_id)
    assert "lease expired" in row
    assert "zombie suspect" not in row
    assert "None." in _section(_page(operator_client), NOT_HEARD)  # not reclaimed yet

    assert reaper.reap("reaper:1") == 1  # the attempt ends `expired`; the job is handed on
    html = _page(operator_client)
    assert f'href="{reverse("dashboard:job", args=[job_id])}"' not in _section(html, RUNNING)
    listed = _row(_section(html, NOT_HEARD), job_id)
    assert re.search(rf"<td>1</td><td>{re.escape(WORKER)}\b", listed), listed  # attempt 1


def test_an_expired_attempt_heard_from_again_leaves_the_listing(operator_client: Client) -> None:
    stuck, _ = _two_claims()
    job_id = stuck.claimed.fence.job_id
    assert reaper.reap("reaper:1") == 1
    assert f'href="{reverse("dashboard:job", args=[job_id])}"' in _section(
        _page(operator_client), NOT_HEARD
    )
    with pytest.raises(LeaseLost):  # the zombie's next write is refused and recorded
        transitions.heartbeat(stuck.claimed.fence, 30)
    assert "None." in _section(_page(operator_client), NOT_HEARD)
