"""The dashboard at `/`: one page and its script and styles, served by the app itself
(nothing fetched from the internet). The page asks for an API key, keeps it in the browser's
session storage and calls the /v1 API with it, so it shows that key's tenant only."""

from __future__ import annotations

from pathlib import Path

from flask import Flask, Response, send_from_directory

ASSETS = Path(__file__).parent
FILES = ("dashboard.js", "dashboard.css")


def register(app: Flask) -> None:
    @app.route("/")
    def dashboard() -> Response:
        response = send_from_directory(str(ASSETS), "index.html", max_age=0)
        # the page runs only its own script and talks only to this origin
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
        return response

    @app.route("/dashboard/<any(" + ", ".join(f'"{f}"' for f in FILES) + "):name>")
    def dashboard_asset(name: str) -> Response:
        return send_from_directory(str(ASSETS), name, max_age=300)
