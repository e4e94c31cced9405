"""docs/testing.md's "README promises and their tests" names, for each promise, the test that
fails without it as `tests/<file>.py::<test>`: each such test must exist in the file named, so
the table cannot cite a test that moved, was renamed or was never written."""

import re
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
CITED = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _table() -> str:
    text = (PROJECT_DIR / "docs" / "testing.md").read_text()
    return text.split("\n## README promises and their tests\n", 1)[1].split("\n## ", 1)[0]


def _missing(cited: list[tuple[str, str]]) -> list[str]:
    missing = []
    for path, name in cited:
        source = PROJECT_DIR / path
        defined = source.is_file() and re.search(
            rf"^(?:async )?def {name}\(", source.read_text(), re.M
        )
        if not defined:
            missing.append(f"{path}::{name}")
    return missing


def test_every_test_the_readme_promises_table_cites_exists_where_it_says():
    cited = CITED.findall(_table())
    assert len(cited) > 150
    assert _missing(cited) == []


def test_a_cited_test_that_does_not_exist_is_reported():
    assert _missing([("tests/unit/test_readme_promises.py", "test_never_written")]) == [
        "tests/unit/test_readme_promises.py::test_never_written"
    ]
    assert _missing(
        [("tests/unit/nowhere.py", "test_a_cited_test_that_does_not_exist_is_reported")]
    )
