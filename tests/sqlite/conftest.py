"""The SQLite tier borrows the acceptance tier's qcluster fixture (and its failure reports)."""

from tests.acceptance.conftest import pytest_runtest_makereport, start_qcluster

__all__ = ["pytest_runtest_makereport", "start_qcluster"]
