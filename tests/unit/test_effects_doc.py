"""docs/effects.md's table of guarantees names the tests that prove each row: every test it
names exists (so the table cannot cite a test that was renamed or never written)."""

import re
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (PROJECT_DIR / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


def test_every_test_the_effects_page_names_exists():
    text = (PROJECT_DIR / "docs/effects.md").read_text()
    named = set(re.findall(r"\b(test_\w+)\b(?!\.py)", text))  # not a module's file name
    assert len(named) > 30
    assert named <= _defined_tests(), sorted(named - _defined_tests())
