"""The README is short and points into docs/; every relative link there resolves, to a file and to a heading."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^(```|~~~)")


def _pages() -> list[Path]:
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    return [ROOT / "README.md", *pages]


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks: a `# comment` in a shell block is no heading, a `[x](y)` no link."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped but hyphens, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(page.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for line in _prose(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"(https?|mailto):", target, re.IGNORECASE):
                continue
            file_part, _, anchor = target.partition("#")
            destination = (page.parent / file_part).resolve() if file_part else page
            if not destination.is_file():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def test_every_link_from_the_readme_and_the_docs_resolves():
    assert [problem for page in _pages() for problem in broken_links(page)] == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, `with` code\n\n```sh\n# not a heading\n```\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading-with-code) [gone](missing.md) [lost](there.md#no-heading)\n"
                    "![picture](missing.png) [code](there.md#not-a-heading) [web](https://example.com/x.md)\n",
                    encoding="utf-8")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: there.md#no-heading (no such heading)",
                                  "page.md: missing.png (no such file)",
                                  "page.md: there.md#not-a-heading (no such heading)"]


def test_the_slug_is_githubs():
    assert slug("Serving many requests: the paged cache") == "serving-many-requests-the-paged-cache"
    assert slug("Compare mode's tolerance") == "compare-modes-tolerance"
    assert slug("MHA, GQA, MQA") == "mha-gqa-mqa"


def test_the_readme_is_short_and_links_every_page_of_the_docs():
    readme = ROOT / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 200
    linked = {target.partition("#")[0] for line in _prose(readme.read_text(encoding="utf-8"))
              for target in LINK.findall(line)}
    assert [page.name for page in _pages()[1:] if f"docs/{page.name}" not in linked] == []
