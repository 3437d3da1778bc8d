"""The house in layers, as ARCHITECTURE.md draws it, held against the code's imports
(runtime imports only: those under ``TYPE_CHECKING`` are types, not arrows)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "shardstore"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _graph() -> dict[str, frozenset[str]]:
    """Each module of the package and the modules of the package it imports."""
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, frozenset[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        types_only = {
            id(sub)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for sub in ast.walk(node)
        }
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in types_only:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                    ).strip(".")
                found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
        graph[name] = frozenset(m for m in found if m in paths and m != name)
    return graph


def _part(module: str) -> str:
    """A module's top-level part: a file directly under shardstore/, or a sub-package."""
    return ".".join(module.split(".")[:2])


def _reach(start: str) -> set[str]:
    graph, seen, todo = _graph(), set(), [m for m in _graph() if m.startswith(start)]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def test_no_import_circle_between_top_level_parts() -> None:
    parts: dict[str, set[str]] = {}
    for module, imports in _graph().items():
        if module != "shardstore":  # the package's face re-exports the public API
            parts.setdefault(_part(module), set()).update(_part(m) for m in imports if m != "shardstore")
    for part, uses in parts.items():
        uses.discard(part)
    circles = [p for p in parts if p in set().union(*(_reach_parts(parts, u) for u in parts[p]))]
    assert circles == []


def _reach_parts(parts: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        part = todo.pop()
        if part not in seen:
            seen.add(part)
            todo.extend(parts.get(part, ()))
    return seen


def test_reading_never_reaches_writing() -> None:
    assert sorted(m for m in _reach("shardstore.reading") if m.startswith("shardstore.writing")) == []


def test_the_formats_are_the_ground_floor() -> None:
    """Shard formats import nothing of shardstore but each other, errors and chunk grids."""
    allowed = re.compile(r"shardstore\.(formats(\..+)?|errors|chunk_grids)$")
    leaks = sorted(m for m in _reach("shardstore.formats") if not allowed.match(m))
    assert leaks == []


def test_the_ground_floor_and_the_storage_know_no_shards() -> None:
    for start in ("shardstore.inner", "shardstore.keys", "shardstore.tasks", "shardstore.sync_bridge"):
        knows = sorted(m for m in _reach(start) if re.match(r"shardstore\.(formats|metadata|addressing)", m))
        assert knows == [], start


def test_nothing_outside_the_format_packages_asks_which_format_it_has() -> None:
    asks = re.compile(r"isinstance\([^)]*\b(IndexedFormat|PrecomputedSharding)\b|\.indexed\b")
    homes = ("formats", "neuroglancer")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in homes
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if asks.search(line)
    ]
    assert found == []
