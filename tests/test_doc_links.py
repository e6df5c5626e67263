"""Relative links in README.md and docs/*.md lead somewhere. `mkdocs build --strict` (scripts/test.sh) checks the
links between docs pages; it cannot see README.md, which lives outside docs/, nor a docs page's link out of docs/
(it rejects those, so the pages name repository files as `code` instead). This covers both, anchors included."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def unfenced(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a `[x](y)` is a link."""
    return re.sub(r"`[^`\n]*`", "", unfenced(text))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors (lower case, punctuation dropped, spaces to hyphens); mkdocs makes the same ones for
    the ASCII headings these pages link to."""
    headings = re.findall(r"^#{1,6} (.+)$", unfenced(page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto: — not this repository's business
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# A heading: here\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading-here) [gone](missing.md) [bad](there.md#nope) [web](https://x.org)\n"
                    "`[code](missing.md)`\n```\n[fenced](missing.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file", "there.md#nope: no heading with anchor #nope"]
