"""docs/effects.md's table of guarantees names the tests that prove each row, and README.md names
the tests behind its promises: every test either names exists, and every test file or folder
the README names too (so neither can cite a test that was renamed or never written)."""

import re
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (PROJECT_DIR / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


def _named_tests(doc: str) -> set[str]:
    text = (PROJECT_DIR / doc).read_text()
    return set(re.findall(r"\b(test_\w+)\b(?!\.py)", text))  # not a module's file name


def test_every_test_the_effects_page_names_exists():
    named = _named_tests("docs/effects.md")
    assert len(named) > 30
    assert named <= _defined_tests(), sorted(named - _defined_tests())


def test_every_test_the_readme_names_exists():
    named = _named_tests("README.md")
    assert len(named) >= 8
    assert named <= _defined_tests(), sorted(named - _defined_tests())
    paths = set(re.findall(r"`(tests/[\w/.]*)`", (PROJECT_DIR / "README.md").read_text()))
    assert len(paths) >= 10
    assert [p for p in sorted(paths) if not (PROJECT_DIR / p).exists()] == []
