"""A page filtered by several fields examines a bounded slice of one index and says so when that
left it short; the next page goes on from there, so every match is still reachable."""

from collections.abc import Callable

import pytest
from django.test import Client
from django.urls import reverse

from dashboard import filters, selectors
from jobs.models import Job

pytestmark = pytest.mark.django_db


def test_a_short_bounded_page_says_what_it_searched_and_the_next_page_goes_on(
    operator_client: Client, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filters, "SCAN_ROWS", 3)
    monkeypatch.setattr(selectors, "SCAN_ROWS", 3)
    old = make_job(kind="a", queue="b")  # the only match, older than the scan's bound
    for _ in range(5):
        make_job(kind="a", queue="other")
    response = operator_client.get(reverse("dashboard:jobs"), {"kind": "a", "queue": "b"})
    page = response.context["page"]
    assert page.jobs == []
    assert "Searched the newest 3 jobs with kind = a" in response.content.decode()
    following = operator_client.get(
        reverse("dashboard:jobs"), {"kind": "a", "queue": "b", "before": page.next_before}
    ).context["page"]
    assert [j.pk for j in following.jobs] == [old.pk]
    assert following.next_before is None and following.scanned == ""


def test_a_single_filter_is_exact_however_far_back_its_match_is(
    operator_client: Client, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filters, "SCAN_ROWS", 3)
    old = make_job(kind="rare")
    for _ in range(5):
        make_job(kind="common")
    page = operator_client.get(reverse("dashboard:jobs"), {"kind": "rare"}).context["page"]
    assert [j.pk for j in page.jobs] == [old.pk] and page.scanned == ""


def test_several_filters_matching_within_the_bound_are_exact(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    wanted = make_job(kind="a", queue="b", state="running", attempt=1)
    make_job(kind="a", queue="b")
    make_job(kind="a", queue="c", state="running", attempt=1)
    page = operator_client.get(
        reverse("dashboard:jobs"), {"kind": "a", "queue": "b", "state": "running"}
    ).context["page"]
    assert [j.pk for j in page.jobs] == [wanted.pk] and page.scanned == ""
