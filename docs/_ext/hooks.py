"""mkdocs hooks (mkdocs.yml ``hooks:``) for building the documentation.

- The examples run in a temporary directory of their own: ``tempfile`` and
  ``TMPDIR`` point into one for the build, which is removed at the end, so
  nothing an example writes is left behind.
- Shell examples (``console`` blocks) run the ``shardstore`` command of the
  Python that builds the docs: its ``bin`` directory goes first on ``PATH``.
- Links to files of the repository outside ``docs/`` (``ARCHITECTURE.md`` is
  included by ``--8<--`` and may link to source files relative to the
  repository's root) become plain text instead of broken links. A link to a file
  that exists nowhere stays as it is, and ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import sys
import tempfile
import xml.etree.ElementTree as etree
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from markdown import Extension, Markdown
from markdown.treeprocessors import Treeprocessor

_state: dict[str, Any] = {"tmp": None, "page": None, "docs": None, "root": None}


class _SourceLinks(Treeprocessor):  # type: ignore[misc]  # Markdown has no annotations
    """Unwrap links to files of the repository that are not documentation pages."""

    def run(self, root: etree.Element) -> None:
        page, docs, repo = _state["page"], _state["docs"], _state["root"]
        if page is None:
            return
        for link in root.iter("a"):
            if _is_source_file(link.get("href", ""), page, docs, repo):
                link.tag = "span"  # the link's text, as text
                link.attrib.pop("href", None)


def _is_source_file(href: str, page: Path, docs: Path, repo: Path) -> bool:
    scheme, netloc, path, _, _ = urlsplit(href)
    if scheme or netloc or not path or path.startswith("/"):
        return False
    path = unquote(path)
    if (page.parent / path).exists() and (page.parent / path).resolve().is_relative_to(docs):
        return False  # a page or file of the site: mkdocs checks it
    for base in (page.parent, repo):
        target = Path(posixpath.normpath(base / path)).resolve()
        if target.exists() and target.is_relative_to(repo) and not target.is_relative_to(docs):
            return True
    return False


class _SourceLinksExtension(Extension):  # type: ignore[misc]
    def extendMarkdown(self, md: Markdown) -> None:  # Markdown's name
        md.treeprocessors.register(_SourceLinks(md), "shardstore_source_links", 1)  # before mkdocs' (0)


def on_startup(**kwargs: Any) -> None:
    tmp = tempfile.mkdtemp(prefix="shardstore-docs-")
    _state["tmp"] = tmp
    tempfile.tempdir = tmp
    os.environ["TMPDIR"] = tmp
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def on_config(config: Any, **kwargs: Any) -> Any:
    _state["docs"] = Path(config["docs_dir"]).resolve()
    _state["root"] = Path(config["config_file_path"]).resolve().parent
    config["markdown_extensions"].append(_SourceLinksExtension())
    return config


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    _state["page"] = Path(page.file.abs_src_path).resolve()
    return markdown


def on_shutdown(**kwargs: Any) -> None:
    if _state["tmp"]:
        shutil.rmtree(_state["tmp"], ignore_errors=True)
