"""Acceptance fixtures: qcluster processes, stopped after each test, output shown on failure."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.acceptance.cluster import QCluster, running_clusters
from tests.integration.pgproxy import PgProxy

QCLUSTERS = pytest.StashKey[list[QCluster]]()  # the clusters a test started, for its report


@pytest.fixture
def start_qcluster(
    transactional_db: None, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., QCluster]]:
    """`start_qcluster(**env)` -> a running `manage.py qcluster` on the test database.

    Requests transactional_db so that its teardown (every process gone) runs before
    pytest-django empties the tables.
    """
    with running_clusters(tmp_path) as (start, started):
        request.node.stash[QCLUSTERS] = started
        yield start


@pytest.fixture
def pg_proxy(transactional_db: None) -> Iterator[PgProxy]:
    """A fault-injecting proxy in front of the test database (the test's own connection stays
    direct); healed and closed after the test."""
    settings = connection.settings_dict
    proxy = PgProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """Attach every qcluster's output to a failing report (setup, call or teardown)."""
    report: pytest.TestReport = yield
    if report.failed:
        for i, cluster in enumerate(item.stash.get(QCLUSTERS, [])):
            report.sections.append((f"qcluster {i} output ({report.when})", cluster.log()))
    return report
