"""The project's documents stand alone: every relative link of the README and of docs/ names a
file of the project, no document points at a contract outside it (the contract is
openapi.yaml), and the README stays a guide a user reads through (under 450 lines)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "clients" / "python" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
OUTSIDE = re.compile(r"\bAPI\.md\b|\.\./shared\b|\bDESIGN\.md\b")


def _local_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_every_relative_link_names_a_file_of_the_project() -> None:
    missing = [(doc.name, target) for doc in DOCUMENTS
               for target in _local_links(doc.read_text(encoding="utf-8"))
               if not (doc.parent / target).exists()]
    assert len(DOCUMENTS) >= 6
    assert missing == []


def test_no_document_or_module_points_outside_the_project() -> None:
    sources = [*DOCUMENTS, ROOT / "openapi.yaml",
               *[p for top in ("app", "workers", "spark", "clients")
                 for p in (ROOT / top).rglob("*.py")]]
    assert [str(p.relative_to(ROOT)) for p in sources
            if OUTSIDE.search(p.read_text(encoding="utf-8"))] == []


def test_the_readme_is_a_guide_not_a_record() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 450, len(lines)
    assert sum(1 for line in lines if line.startswith("## Performance")) == 1


def test_the_link_check_sees_a_broken_link() -> None:
    assert _local_links("see [x](docs/nothing.md) and [y](https://example.com)") == [
        "docs/nothing.md"]


CURRENT = [ROOT / "README.md", *[ROOT / "docs" / n for n in
                                 ("design.md", "operations.md", "development.md", "http-api.md")]]
SOURCE_PATH = re.compile(r"\b((?:app|workers|spark|tests|devstack)/[\w/]+\.py)\b")
MODULE = re.compile(r"(?<![\w./])((?:app|workers|spark)(?:\.[a-z_]\w*)+)")


def _missing_sources(text: str) -> list[str]:
    """Source paths and dotted module names in text that name no file of the project (a
    dotted name may go on into a module's attribute: app.core.timeline.lane_of)."""
    missing = [p for p in SOURCE_PATH.findall(text) if not (ROOT / p).exists()]
    for dotted in MODULE.findall(text):
        parts = dotted.split(".")
        if not any((ROOT / Path(*parts[:n])).with_suffix(".py").exists()
                   or (ROOT / Path(*parts[:n]) / "__init__.py").exists()
                   for n in range(2, len(parts) + 1)):
            missing.append(dotted)
    return missing


def test_the_current_documents_name_modules_that_exist() -> None:
    """README and the present-tense docs (not docs/benchmarks.md, a record of past commits)
    name source files and modules where they are now."""
    assert [(doc.name, m) for doc in CURRENT
            for m in _missing_sources(doc.read_text(encoding="utf-8"))] == []


def test_the_module_check_sees_a_moved_module() -> None:
    assert _missing_sources("see `app/leasing.py` and app.scan.DueScanner") == [
        "app/leasing.py", "app.scan"]
    assert _missing_sources("`app/delivery/leasing.py`, app.delivery.scan.DueScanner") == []
