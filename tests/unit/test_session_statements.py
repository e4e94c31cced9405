"""The worker's watch over a handler's statements (jobs.worker.session_sql.touches_session,
asked by jobs.worker.hygiene) splits a text into statements only at a `;` that is SQL: one
inside a string literal ('...' with '' inside, E'...' with backslash escapes, $tag$...$tag$), a
quoted identifier or a comment ends no statement. `INSERT INTO t VALUES ('a; SET x')` was taken
for a SET: a reconnect after every such job, and behind a transaction pooler the INSERT refused
(SessionStateThroughPooler)."""

import time

import pytest

from jobs.worker.session_sql import touches_session


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t VALUES ('a; SET x')",
        "insert into t values ('a;set search_path = x')",
        "INSERT INTO t VALUES ('it''s; SET search_path = x')",
        "INSERT INTO t VALUES (E'it\\'s; SET search_path = x')",  # \' inside E'...'
        "INSERT INTO t VALUES (e'a\\\\', 'b; RESET ALL')",  # E'a\\' ends at its second quote
        "SELECT $$a; SET search_path = x$$",
        "SELECT $fn$ a; $$; SET search_path = x $fn$",
        "SELECT $Fn$ a; $fn$; SET search_path = x $Fn$",  # a tag is case-sensitive
        'SELECT 1 AS "a; SET x"',
        'SELECT 1 AS "a"";SET x"',
        "SELECT 1 -- a; SET search_path = x",
        "SELECT 1 /* a; SET search_path = x */",
        "SELECT 1 /* a /* nested */ ; SET search_path = x */",
        "INSERT INTO t VALUES ('a; LISTEN x', 'b; DISCARD ALL', 'c; CREATE TEMP TABLE t ()')",
    ],
)
def test_a_semicolon_inside_a_literal_identifier_or_comment_ends_no_statement(sql: str) -> None:
    assert not touches_session(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'a;b'; SET ROLE nobody",
        "SELECT 'it''s'; SET search_path = x",
        "SELECT E'\\''; SET search_path = x",  # E'\'' is one quote: the SET is SQL
        "SELECT date'2026-01-01'; SET search_path = x",  # date'...', no E'...'
        "SELECT $$;$$; SET search_path = x",
        "SELECT $a$ ; $a$ ; RESET ALL",
        'SELECT 1 AS "x;y"; SET ROLE nobody',
        "SELECT 1 -- c;\n; SET ROLE nobody",
        "SELECT 1 /* /* ; */ */; SET ROLE nobody",
        "SELECT a$b$c FROM t; SET ROLE nobody",  # a `$` inside a name opens no quote
        "SELECT $1; SET ROLE nobody",  # a parameter
        "UPDATE t SET a = 'x'; listen channel",
    ],
)
def test_a_set_after_a_real_semicolon_is_still_seen(sql: str) -> None:
    assert touches_session(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SET/**/search_path = x",
        'SET"search_path" TO x',
        "SELECT 1; set/* c */role nobody",
        "SELECT 1;SET--c\nROLE nobody",
        "/* a */ /* b */ SET ROLE nobody",
    ],
)
def test_a_set_followed_by_a_comment_or_a_quoted_name_is_seen(sql: str) -> None:
    """The server takes a comment or a quoted name after SET as a separator: `set\\s+` read
    these as something else, and the SET went through unseen."""
    assert touches_session(sql)


@pytest.mark.parametrize(
    "sql", ["SET/**/LOCAL x = 1", "SET LOCAL/**/x = 1", "SET\n-- c\nLOCAL x = 1"]
)
def test_a_set_local_after_a_comment_is_still_local(sql: str) -> None:
    assert not touches_session(sql)


def _seconds(sql: str) -> float:
    started = time.perf_counter()
    touches_session(sql)
    return time.perf_counter() - started


# Each of these took seconds (the first grows exponentially: 40 comments never ended) and now
# takes milliseconds; the bound leaves room for a loaded machine.
@pytest.mark.parametrize(
    "sql",
    [
        "/* a */ " * 26 + "SELECT 1",  # each comment could stretch over the next: 2^n splits
        ";/* x */" * 10_000 + "SELECT 1",  # a comment stretched over each later `;`: n^2
        "INSERT INTO temp VALUES (1); " * 40_000,  # the text copied at each INTO TEMP: n^2
    ],
    ids=["leading comments", "semicolon comments", "insert into temp"],
)
def test_a_handlers_statement_is_read_in_linear_time(sql: str) -> None:
    assert _seconds(sql) < 1.5
