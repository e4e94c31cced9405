"""The list's queries can walk an index in order and stop after a page (EXPLAIN), so they stay
fast at a million rows. Sequential and bitmap scans are disabled: on a tiny test table the
planner would rightly prefer them -- the bitmap scan once earlier tests have left statistics of
a few rows behind (autovacuum analyzes the test database's tables as they churn) -- and what is
checked here is that an ordered index path exists."""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard import selectors
from jobs.models import Job

pytestmark = pytest.mark.django_db


def plan(qs) -> str:  # type: ignore[no-untyped-def]
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("SET LOCAL enable_bitmapscan = off")
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


def test_an_ascii_payload_search_folds_case_in_the_c_collation() -> None:
    """The locale's ILIKE/UPPER widen every payload's characters first: three times the cost
    over a window of payloads (docs/benchmarks.md, "Dashboard at 1M jobs")."""
    sql = str(selectors._search(Job.objects.all(), "Acme").query)
    assert 'COLLATE "C" ILIKE' in sql and "UPPER" not in sql
    assert "UPPER" in str(selectors._search(Job.objects.all(), "Müller").query)


# -- every filter's first page is bounded ------------------------------------------------------


def plans_of_page(filters: dict) -> list[str]:  # type: ignore[type-arg]
    """EXPLAIN of every query `job_page(filters)` ran against jobs_job."""
    with CaptureQueriesContext(connection) as ran:
        selectors.job_page(filters)
    plans = []
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("SET LOCAL enable_bitmapscan = off")
        for query in ran.captured_queries:
            if "jobs_job" in query["sql"]:
                cur.execute(f"EXPLAIN {query['sql']}")
                plans.append("\n".join(row[0] for row in cur.fetchall()))
    return plans


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"kind": "nope"}, "jobs_job_kind_id_idx"),
        ({"queue": "nope"}, "jobs_job_queue_id_idx"),
        ({"state": "cancelled"}, "jobs_job_state_id_idx"),
        ({"until": datetime(2000, 1, 1, tzinfo=UTC)}, "jobs_job_created_id_idx"),
        ({"since": datetime(2999, 1, 1, tzinfo=UTC)}, "jobs_job_created_id_idx"),
    ],
    ids=["kind", "queue", "state", "until", "since"],
)
def test_a_single_filter_reads_its_own_index(filters: dict, index: str) -> None:  # type: ignore[type-arg]
    plans = plans_of_page(filters)
    assert plans and all(index in p for p in plans), plans
    assert not any("Seq Scan" in p for p in plans)


def test_several_filters_examine_a_bounded_slice_of_one_index() -> None:
    until = datetime(2000, 1, 1, tzinfo=UTC)
    plans = plans_of_page({"kind": "a", "queue": "b", "state": "failed", "until": until})
    assert plans and all("jobs_job_kind_id_idx" in p for p in plans), plans
    # The other filters apply above a LIMITed scan of the driving index, whatever they match.
    scan = plans[0].split("Subquery Scan on scanned", 1)[1]
    assert "Limit" in scan and "Index Scan Backward using jobs_job_kind_id_idx" in scan
    assert not any("Seq Scan" in p for p in plans)
