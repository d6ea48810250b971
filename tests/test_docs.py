"""The documents hold together: every page is in ``docs/README.md``'s index, and every relative link and ``#anchor``
in a page resolves, anchors by GitHub's rules for heading ids (so a link that works here works on GitHub).

Pages: every Markdown file under ``docs/``, and the top-level ``README.md``, ``CONTRIBUTING.md`` and ``CHANGELOG.md``
(linked from the index like the others); the model cards' links are checked too. Code blocks and inline code are
not read: a heading or a link there is text.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")
INDEX = ROOT / "docs" / "README.md"

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)


def pages(root: Path = ROOT) -> list[Path]:
    """Every page the index must name: the Markdown files under ``docs/`` and the top-level documents."""
    found = sorted((root / "docs").rglob("*.md"))
    return found + [root / name for name in TOP_LEVEL if (root / name).exists()]


def model_cards(root: Path = ROOT) -> list[Path]:
    """The model cards beside the shipped weights: their links are checked too (the index names them in prose)."""
    return sorted((root / "models").glob("*/README.md"))


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a heading or link in one is text)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's id for a heading: its rendered text lower-cased, every character that is not a letter, digit, mark,
    ``_``, ``-`` or space dropped, spaces made hyphens (github-slugger's rule)."""
    text = _LINK.sub(lambda match: match.group(1), heading)  # a link renders as its text
    text = _INLINE_CODE.sub(lambda match: match.group(2), text)
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(c for c in text if c in "_- " or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The ids a link may name on ``page``: its headings' slugs (a repeated one numbered ``-1``, ``-2`` …, as GitHub
    numbers them) and explicit ``<a name>`` / ``<a id>`` targets."""
    ids, seen = set(), Counter()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        ids.update(_HTML_ID.findall(line))
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            ids.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return ids


def links(page: Path) -> list[str]:
    """The link targets of ``page``'s prose, in order."""
    found = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        found += [match.group(2) for match in _LINK.finditer(_INLINE_CODE.sub("", line))]
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file or folder is missing, or whose ``#anchor`` names no id of its page,
    with the reason."""
    problems = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto: …: not this tree's to check
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{target}: no such file or folder")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            problems.append(f"{target}: no heading or anchor #{anchor} in {resolved.name}")
    return problems


def indexed(index: Path = INDEX) -> set[Path]:
    """The files ``index`` links to (anchors dropped)."""
    return {(index.parent / unquote(target.partition("#")[0])).resolve()
            for target in links(index) if target.partition("#")[0]}


def test_slugs_follow_github() -> None:
    """References: ids GitHub gives these headings (checked on rendered pages of this repository)."""
    assert slug("Set-up") == "set-up"
    assert slug("The main job: compare presses on the default model") == (
        "the-main-job-compare-presses-on-the-default-model")
    assert slug("Where commands write: nothing written is lost") == "where-commands-write-nothing-written-is-lost"
    assert slug("`bench compare`") == "bench-compare"
    assert slug("Observation 4 (§4.2): the gate weights") == "observation-4-42-the-gate-weights"
    assert slug("The group at 2,048 tokens (whole)") == "the-group-at-2048-tokens-whole"
    assert slug("hybrid-byte-12l (weights a7df) · 384 tokens") == "hybrid-byte-12l-weights-a7df--384-tokens"
    assert slug("niah_multikey_1 and [its page](x.md)") == "niah_multikey_1-and-its-page"


def test_the_checker_finds_what_is_broken(tmp_path: Path) -> None:
    """A missing file, a missing anchor and a repeated heading's second id: found, and only those."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A\n## Part\n## Part\n```\n## Not a heading\n[in code](gone.md)\n```\n"
        "[ok](b.md#b-title) [second](#part-1) [`code`](#a) [bad file](gone.md) [bad anchor](b.md#nope)\n"
        "`[in inline code](gone.md)` [web](https://example.com/x.md#y) [folder](.)\n", encoding="utf-8")
    (tmp_path / "docs" / "b.md").write_text("# B title\n", encoding="utf-8")
    assert broken_links(tmp_path / "docs" / "a.md") == [
        "gone.md: no such file or folder", "b.md#nope: no heading or anchor #nope in b.md"]
    assert anchors(tmp_path / "docs" / "a.md") == {"a", "part", "part-1"}


def test_every_page_is_in_the_index() -> None:
    listed = indexed()
    missing = [str(page.relative_to(ROOT)) for page in pages() if page != INDEX and page.resolve() not in listed]
    assert not missing, f"pages missing from docs/README.md's index: {missing}"


@pytest.mark.parametrize("page", pages() + model_cards(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_and_anchor_resolves(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(ROOT)}: {broken_links(page)}"
