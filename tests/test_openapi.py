"""openapi.yaml in git is exactly what the code generates, and the app serves the same."""

from __future__ import annotations

import re
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


def test_docs_page_served_with_nothing_from_the_internet(app: Flask) -> None:
    client = app.test_client()
    page = client.get("/docs")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "swagger" in html.lower()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources and all(s.startswith("/docs/assets/") for s in sources), sources
    for source in sources:  # the script and the stylesheet, served by the app itself
        asset = client.get(source)
        assert asset.status_code == 200 and len(asset.data) > 1000, source
    assert client.get("/openapi.json").status_code == 200  # what the page loads
    assert client.get("/docs/assets/../../setup.cfg").status_code == 404


def test_every_status_a_route_documents_is_one_duetime_answers(app: Flask) -> None:
    """An invalid body or query answers 400 (app/api/problems.py); no route answers 422, so
    none documents it, and every route that reads arguments documents its 400."""
    spec = app.extensions["flask-smorest"]["apis"][""]["ext_obj"].spec.to_dict()
    statuses = {(path, method): set(op["responses"])
                for path, ops in spec["paths"].items() for method, op in ops.items()
                if method != "parameters"}
    assert not [route for route, codes in statuses.items() if "422" in codes]
    assert "400" in statuses[("/v1/topics/{topic}/messages", "post")]
    assert "400" in statuses[("/v1/topics/{topic}/campaigns/{campaign}", "patch")]
