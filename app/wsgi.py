"""WSGI entry point for gunicorn: `gunicorn -c app/gunicorn_conf.py app.wsgi:app`."""

from app import create_app
from app.ops import logs

logs.configure()
app = create_app()
