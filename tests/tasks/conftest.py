"""The acceptance tier's qcluster fixture (and its failure report) for the task tests too."""

from tests.acceptance.conftest import pytest_runtest_makereport, start_qcluster

__all__ = ["pytest_runtest_makereport", "start_qcluster"]
