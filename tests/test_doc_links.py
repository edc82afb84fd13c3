"""The documentation's links resolve: every relative markdown link in README.md, docs/ and sweeps/README.md names
an existing file (and, with ``#anchor``, an existing heading of it), and every ``docs/<page>.md[#anchor]`` that a
source file, config, sweep, benchmark, notebook or test names exists. Pages move; a stale pointer is caught here."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "sweeps" / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
# paths of other projects quoted in comments (AReaL's documentation), not pages of this repository
EXTERNAL = {"docs/algorithms/prox_approx.md"}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' comment in a code block is no heading
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [a or b for a, b in LINK.findall(text)]


def broken_links() -> list[str]:
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such heading)")
    return broken


def test_every_relative_link_resolves():
    assert broken_links() == []


def missing_pages() -> list[str]:
    roots = ["src", "conf", "sweeps", "benchmarks", "tests", "notebooks", "scripts", "docs", "README.md",
             "pyproject.toml"]
    files = [p for r in roots for p in ([REPO_ROOT / r] if (REPO_ROOT / r).is_file() else (REPO_ROOT / r).rglob("*"))
             if p.is_file() and p.suffix in {".py", ".yaml", ".md", ".ipynb", ".sh", ".toml", ""}
             and not any(part.endswith(".egg-info") or part in {"__pycache__", "outputs", "multirun"}
                         for part in p.relative_to(REPO_ROOT).parts)]  # build and run outputs are not ours
    missing = []
    for f in files:
        for name, anchor in re.findall(r"(?<![\w/.])(docs/[\w./-]+?\.md)(?:#([\w-]+))?", f.read_text(errors="replace")):
            if name in EXTERNAL:
                continue
            if not (REPO_ROOT / name).exists():
                missing.append(f"{f.relative_to(REPO_ROOT)}: {name}")
            elif anchor and anchor not in anchors(REPO_ROOT / name):
                missing.append(f"{f.relative_to(REPO_ROOT)}: {name}#{anchor} (no such heading)")
    return missing


def test_every_docs_page_named_in_the_repository_exists():
    assert missing_pages() == []


def test_the_readme_is_a_guide_of_at_most_200_lines_with_the_docs_map_in_its_first_100():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert any(line.startswith("## Documentation") for line in lines[:100])
