"""The two distributions as a user gets them: each built into a wheel from a copy of its
sources (the project is left as it was) and installed in a virtualenv of its own, outside
the project: the server (setup.cfg, `duetime-admin`) and the client (clients/python,
`duetime`, with pytest for its own tests). Built once a run, for the modules that use them."""

from __future__ import annotations

import shutil
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

SERVER_SOURCES = ("setup.cfg", "setup.py", "MANIFEST.in", "pyproject.toml", "README.md",
                  "app", "workers", "spark", "schema")
CLIENT_SOURCE = ROOT / "clients" / "python"
BUILD_S = 600
IGNORED = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")


def build_wheel(pip: Path, source: Path, out: Path) -> Path:
    """The wheel of source, built by this pip (in an isolated build environment)."""
    subprocess.run([str(pip), "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
                   check=True, timeout=BUILD_S)
    [wheel] = out.glob("*.whl")
    return wheel


def new_venv(root: Path) -> Path:
    """An empty virtualenv at root, with pip; its bin directory."""
    venv.create(root, with_pip=True)
    return root / "bin"


@pytest.fixture(scope="session")
def server_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv holding the server's wheel and its dependencies; its bin directory."""
    root = tmp_path_factory.mktemp("server-dist")
    source = root / "source"
    source.mkdir()
    for name in SERVER_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=IGNORED)
        else:
            shutil.copy2(ROOT / name, source / name)
    bin_dir = new_venv(root / "venv")
    wheel = build_wheel(bin_dir / "pip", source, root / "dist")
    subprocess.run([str(bin_dir / "pip"), "install", "-q", str(wheel)], check=True,
                   timeout=BUILD_S)
    yield bin_dir


@pytest.fixture(scope="session")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv holding the client's wheel (urllib3 its only dependency) and pytest,
    for the client's own tests; its bin directory."""
    root = tmp_path_factory.mktemp("client-dist")
    source = root / "source"
    shutil.copytree(CLIENT_SOURCE, source, ignore=IGNORED)
    bin_dir = new_venv(root / "venv")
    wheel = build_wheel(bin_dir / "pip", source, root / "dist")
    subprocess.run([str(bin_dir / "pip"), "install", "-q", str(wheel), "pytest>=8,<9"],
                   check=True, timeout=BUILD_S)
    yield bin_dir
