"""An intent's lane (jobs.core.lanes) is the target and its URL's origin spelled one way: every
spelling of one origin is one lane, distinct origins stay distinct, and a value that is no URL
gets the target's own lane without raising (it is a handler's value, named in the commit path)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core.lanes import MAX_LANE, MAX_URL, UNPARSED, lane, origin

ONE_ORIGIN = [
    "http://h",
    "http://h/",
    "http://h/hook?x=1#y",
    "HTTP://h/hook",
    "Http://H/hook",
    "http://h:80/hook",
    "http://h:080/hook",
    "http://h:/hook",
    "http://user@h/hook",
    "http://user:secret@h:80/hook",
    "http://H./hook",
    "http://h./hook",
    " http://h/hook",  # urlsplit drops leading blanks and tabs or newlines anywhere
    "ht\ttp://h/hook",
]


@pytest.mark.parametrize("url", ONE_ORIGIN)
def test_every_spelling_of_one_origin_is_one_lane(url):
    assert lane("webhook", {"url": url}) == "webhook http://h"


@pytest.mark.parametrize(
    ("spellings", "expected"),
    [
        (["https://h", "https://h:443/x", "HTTPS://u@H.:443"], "https://h"),
        (["http://[::1]/", "http://[::1]:80/", "http://[0:0:0:0:0:0:0:1]/x"], "http://[::1]"),
        (
            ["http://[2001:DB8::1]:8080/", "http://[2001:db8:0::1]:8080"],
            "http://[2001:db8::1]:8080",
        ),
        (
            ["http://127.0.0.1", "http://127.1/", "http://0x7f.0.0.1:80", "http://2130706433/"],
            "http://127.0.0.1",
        ),
        (["http://[::ffff:127.0.0.1]/", "http://127.0.0.1:80/"], "http://127.0.0.1"),
        (
            ["http://bücher.example/", "http://XN--BCHER-KVA.example./"],
            "http://xn--bcher-kva.example",
        ),
    ],
)
def test_addresses_and_names_are_spelled_one_way(spellings, expected):
    assert {origin(url) for url in spellings} == {expected}


def test_distinct_ports_hosts_and_schemes_stay_distinct():
    urls = [
        "http://h",
        "http://h:8080",
        "http://h:443",
        "https://h",
        "https://h:80",
        "http://h2",
        "http://h.example",
        "http://10.0.0.1",
        "http://10.0.0.2",
        "http://[::1]",
        "http://[::2]",
        "ftp://h",
        "ftp://h:21",
    ]
    lanes = {lane("webhook", {"url": url}) for url in urls}
    assert len(lanes) == len(urls)
    assert lane("webhook", {"url": "http://h"}) != lane("mail", {"url": "http://h"})


def test_data_naming_no_url_is_the_targets_own_lane():
    for data in [{}, {"json": {"url": "http://h"}}, [], "http://h", None, 5]:
        assert lane("mail", data) == "mail"


class _HostileDict(dict):
    def get(self, *args):
        raise RuntimeError("get")

    def __getitem__(self, key):
        raise RuntimeError("getitem")

    def __contains__(self, key):
        raise RuntimeError("contains")


class _HostileStr(str):
    def lower(self):
        raise RuntimeError("lower")

    def __str__(self):
        raise RuntimeError("str")


GARBAGE = [
    None,
    5,
    ["http://h"],
    {"nested": "http://h"},
    "",
    "h",
    "h/hook",
    "mailto:ops@h",
    "http:/h",
    "http:h",
    "//h/hook",
    "http://",
    "http://:80/",
    "http://user@/",
    "http://h:99999/",
    "http://h:-1/",
    "http://h:8o/",
    "http://h:1:2/",
    "http://::1/",
    "http://[::1/",
    "http://[not-v6]/",
    "http://a b/",
    "http://a..b/",
    "http://h%00/",
    "http://h\x00/",
    "http://999.1.1.1/",
    "http://ü" + "a" * 70 + ".example/",  # an IDN label too long to encode
    "http://h/" + "x" * MAX_URL,
    "http://\udcff/",
]


@pytest.mark.parametrize("url", GARBAGE, ids=lambda u: repr(u)[:40])
def test_a_url_that_cannot_be_parsed_gets_the_targets_unparsed_lane_without_raising(url):
    assert origin(url) is None
    assert lane("webhook", {"url": url}) == f"webhook {UNPARSED}"


def test_the_unparsed_lane_cannot_be_an_origins():
    assert not UNPARSED[0].isalpha()  # an origin begins with its scheme's letter
    assert lane("webhook", {"url": None}) != lane("webhook", {})


def test_a_hostile_dict_or_str_from_handler_code_is_read_as_json_would_encode_it():
    assert lane("webhook", _HostileDict(url="HTTP://H/")) == "webhook http://h"
    assert lane("webhook", {"url": _HostileStr("HTTP://H/")}) == "webhook http://h"


def test_a_huge_origin_is_cut_deterministically_and_two_stay_two():
    first = lane("webhook", {"url": f"http://{'a.' * 150}one/"})
    second = lane("webhook", {"url": f"http://{'a.' * 150}two/"})
    assert len(first) == len(second) == MAX_LANE
    assert first != second
    assert first == lane("webhook", {"url": f"HTTP://{'A.' * 150}one.:80/x"})
    assert "~" in first and "~" not in lane("webhook", {"url": "http://h"})


@given(st.one_of(st.text(max_size=300), st.binary(max_size=50), st.integers(), st.none()))
def test_any_value_gets_a_bounded_lane(url):
    named = lane("webhook", {"url": url})
    assert named.startswith("webhook ") and len(named) <= MAX_LANE


@given(st.from_regex(r"[a-zA-Z][a-zA-Z0-9+.-]{0,8}://[^/?#]{0,40}([/?#].{0,20})?", fullmatch=True))
def test_any_url_like_text_gets_a_bounded_lane(url):
    named = lane("webhook", {"url": url})
    assert named.startswith("webhook ") and len(named) <= MAX_LANE
