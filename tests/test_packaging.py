"""What the server distribution declares and needs, read from setup.cfg and the code: no
dependency on the client (a name not on any index), a dependency only where code imports it,
uvloop only where it exists, and the Spark connector found in DUETIME_SPARK_JARS or fetched
by spark-submit."""

from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

import pytest

from spark import submit
from tests.conftest import ROOT


def _requirements(section: str, key: str) -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return [line.strip() for line in cfg[section][key].splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _imported_roots(*packages: str) -> set[str]:
    roots = set()
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    roots |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    roots.add(node.module.split(".")[0])
    return roots


def test_the_server_needs_nothing_of_the_client() -> None:
    required = _requirements("options", "install_requires")
    assert not [r for r in required if r.lower().startswith("duetime")], required
    assert "duetime_client" not in _imported_roots("app", "workers", "spark")


def test_uvloop_only_where_it_exists_and_no_unused_spark_dependency() -> None:
    [uvloop] = [r for r in _requirements("options", "install_requires")
                if r.startswith("uvloop")]
    assert uvloop.endswith('; sys_platform != "win32"')
    spark_extra = [re.split(r"[<>=;\s]", r)[0].lower()
                   for r in _requirements("options.extras_require", "spark")]
    imported = _imported_roots("spark")
    assert all(name in imported for name in spark_extra), (spark_extra, imported)


def test_the_connector_jars_come_from_duetime_spark_jars_or_spark_submit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUETIME_SPARK_JARS", str(tmp_path))
    assert submit.connector_args() == ["--packages", submit.CONNECTOR]
    (tmp_path / "b.jar").write_bytes(b"")
    (tmp_path / "a.jar").write_bytes(b"")
    assert submit.connector_args() == ["--jars", f"{tmp_path / 'a.jar'},{tmp_path / 'b.jar'}"]
    monkeypatch.delenv("DUETIME_SPARK_JARS")
    assert submit.jars_dir() == ROOT / "var" / "spark" / "jars"
    # the version spark-submit would fetch is the one `make setup` fetches
    pom = (ROOT / "devstack" / "spark-pom.xml").read_text()
    [version] = re.findall(r"<connector.version>(.+)</connector.version>", pom)
    assert submit.CONNECTOR.endswith(f"_2.12:{version}")
