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
