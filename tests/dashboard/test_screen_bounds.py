"""What a browser says about its screen is the client's word: bounded before any query."""

import pytest

from dashboard import broadcast
from jobs.models import Job


def test_a_screen_described_by_a_hostile_browser_is_bounded() -> None:
    from dashboard.consumers import MAX_QUERY, MAX_VISIBLE, screen_from

    screen = screen_from(
        {
            "page": "<script>",
            "job": "²",
            "ids": ",".join(["٣", "9" * 30, *map(str, range(100, 10_100))]),
            "query": "x" * 100_000,
        }
    )
    assert (screen.page, screen.job) == ("overview", None)
    assert len(screen.visible) <= MAX_VISIBLE and 3 not in screen.visible
    assert len(screen.query) == MAX_QUERY


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query, read",
    [("q=\udfff", "q=?"), ("kind=\ud800", "kind=?"), ("queue=x\ud800&q=a", "queue=x?&q=a")],
)
def test_a_screen_naming_a_lone_surrogate_is_read_as_text(query: str, read: str) -> None:
    """A socket's message is JSON, and its "\\ud800" is a lone surrogate, which neither
    psycopg nor a URL can carry: before, rendering such a screen raised."""
    from dashboard.consumers import screen_from

    Job.objects.create(kind="test.echo")
    screen = screen_from({"page": "jobs", "query": query, "ids": "1\ud800"})
    swaps = broadcast.render_swaps(screen, broadcast.Pending(everything=True))
    assert [s["id"] for s in swaps] == ["jobs-table"]
    assert 'id="job-row-' not in swaps[0]["html"]
    assert screen.query == read


def test_the_longest_search_the_page_keeps_reaches_the_screen_whole() -> None:
    """A search in another script is three times longer percent-encoded: at 500 characters
    (the field's length) its query was cut at 2,000, and the push swapped in the list of a
    shorter search than the page showed."""
    from urllib.parse import urlencode

    from dashboard.consumers import screen_from

    query = urlencode({"q": "я" * 500, "kind": "😀" * 100, "queue": "é" * 64})
    screen = screen_from({"page": "jobs", "query": query})
    assert screen.query == query
    assert screen.jobs_filters is not None and screen.jobs_filters["q"] == "я" * 500


@pytest.mark.django_db
def test_a_screen_filtered_at_a_far_utc_offset_is_pushed() -> None:
    """A list filtered by a time at a UTC offset PostgreSQL refuses (past 15:59; Python reads up
    to 23:59): before, its render raised on the socket's pool thread -- no push, ever -- and a
    catch-up at the handshake ended the consumer with a traceback."""
    from urllib.parse import urlencode

    from dashboard.consumers import screen_from

    job = Job.objects.create(kind="test.echo")
    query = urlencode({"since": "2000-01-01T00:00+23:00"})
    screen = screen_from({"page": "jobs", "query": query})
    swaps = broadcast.render_swaps(screen, broadcast.Pending(everything=True))
    assert [s["id"] for s in swaps] == ["jobs-table"]
    assert f'id="job-row-{job.pk}"' in swaps[0]["html"]
