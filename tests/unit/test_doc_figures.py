"""Figures docs/dashboard.md and docs/tasks.md state outright, each read where it takes effect.

The behaviour behind them has tests of their own, but those tests read (or shrink) the constants
to stay fast, so a changed number passed them all while the docs went on promising the old one
(a mutation audit: the job page's 100 attempts shown as 101, the payload search's window as
20,001, ... passed every test). These hold the docs to their figures, as test_readme_defaults
holds the README to its own.
"""

from dashboard import access, actions, consumers, cron, queues, selectors
from jobs.tasks import execution


def test_the_job_page_and_the_jobs_list_show_what_the_docs_say() -> None:
    # "the newest 100 attempts, 1,000 boundary events and 200 rejected writes are drawn"
    assert (selectors.ATTEMPT_ROWS, selectors.BOUNDARY_ROWS, selectors.REJECTED_ROWS) == (
        100,
        1_000,
        200,
    )
    # "the event log (the newest 50 events; ... 100 a page)"
    assert (selectors.LOG_ROWS, selectors.EVENT_PAGE_ROWS) == (50, 100)
    # "a payload search examines 20,000 jobs per page"; "at most 10,000 rows" for filters
    assert (selectors.SEARCH_WINDOW, selectors.SCAN_ROWS) == (20_000, 10_000)
    # "tick rows (up to 1,000 ...)", "one request per chunk (500 jobs or one second)"
    assert (actions.MAX_SELECTED, actions.CHUNK_ROWS) == (1_000, 500)
    assert actions.actions.CHUNK_SECONDS == 1.0


def test_the_overview_queues_and_cron_pages_show_what_the_docs_say() -> None:
    # "the 100 queues with the most jobs queued and running"; "the newest 50,000 events";
    # "a count each process keeps for 10 s"
    assert selectors.OVERVIEW_QUEUES == 100
    assert selectors.HISTORY_EVENTS == 50_000
    assert selectors.TERMINAL_COUNTS_SECONDS == 10.0
    assert queues.MAX_QUEUES == 100  # "up to 100"
    assert (cron.RUNS_SHOWN, cron.SCHEDULES_SHOWN) == (5, 100)  # "last five runs", "first 100"


def test_a_socket_is_bounded_as_the_docs_say() -> None:
    assert access.RECHECK_SECONDS == 2.0  # "older than 2 s (`RECHECK_SECONDS`)"
    assert consumers.MESSAGES_BURST == 10
    assert consumers.MAX_MESSAGE == consumers.MAX_HANDSHAKE == 64 * 1024  # "64 K", "64 KB"
    assert consumers.MAX_FIELDS == 16


def test_a_worker_remembers_and_waits_as_docs_tasks_md_says() -> None:
    assert execution.MAX_MISSES == 1_024  # "at most 1,024 kinds it looked for in vain"
    assert execution.EXIT_WAIT_SECONDS == 2.0  # "for at most 2 s"
