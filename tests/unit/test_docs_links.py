"""Every relative link in README.md and docs/ resolves: the file it names exists, and its
`#anchor` names a heading of that file, slugged the way GitHub slugs headings.

Reads files only (no database). Links and headings inside code (fenced blocks, `code spans`)
are not links or headings; absolute links (http, https, mailto) are not followed.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parents[2]
EXTERNAL = ("http://", "https://", "mailto:")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"\[([^\]]*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")


@dataclass(frozen=True)
class Link:
    source: Path
    line: int
    target: str

    def __str__(self) -> str:
        source = self.source
        shown = source.relative_to(PROJECT_DIR) if PROJECT_DIR in source.parents else source.name
        return f"{shown}:{self.line}: ({self.target})"


def docs_files() -> list[Path]:
    return [PROJECT_DIR / "README.md", *sorted((PROJECT_DIR / "docs").rglob("*.md"))]


def without_fences(text: str) -> str:
    """The text with every fenced code block's lines blanked (line numbers kept)."""
    lines, fence = [], ""
    for line in text.split("\n"):
        marker = FENCE.match(line)
        if fence:
            closing = (
                marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence)
            )
            fence = "" if closing else fence
            lines.append("")
        elif marker:
            fence = marker.group(1)
            lines.append("")
        else:
            lines.append(line)
    return "\n".join(lines)


def prose(text: str) -> str:
    """Fenced blocks and code spans blanked out, line numbers kept: what may hold links."""
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), without_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (a link's text, a code span's content),
    lowercased, punctuation other than `-` and `_` dropped, each space a hyphen."""
    text = LINK.sub(r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in without_fences(path.read_text()).split("\n"):
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[Link]:
    text = prose(path.read_text())
    return [
        Link(path, text.count("\n", 0, match.start()) + 1, match.group(2))
        for match in LINK.finditer(text)
        if match.group(2) and not match.group(2).startswith(EXTERNAL)
    ]


def target_file(link: Link) -> Path:
    name = link.target.split("#", 1)[0]
    return (link.source.parent / name).resolve() if name else link.source


def missing_files(paths: list[Path]) -> list[str]:
    return [
        str(link) for p in paths for link in relative_links(p) if not target_file(link).exists()
    ]


def unknown_anchors(paths: list[Path]) -> list[str]:
    problems = []
    for link in (link for p in paths for link in relative_links(p) if "#" in link.target):
        target = target_file(link)
        if not target.exists():
            continue  # reported by missing_files
        anchor = link.target.split("#", 1)[1]
        if target.suffix != ".md" or anchor not in anchors(target):
            problems.append(f"{link}: no heading '{anchor}' in {target.name}")
    return problems


# -- the project's own docs --------------------------------------------------------------------


def test_every_relative_link_in_the_docs_names_a_file_that_exists():
    assert missing_files(docs_files()) == []


def test_every_anchor_names_a_heading():
    assert unknown_anchors(docs_files()) == []


def test_every_docs_page_is_linked_from_the_readme():
    readme = PROJECT_DIR / "README.md"
    linked = {target_file(link) for link in relative_links(readme)}
    pages = {p.resolve() for p in (PROJECT_DIR / "docs").rglob("*.md")}
    assert pages, "no docs pages found"
    assert sorted(p.name for p in pages - linked) == []


# -- the checker itself can fail ---------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_link_to_a_missing_file_is_reported(tmp_path):
    page = write(tmp_path, "page.md", "# Page\n\nSee [the guide](docs/guide.md).\n")
    assert missing_files([page]) == ["page.md:3: (docs/guide.md)"]


def test_an_anchor_that_names_no_heading_is_reported(tmp_path):
    write(tmp_path, "other.md", "# Other\n\n## Real heading\n")
    page = write(tmp_path, "page.md", "[a](other.md#real-heading) [b](other.md#made-up)\n")
    assert unknown_anchors([page]) == [
        "page.md:1: (other.md#made-up): no heading 'made-up' in other.md"
    ]


def test_links_and_headings_inside_code_are_not_read(tmp_path):
    page = write(
        tmp_path,
        "page.md",
        "# Title\n\n```python\n# not a heading\nx = d[k](missing.md)\n```\n\n"
        "`[code](missing.md)` and [real](#title)\n",
    )
    assert [link.target for link in relative_links(page)] == ["#title"]
    assert anchors(page) == {"title"}


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Every write path fenced", "every-write-path-fenced"),
        (
            "The embedded SQLite default: what it guarantees",
            "the-embedded-sqlite-default-what-it-guarantees",
        ),
        (
            "Choices that differ from, or sharpen, `DESIGN.md`",
            "choices-that-differ-from-or-sharpen-designmd",
        ),
        ("Admin and `manage.py jobs`", "admin-and-managepy-jobs"),
        ("Scale — `bench/scale.py --sizes 10`", "scale--benchscalepy---sizes-10"),
        ("snake_case stays", "snake_case-stays"),
        ("[Linked](elsewhere.md) heading", "linked-heading"),
    ],
)
def test_a_heading_slug_follows_githubs_rules(heading, anchor):
    assert slug(heading) == anchor


def test_a_repeated_heading_gets_a_numbered_anchor(tmp_path):
    page = write(tmp_path, "page.md", "# Tests\n\n## Tests\n\n## Tests\n")
    assert anchors(page) == {"tests", "tests-1", "tests-2"}
