"""GET /openapi.yaml: the spec generated from the schemas (openapi.yaml in git is its copy)."""

from __future__ import annotations

from flask import Flask, Response
from flask_smorest import Api


def spec_yaml(api: Api) -> str:
    """The OpenAPI document of the running code, as YAML."""
    return str(api.spec.to_yaml())


def register(app: Flask, api: Api) -> None:
    @app.route("/openapi.yaml")
    def openapi_yaml() -> Response:
        return Response(spec_yaml(api), mimetype="application/yaml")
