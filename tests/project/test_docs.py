"""The documentation: the README is a front page whose links resolve and reach every page of
docs/; the pages build with MkDocs in strict mode, so a broken link or anchor, or a page left out
of the nav, fails the build (and `make test`); every repository path a page names exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

DOCS = REPO / "docs"
FRONT_PAGE_BUDGET = 15_000  # bytes: a front page, not a manual
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a path of the repository written in backticks: `rlmon/service/metrics/catalog.py`
_REPO_PATH = re.compile(r"`((?:rlmon|tests|bench|examples|helm|dashboards|docs)/[^`\s]*)`")


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        capture_output=True, text=True, timeout=120, check=False)


def _slug(heading: str) -> str:
    """The anchor GitHub and MkDocs' toc give a heading (for the headings these pages use)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_pages_build_strictly(tmp_path: Path) -> None:
    built = _mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "design" / "index.html").exists()


def test_a_broken_link_or_a_page_left_out_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "demo.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [a page](no-such-page.md) and [a section](design.md#no-such-section).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n", encoding="utf-8")
    built = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    for named in ("no-such-page.md", "#no-such-section", "orphan.md"):
        assert named in built.stderr, built.stderr


def test_the_readme_is_a_front_page_that_reaches_every_page() -> None:
    readme = REPO / "README.md"
    assert len(readme.read_bytes()) <= FRONT_PAGE_BUDGET
    linked = set()
    for target in _LINK.findall(readme.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        file = (REPO / path).resolve() if path else readme
        assert file.exists(), f"README links to {target}, which does not exist"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file), f"README links to {target}: no such heading"
        linked.add(file)
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "index.md"}
    assert sorted(p.name for p in pages - linked) == []


def test_every_repository_path_the_pages_name_exists() -> None:
    missing = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for path in _REPO_PATH.findall(page.read_text(encoding="utf-8")):
            if any(c in path for c in "<>{}*"):  # a pattern, not a path
                continue
            if not (REPO / path).exists():
                missing.append(f"{page.name}: {path}")
    assert missing == []


def test_lists_and_tables_start_after_a_blank_line() -> None:
    """GitHub starts a list right under a paragraph line; MkDocs' Markdown reads it as the
    paragraph's text, so the README's links and the site would show different pages."""
    starts = re.compile(r"^(- |\* |\d+\. |\|)")
    glued = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        lines = page.read_text(encoding="utf-8").splitlines()
        fenced = False
        for i, line in enumerate(lines[1:], start=1):
            if line.startswith("```"):
                fenced = not fenced
            prev = lines[i - 1]
            if fenced or not starts.match(line) or not prev.strip():
                continue
            if not starts.match(prev) and not prev.startswith(("  ", "<!--")):
                glued.append(f"{page.name}:{i + 1}: {line[:40]}")
    assert glued == []
