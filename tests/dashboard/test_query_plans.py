"""The list's queries can walk an index in order and stop after a page (EXPLAIN), so they stay
fast at a million rows. Sequential scans are disabled: on a tiny test table the planner would
rightly prefer them, and what is checked here is that an index path exists."""

import pytest
from django.db import connection

from dashboard import selectors
from jobs.models import Job

pytestmark = pytest.mark.django_db


def plan(qs) -> str:  # type: ignore[no-untyped-def]
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cur.fetchall())


def test_first_page_walks_the_primary_key_backwards() -> None:
    text = plan(Job.objects.order_by("-id")[: selectors.PAGE_SIZE + 1])
    assert "Index Scan Backward using jobs_job_pkey" in text


def test_unique_key_search_uses_its_index(make_job) -> None:  # type: ignore[no-untyped-def]
    make_job(unique_key="order-42")
    text = plan(selectors._search(Job.objects.all(), "order-42").order_by("-id")[:51])
    assert "dashboard_job_unique_key_idx" in text


def test_payload_text_search_is_bounded_to_the_newest_window() -> None:
    text = plan(selectors._search(Job.objects.all(), "acme").order_by("-id")[:51])
    assert "jobs_job_pkey" in text
