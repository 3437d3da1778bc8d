"""The documentation's promises that need no docs build: the README's shape and
links, the API reference naming exactly the public API, every error class
explained, every Python example run by the build (or titled with what it needs),
and every file the pages name present in the repository.

``mkdocs build --strict`` (``.ci/run docs``) runs the examples and checks the
links inside the site."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import shardstore
from shardstore import errors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README = (ROOT / "README.md").read_text()


def _anchors(page: Path) -> set[str]:
    """The heading ids of a page, as the toc extension makes them (and ``{ #id }``)."""
    ids = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE):
        if explicit := re.search(r"\{ *#([\w-]+) *\}", heading):
            ids.add(explicit.group(1))
            continue
        text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        ids.add(re.sub(r"[-\s]+", "-", text))
    return ids


def test_readme_starts_with_the_two_commands_and_stays_short() -> None:
    assert README.startswith(
        "# shardstore\n\n```bash\n"
        "pip install -e . && python -m shardstore demo\n"
        'pip install -e ".[test]" && python -m pytest -q\n```\n'
    )
    assert len(README.splitlines()) < 200
    # what the second command costs, said where a newcomer reads it first
    assert re.search(r"about [\d,]+ tests on Python 3\.11, [\d,]+ on 3\.12\+;\s+\w+\s+to \w+ minutes", README)


def test_readme_links_reach_files_and_headings() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]+))?\)", README)
    relative = [(target, anchor) for target, anchor in links if "://" not in target]
    assert len([t for t, _ in relative if t.startswith("docs/")]) >= 10
    for target, anchor in relative:
        path = ROOT / target
        assert path.exists(), target
        if anchor:
            assert anchor in _anchors(path), (target, anchor)


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert f": {page.relative_to(DOCS).as_posix()}\n" in nav, page


def test_api_reference_documents_exactly_the_public_names() -> None:
    page = (DOCS / "reference" / "api.md").read_text()
    documented = re.findall(r"^::: shardstore\.(\S+)$", page, re.MULTILINE)
    assert sorted(documented) == sorted(shardstore.__all__)


def test_troubleshooting_explains_every_error_and_warning() -> None:
    page = (DOCS / "guide" / "troubleshooting.md").read_text()
    headings = re.findall(r"^### `(\w+)`$", page, re.MULTILINE)
    assert sorted(headings) == sorted(errors.__all__)
    for name in errors.__all__:
        section = page[page.index(f"### `{name}`") :].split("\n### ")[0]
        assert "**What to do:**" in section or name == "ShardStoreError", name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_python_examples_run_in_the_build(page: Path) -> None:
    """A Python block runs when the site is built (``exec="on"``), unless its title
    says what it needs that the build has not (a cloud bucket, say)."""
    for options in re.findall(r"^```python(.*)$", page.read_text(), re.MULTILINE):
        assert 'exec="on"' in options or 'title="needs ' in options, (
            page,
            options,
        )


def test_files_the_pages_name_exist() -> None:
    """Paths of the repository named in the pages (modules, scripts, tests): a page
    naming a moved file fails here."""
    named = set()
    for page in [*PAGES, ROOT / "README.md"]:
        text = page.read_text()
        named |= set(re.findall(r"`((?:shardstore|benchmarks|examples|tests|\.ci)/[\w./-]*\w/?)`", text))
        named |= {f"tests/{name}" for name in re.findall(r"`(test_\w+\.py)", text)}
    assert len(named) > 20
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing
