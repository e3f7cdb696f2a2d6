"""Readiness answers 503 problem+json while the keyspace lacks this code's migrations."""

from __future__ import annotations

import secrets

from app import create_app
from app.config import Config
from app.store import migrations


def test_readyz_503_until_schema_applied(config: Config) -> None:
    fresh = config.replace(keyspace=f"duetime_ready_{secrets.token_hex(3)}")
    app = create_app(fresh)
    services = app.extensions["duetime"]
    try:
        client = app.test_client()
        behind = client.get("/readyz")
        assert behind.status_code == 503
        assert behind.content_type == "application/problem+json"
        assert behind.headers["Retry-After"]
        assert "schema apply" in behind.get_json()["detail"]
        migrations.apply(services.db)
        assert client.get("/readyz").status_code == 200
    finally:
        services.db.execute_raw(f"DROP KEYSPACE IF EXISTS {fresh.keyspace}", timeout=120)
        services.close()
