"""A Flask app that does nothing but answer `GET /healthz`: served by gunicorn with duetime's
own settings (app/gunicorn_conf.py), it is the floor of any one-message request on the
machine, whatever duetime's code does (tests.bench.single.bare_floor)."""

from flask import Flask, Response, jsonify

app = Flask(__name__)


@app.get("/healthz")
def healthz() -> Response:
    return jsonify(status="ok")
