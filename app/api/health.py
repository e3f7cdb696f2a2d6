"""Operations endpoints that need no key: liveness and readiness."""

from __future__ import annotations

from typing import Any

from flask import current_app
from flask_smorest import Blueprint

from app.errors import SchemaBehind
from app.schemas import HealthSchema, ReadySchema
from app.store import migrations

blp = Blueprint("operations", __name__, description="Liveness and readiness (no API key).")


@blp.route("/healthz")
@blp.response(200, HealthSchema)
def healthz() -> dict[str, Any]:
    """The process is up (says nothing about Cassandra)."""
    return {"status": "ok"}


@blp.route("/readyz")
@blp.response(200, ReadySchema)
@blp.alt_response(503, description="Cassandra unreachable or schema behind; see Retry-After.")
def readyz() -> dict[str, Any]:
    """Cassandra answers and every migration of this code is applied."""
    services = current_app.extensions["duetime"]
    missing = migrations.pending(services.db)
    if missing:
        names = ", ".join(f"{m.version:03d}_{m.name}" for m in missing)
        raise SchemaBehind(f"Pending migrations: {names}. Run `duetime schema apply`.")
    applied = max(m.version for m in migrations.discover())
    return {"status": "ready", "schema_version": applied}
