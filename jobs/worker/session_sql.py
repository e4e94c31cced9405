"""Whether a handler's statement leaves state on the database session, read from its text.

Owns: `touches_session(sql)`, which jobs.worker.hygiene's execute wrapper asks of every statement
a handler sends through the drain's connection: a session SET, RESET, DISCARD, LISTEN, LOAD, a
temporary table, a cursor WITH HOLD, a session-level advisory lock, set_config(..., false) --
state the server does not report, which would outlive the job on the worker's connection (or,
behind a pooler, on a pooled server connection). A text of several statements is split at each
`;` that is SQL: one inside a string literal ('...' with '' inside, E'...' with backslash
escapes, $tag$...$tag$), a quoted identifier or a comment (nested /* */ too) ends no statement.

Never: a round trip, or a parse: the common statement (an ORM statement, no `;`) costs a few
regex searches that each start with a literal, ~1-3 us; only a text with a `;` is scanned for
quotes. Not seen: a SET inside a function body, or a text the server parses differently
(standard_conforming_strings off: backslashes escape in '...' too).
"""

import re

# A statement that leaves state on the session the server does not report: a SET that is not
# LOCAL (or of the transaction), RESET, DISCARD, LISTEN, LOAD, a temporary table, a cursor WITH
# HOLD, a session-level advisory lock (the _xact_ ones end with the transaction),
# set_config(..., false or a parameter).
# A statement's first word decides (after blanks and comments; the blanks after SET are taken
# whole before LOCAL is looked for, else `SET  LOCAL` read as `SET` + ` LOCAL`), matched at the
# text's start and after each `;` that is not inside a literal, a quoted identifier or a comment
# (`_statements`); a few function calls and INTO TEMP anywhere. All on the lowered text, each
# search starting with a literal (Python's re then skips ahead quickly): ~1-3 us a 300-character
# ORM statement, where one pattern searched at every position cost ~23 us.
# Blanks and comments are taken whole (possessive, and a comment's end is its first `*/`): one
# that could backtrack -- `/\*.*?\*/` stretched over the next comment, or over a `;` to a later
# `*/` -- tried every way to split a run of comments, exponential in their number (22 leading
# `/* a */` took a second, 40 for ever), and quadratic in a text of many `;/* */`. After SET a
# comment or a quoted name is a separator too (`SET/**/role x`, `SET"search_path" TO x`).
_BLANKS = r"(?:\s++|/\*[^*]*+\*++(?:[^/*][^*]*+\*++)*+/|--[^\n]*+(?:\n|$))*+"
_STARTS = re.compile(
    _BLANKS + r"(?:set(?![\w$])" + _BLANKS + r"(?!local\b|transaction\b|constraints\b)"
    r"|reset\b|discard\b|listen\b|load\b"
    r"|create\s+(?:(?:global|local)\s+)?(?:temp|unlogged\s+temp)"
    r"|declare\b[^;]*?\bwith\s+hold\b)",
    re.DOTALL,
)
# The same on the text as written (a later statement is matched where it starts, in place).
_STARTS_ANY_CASE = re.compile(_STARTS.pattern, re.DOTALL | re.IGNORECASE)
# SELECT ... INTO TEMP[ORARY]: `temp` a whole word (a table named temperatures is not one), and
# not INSERT INTO (a table named temp): `_into_temp` looks before each match. The search starts
# with the literal `into`: one that began with an optional `insert` group was tried at every
# position, ~37 us for an ORM SELECT naming a column `attempt` ("temp" in it), on the hot path.
_INTO_TEMP = re.compile(r"into\s+temp(?:orary)?\b")
_SET_CONFIG = re.compile(
    r"set_config\s*\((?:[^()]|\([^()]*\))*?,\s*"
    r"(?:false|'(?:f|false|off|no|n|0)'(?:::\w+)?|%s|%\(\w+\)s|\$\d+)\s*\)"
)
# What ends a statement, or begins text in which a `;` ends none: a string ('...', E'...'), a
# quoted identifier, a dollar-quoted string ($$...$$, $tag$...$tag$), a comment (--, /* */).
_TOKEN = re.compile(r"[;'\"]|--|/\*|\$(?:[^\W\d]\w*)?\$")
_STRING_END = re.compile(r"[^']*+(?:''[^']*+)*+'")  # '' is a quote inside
_ESCAPE_STRING_END = re.compile(r"[^'\\]*+(?:(?:\\.|'')[^'\\]*+)*+'", re.DOTALL)  # E'\'' too
_IDENTIFIER_END = re.compile(r'[^"]*+(?:""[^"]*+)*+"')
_COMMENT_TOKEN = re.compile(r"/\*|\*/")  # block comments nest


def _word_char(c: str) -> bool:
    return c.isalnum() or c in "_$"


def _after(sql: str, start: int, token: str) -> int:
    """Where the quoted text or comment that `token` opens at `start` ends (the text's end if
    it never does: the server refuses the whole text then, running none of it)."""
    pos = start + len(token)
    if token in "'\"":
        escapes = token == "'" and sql[start - 1 : start] in ("e", "E")
        escapes = escapes and not _word_char(sql[start - 2 : start - 1] or " ")
        end = _ESCAPE_STRING_END if escapes else _STRING_END if token == "'" else _IDENTIFIER_END
        found = end.match(sql, pos)
        return found.end() if found else len(sql)
    if token == "--":
        newline = sql.find("\n", pos)
        return newline + 1 if newline >= 0 else len(sql)
    if token == "/*":
        depth = 1
        while depth:
            found = _COMMENT_TOKEN.search(sql, pos)
            if found is None:
                return len(sql)
            depth += 1 if found.group() == "/*" else -1
            pos = found.end()
        return pos
    close = sql.find(token, pos)  # $tag$ ... $tag$ (the tag as written: it is case-sensitive)
    return close + len(token) if close >= 0 else len(sql)


def _statements(sql: str) -> list[int]:
    """Where each statement after the first begins: after each `;` that is SQL, not inside a
    literal, a quoted identifier or a comment (`INSERT INTO t VALUES ('a; SET x')` is one
    statement: it was taken for a SET, a reconnect per job, refused behind a pooler)."""
    starts, pos = [], 0
    while (found := _TOKEN.search(sql, pos)) is not None:
        token, start = found.group(), found.start()
        if token == ";":
            starts.append(found.end())
            pos = found.end()
        elif token[0] == "$" and start and _word_char(sql[start - 1]):
            pos = start + 1  # a `$` inside a name (a$b$) or a parameter ($1): no quote
        else:
            pos = _after(sql, start, token)
    return starts


def _into_temp(low: str) -> bool:
    for m in _INTO_TEMP.finditer(low):
        start = m.start()
        if start and _word_char(low[start - 1]):
            continue  # a word ending in "into"
        # The word before, past the blanks: walked back, never `low[:start].rstrip()`, a copy
        # of the text so far for every match (quadratic: 10,000 `INSERT INTO temp VALUES (1);`
        # took seconds). The blanks walked over lie between two matches, so all is linear.
        head = start
        while head and low[head - 1].isspace():
            head -= 1
        if low[max(head - 6, 0) : head] == "insert" and not _word_char(
            low[head - 7 : head - 6] or " "
        ):
            continue  # INSERT INTO temp...: a table
        return True
    return False


def touches_session(sql: str) -> bool:
    low = sql.lower()
    if "advisory_lock" in low:  # pg_advisory_lock(_shared), pg_try_...: not the _xact_ ones
        return True
    if "temp" in low and _into_temp(low):
        return True
    if "set_config" in low and _SET_CONFIG.search(low) is not None:
        return True
    if _STARTS.match(low) is not None:
        return True
    return ";" in low and any(_STARTS_ANY_CASE.match(sql, at) for at in _statements(sql))
