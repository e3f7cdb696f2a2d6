"""Operations endpoints that need no key: liveness and readiness."""

from __future__ import annotations

from typing import Any

from flask import current_app

from app.api.json_body import Blueprint
from app.errors import ClockSkewed, SchemaBehind
from app.ops import clock_skew
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
@blp.alt_response(503, description="Cassandra unreachable, schema behind, or this process's "
                                    "clock past the safety lag from Cassandra's; see Retry-After.")
def readyz() -> dict[str, Any]:
    """Ready: Cassandra answers, the schema is current, this clock is near Cassandra's.

    Near: within DUETIME_SAFETY_LAG_MS; further, this process could hand messages out early.
    The gap to the releaser farthest off is reported, and logged past half the safety lag,
    but does not make this process unready: a releaser's bad clock is that releaser's to
    fix (its own /metrics and log say so), and failing every API process would stop all.
    """
    services = current_app.extensions["duetime"]
    missing = migrations.pending(services.db)
    if missing:
        names = ", ".join(f"{m.version:03d}_{m.name}" for m in missing)
        raise SchemaBehind(f"Pending migrations: {names}. Run `duetime-admin schema apply`.")
    skew = clock_skew.measure_ms(services)
    if abs(skew) > services.config.safety_lag_ms:
        raise ClockSkewed(f"This clock is {skew:+d} ms off Cassandra's, more than "
                          f"DUETIME_SAFETY_LAG_MS ({services.config.safety_lag_ms} ms).")
    applied = max(m.version for m in migrations.discover())
    return {"status": "ready", "schema_version": applied, "clock_skew_ms": skew,
            "releaser_clock_gap_ms": clock_skew.releaser_gap_ms(services, skew)}
