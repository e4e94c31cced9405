"""The jobs list: filters, search by id / unique key / payload, and keyset pagination."""

from collections.abc import Callable

import pytest
from django.test import Client
from django.urls import reverse

from dashboard import selectors
from jobs.models import Job

pytestmark = pytest.mark.django_db


def ids_in(client: Client, **params: str) -> list[int]:
    response = client.get(reverse("dashboard:jobs"), params)
    return [job.pk for job in response.context["page"].jobs]


def test_list_is_newest_first_and_pages_by_keyset(
    operator_client: Client, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selectors, "PAGE_SIZE", 2)
    jobs = [make_job().pk for _ in range(5)]
    first = operator_client.get(reverse("dashboard:jobs")).context
    assert [j.pk for j in first["page"].jobs] == jobs[:-3:-1]
    assert ids_in(operator_client, before=str(first["page"].next_before)) == [jobs[2], jobs[1]]
    assert ids_in(operator_client, before=str(jobs[1])) == [jobs[0]]


def test_filters_by_state_queue_and_kind(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    running = make_job(state="running", attempt=1, queue="mail")
    make_job(kind="test.sleep")
    assert ids_in(operator_client, state="running") == [running.pk]
    assert ids_in(operator_client, queue="mail") == [running.pk]
    assert len(ids_in(operator_client, kind="test.sleep")) == 1


def test_search_finds_a_job_by_id_unique_key_and_payload(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    keyed = make_job(unique_key="order-42", payload={"customer": "acme", "n": 3})
    other = make_job(payload={"customer": "zeta"})
    assert ids_in(operator_client, q=str(other.pk)) == [other.pk]
    assert ids_in(operator_client, q="order-42") == [keyed.pk]
    assert ids_in(operator_client, q="acme") == [keyed.pk]
    assert ids_in(operator_client, q='{"n": 3}') == [keyed.pk]


@pytest.mark.parametrize(
    "q",
    [
        '{"a": "\\u0000"}',
        '{"a": NaN}',
        '{"a": 1e999}',
        '{"a": -Infinity}',
        '{"a": "\\ud800"}',  # a lone surrogate: no UTF-8 text holds one
        '{"\\udfff": 1}',
        '{"a": [{"b": "x\\ud800"}]}',
    ],
)
def test_a_json_search_no_payload_can_hold_matches_nothing_and_errs_nowhere(
    operator_client: Client, make_job: Callable[..., Job], q: str
) -> None:
    # Before: PostgreSQL refused the containment query (a NUL, NaN or an infinity in jsonb), or
    # psycopg could not encode it (a lone surrogate): a 500.
    make_job(payload={"a": 1})
    assert ids_in(operator_client, q=q) == []


def test_filters_by_created_time_range(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    old, new = make_job(), make_job()
    Job.objects.filter(pk=old.pk).update(created_at="2020-01-01T00:00:00Z")
    assert ids_in(operator_client, since="2021-01-01T00:00") == [new.pk]
    assert ids_in(operator_client, until="2021-01-01T00:00") == [old.pk]


@pytest.mark.parametrize(("param", "expected"), [("since", "new"), ("until", "old")])
def test_a_time_at_a_far_utc_offset_filters_by_the_instant_it_names(
    operator_client: Client, make_job: Callable[..., Job], param: str, expected: str
) -> None:
    """Python reads a UTC offset up to 23:59, PostgreSQL refuses one past 15:59: before, the
    list's query raised (a 500). 2020-01-02T00:30+23:00 is 2020-01-01T01:30Z."""
    old, new = make_job(), make_job()
    Job.objects.filter(pk=old.pk).update(created_at="2020-01-01T00:00:00Z")
    Job.objects.filter(pk=new.pk).update(created_at="2020-01-01T02:00:00Z")
    found = ids_in(operator_client, **{param: "2020-01-02T00:30+23:00"})
    assert found == [{"old": old, "new": new}[expected].pk]


def test_invalid_filter_values_are_reported_not_queried(operator_client: Client) -> None:
    response = operator_client.get(reverse("dashboard:jobs"), {"state": "bogus"})
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()


def table_of(html: str) -> str:
    return html[html.index('<div id="jobs-table"') :]


@pytest.mark.parametrize(
    "params, error",
    [
        ({"q": "x" * 501}, "at most 500 characters"),
        ({"state": "bogus"}, "Select a valid choice"),
        ({"kind": "a\x00b"}, "Null characters are not allowed"),
        ({"since": "yesterday"}, "Enter a valid date/time"),
        ({"until": "9999-12-31T23:00-23:00"}, "Enter a valid date/time"),  # no UTC instant
    ],
)
@pytest.mark.parametrize("htmx", [False, True])
def test_an_invalid_filter_shows_no_jobs_and_its_error_in_the_table(
    operator_client: Client, make_job: Callable[..., Job], params: dict, error: str, htmx: bool
) -> None:
    """Before: an invalid filter was dropped and every job listed; an htmx swap (the table
    alone) did not even show why, the errors being in the form outside it."""
    make_job(kind="test.echo")
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = operator_client.get(
        reverse("dashboard:jobs"), {"kind": "test.echo", **params}, **headers
    )
    assert response.status_code == 200
    assert list(response.context["page"].jobs) == []
    table = table_of(response.content.decode())
    assert 'id="job-row-' not in table
    assert 'id="jobs-filter-errors"' in table and error in table


def test_the_search_input_is_bounded_like_the_form(operator_client: Client) -> None:
    html = operator_client.get(reverse("dashboard:jobs")).content.decode()
    assert 'name="q" id="id_q"' in html and 'maxlength="500"' in html.split('id="id_q"')[1][:400]


@pytest.mark.parametrize("q", ["²", "٣", "9" * 30, "1" * 19])
def test_a_search_that_only_looks_like_an_id_is_not_taken_for_one(
    operator_client: Client, q: str
) -> None:
    """Unicode digits and numbers beyond a bigint are searched as text, never cast to an id."""
    response = operator_client.get(reverse("dashboard:jobs"), {"q": q})
    assert response.status_code == 200


def test_a_cursor_beyond_a_bigint_is_reported_not_queried(operator_client: Client) -> None:
    response = operator_client.get(reverse("dashboard:jobs"), {"before": str(2**70)})
    assert response.status_code == 200


def test_payload_text_search_folds_ascii_case_and_takes_wildcards_literally(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    acme = make_job(payload={"customer": "ACME Corp", "note": "50%_off"})
    make_job(payload={"customer": "zeta", "note": "50 off"})
    assert ids_in(operator_client, q="acme corp") == [acme.pk]
    assert ids_in(operator_client, q="aCmE") == [acme.pk]
    assert ids_in(operator_client, q="50%_") == [acme.pk]  # not "50, anything, one character"
    assert ids_in(operator_client, q="0_o") == []
    assert ids_in(operator_client, q="Zeta") != []


def test_a_payload_search_pages_through_older_windows_and_says_what_it_searched(
    operator_client: Client, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each page examines at most SEARCH_WINDOW jobs; a window that ends before the page fills
    says so and its "older" link searches the next window, so every job can still be found."""
    monkeypatch.setattr(selectors, "SEARCH_WINDOW", 3)
    wanted = make_job(payload={"customer": "needle"})
    for _ in range(7):
        make_job(payload={"customer": "hay"})
    first = operator_client.get(reverse("dashboard:jobs"), {"q": "needle"})
    assert [j.pk for j in first.context["page"].jobs] == []
    assert "Searched the newest 3 jobs for this text" in first.content.decode()
    assert "look at 3 jobs per page" in first.content.decode()
    found, before, pages = [], first.context["page"].next_before, 0
    while before and pages < 10:
        page = operator_client.get(reverse("dashboard:jobs"), {"q": "needle", "before": before})
        found += [j.pk for j in page.context["page"].jobs]
        before, pages = page.context["page"].next_before, pages + 1
    assert found == [wanted.pk]
    assert pages <= 3  # windows of 3 below the first: 8 jobs in all


@pytest.mark.parametrize("htmx", [False, True])
@pytest.mark.parametrize(
    "name, limit", [("q", 500), ("kind", 100), ("queue", 64), ("since", 100), ("before", 100)]
)
def test_an_overlong_filter_is_refused_by_name_and_never_echoed(
    operator_client: Client, make_job: Callable[..., Job], name: str, limit: int, htmx: bool
) -> None:
    """Before: a 100 KB search was refused but came back twice in the page (the input, the
    live socket's query), and a parameter no filter reads came back in every link."""
    make_job(kind="test.echo")
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    value = "zq" * 50_000
    response = operator_client.get(
        reverse("dashboard:jobs"), {name: value, "junk": value}, **headers
    )
    assert response.status_code == 200 and list(response.context["page"].jobs) == []
    html = response.content.decode()
    assert f"at most {limit:,} characters (this one has 100,000)" in html
    assert "zqzq" not in html and len(html) < 50_000


def test_an_unknown_parameter_is_left_out_of_the_pages_links(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    make_job(kind="test.echo")
    html = operator_client.get(
        reverse("dashboard:jobs"), {"kind": "test.echo", "junk": "zq"}
    ).content.decode()
    assert "junk" not in html and "kind=test.echo" in html
