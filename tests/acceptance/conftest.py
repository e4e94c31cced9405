"""Acceptance fixtures: qcluster processes, stopped after each test, output shown on failure."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.acceptance.cluster import QCluster, running_clusters

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """Attach every qcluster's output to a failing report (setup, call or teardown)."""
    report: pytest.TestReport = yield
    if report.failed:
        for i, cluster in enumerate(item.stash.get(QCLUSTERS, [])):
            report.sections.append((f"qcluster {i} output ({report.when})", cluster.log()))
    return report
