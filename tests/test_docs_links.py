"""The documentation holds together: every relative link in README.md and docs/*.md points at a file
that exists, and README.md stays a five-minute read (at most about 200 lines; 220 allowed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.mac

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 220

# [text](target) or ![alt](target), an optional "title" after the target; not inside code spans or
# fenced blocks, where brackets and parentheses are code (a Python list index, a shell glob).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
EXTERNAL = ("http://", "https://", "mailto:")
# Pages a command writes, linked before their first run: absent, they are not a broken link; present,
# they are checked like any other. {repo-relative path: what writes it}
GENERATED = {
    "docs/compatibility-matrix.md": "harness goldens matrix --out docs/compatibility-matrix.md (docs/upgrade-day.md)",
}


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of each relative link in a markdown file, the #anchor stripped; pure
    #anchor links, external links and anything in code are left out."""
    found, in_fence, in_indented, previous = [], False, False, ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        # an indented code block starts after a blank line (a list item's continuation does not)
        in_indented = line.startswith("    ") and not in_fence and (in_indented or not previous.strip())
        previous = line
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or in_indented:
            continue
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if target.startswith(EXTERNAL) or target.startswith("#"):
                continue
            target = target.split("#", 1)[0]
            if target:
                found.append((number, target))
    return found


def broken_links(files: list[Path], generated: dict[str, str] | None = None, root: Path = ROOT) -> list[str]:
    """'FILE:LINE: TARGET' for each relative link whose target, resolved against its file's
    directory, does not exist (a page in ``generated``, relative to ``root``, may be absent)."""
    may_be_absent = {(root / rel).resolve() for rel in (GENERATED if generated is None else generated)}
    broken = []
    for path in files:
        for number, target in relative_links(path):
            resolved = (path.parent / target).resolve()
            if not resolved.exists() and resolved not in may_be_absent:
                broken.append(f"{path}:{number}: {target}")
    return broken


def test_every_relative_link_resolves():
    files = doc_files()
    assert len(files) > 1, "docs/ has no pages"
    assert broken_links(files) == []


def test_the_checker_reports_a_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# there\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# a page\n\n"
        "[good](docs/there.md#a-section), [anchor](#a-page), [web](https://example.com/x.md),\n"
        "`[in code](missing-in-code.md)`, and [broken](docs/missing.md#part).\n\n"
        "    [indented code](missing-indented.md)\n\n"
        "- a list item\n    [continued](docs/there.md)\n"
    )
    assert relative_links(page) == [(3, "docs/there.md"), (4, "docs/missing.md"), (9, "docs/there.md")]
    assert broken_links(doc_files(tmp_path), generated={}, root=tmp_path) == [f"{page}:4: docs/missing.md"]
    # a page a command writes may be absent; nothing else is excused with it
    assert broken_links(doc_files(tmp_path), generated={"docs/missing.md": "a command"}, root=tmp_path) == []


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to a page under docs/"
