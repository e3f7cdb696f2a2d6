"""The storage boundary (docs/design.md): only `app/store/` speaks to Cassandra. No module of
the server outside it, of the releasers or of the client imports the driver or holds CQL
text (spark/ and devstack/ may: the connector's jobs and the node's set-up)."""

from __future__ import annotations

import ast
import re
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
