"""openapi.yaml in git is exactly what the code generates, and the app serves the same."""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from app.api.openapi_file import spec_yaml

ROOT = Path(__file__).resolve().parent.parent


def test_committed_openapi_equals_generated(app: Flask) -> None:
    generated = spec_yaml(app.extensions["flask-smorest"]["apis"][""]["ext_obj"])
    committed = (ROOT / "openapi.yaml").read_text()
    assert committed == generated, "run `make openapi` and commit openapi.yaml"


def test_served_openapi_is_the_generated_one(app: Flask) -> None:
    served = app.test_client().get("/openapi.yaml")
    assert served.status_code == 200
    assert served.get_data(as_text=True) == (ROOT / "openapi.yaml").read_text()


def test_docs_page_served(app: Flask) -> None:
    page = app.test_client().get("/docs")
    assert page.status_code == 200
    assert b"swagger" in page.data.lower()
