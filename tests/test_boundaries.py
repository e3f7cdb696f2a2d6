"""The project's boundaries. Storage (docs/design.md): only `app/store/` speaks to Cassandra;
no module of the server outside it, of the releasers or of the client imports the driver or
holds CQL text (spark/ and devstack/ may: the connector's jobs and the node's set-up).
Layers: no import circles among the modules of app/, workers/ and spark/, counting imports
made inside functions too."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("app", "workers", "clients")
STORE = ROOT / "app" / "store"
# a string that starts like a CQL statement, or names a table of the keyspace
CQL = re.compile(r"^\s*(SELECT\s.+\sFROM|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s.*FROM|"
                 r"BEGIN\s+(UNLOGGED\s+|COUNTER\s+)?BATCH|(CREATE|ALTER|DROP)\s+(TABLE|INDEX|"
                 r"KEYSPACE))\b|\{ks\}\.", re.IGNORECASE | re.DOTALL)


def _modules() -> list[Path]:
    return [p for top in CHECKED for p in sorted((ROOT / top).rglob("*.py"))
            if STORE not in p.parents and ".venv" not in p.parts]


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    name = path.relative_to(ROOT) if ROOT in path.parents else path.name
    found = []
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [f"{name}:{node.lineno} imports {n}" for n in names
                  if n == "cassandra" or n.startswith("cassandra.")]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and CQL.search(node.value):
            found.append(f"{name}:{node.lineno} holds CQL "
                         f"{node.value[:40]!r}")
    return found


def test_only_the_store_speaks_cql() -> None:
    modules = _modules()
    assert len(modules) > 50  # the walk found the code it checks
    assert [v for p in modules for v in _violations(p)] == []


def test_the_check_finds_a_driver_import_and_cql_text(tmp_path: Path) -> None:
    planted = tmp_path / "probe.py"
    planted.write_text('from cassandra.cluster import ResponseFuture\n'
                       'Q = "SELECT n FROM {ks}.quota_usage WHERE tenant = ?"\n'
                       'DOC = "a select from the docs is prose"\n', encoding="utf-8")
    found = _violations(planted)
    assert len(found) == 2 and "imports cassandra.cluster" in found[0] and "CQL" in found[1]


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _imports(path: Path, known: set[str]) -> set[str]:
    """The project modules path imports (anywhere in it, `from a import b` naming a.b when
    that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found & known


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                circles.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def _graph(paths: Iterable[Path]) -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in paths}
    known = set(modules)
    return {name: _imports(p, known) - {name} for name, p in modules.items()}


def test_no_import_circles() -> None:
    paths = [p for top in ("app", "workers", "spark") for p in (ROOT / top).rglob("*.py")]
    graph = _graph(paths)
    assert len(graph) > 80 and sum(map(len, graph.values())) > 200  # the graph was read
    assert _circles(graph) == []


def test_the_circle_check_finds_one() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_app_keeps_its_modules_in_rooms() -> None:
    """At most ten modules directly in app/; the rest in packages by capability."""
    top = sorted(p.name for p in (ROOT / "app").glob("*.py"))
    rooms = sorted(p.parent.name for p in (ROOT / "app").glob("*/__init__.py"))
    assert "config.py" in top and len(top) <= 10, top
    assert {"api", "store", "messages", "delivery", "campaigns", "schedules", "ops"} <= set(rooms)
