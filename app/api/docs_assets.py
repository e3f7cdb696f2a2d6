"""Swagger UI for /docs, served by the app itself from the swagger-ui-bundle package: the page
works with no internet (no CDN)."""

from __future__ import annotations

from flask import Flask, Response, send_from_directory
from swagger_ui_bundle import swagger_ui_path

ASSETS_URL = "/docs/assets/"


def register(app: Flask) -> None:
    @app.route(ASSETS_URL + "<path:name>")
    def swagger_ui_asset(name: str) -> Response:
        return send_from_directory(str(swagger_ui_path), name, max_age=86_400)
