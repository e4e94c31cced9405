"""What a browser says about its screen is the client's word: bounded before any query."""


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
