"""Schemas of the operations endpoints and of the problem+json error body."""

from __future__ import annotations

from marshmallow import Schema, fields


class HealthSchema(Schema):
    status = fields.String(required=True, metadata={"example": "ok"})


class ReadySchema(Schema):
    status = fields.String(required=True, metadata={"example": "ready"})
    schema_version = fields.Integer(required=True, metadata={"description": "Newest migration."})
    clock_skew_ms = fields.Integer(required=True, metadata={
        "description": "This process's clock minus Cassandra's, in ms (good to half a round "
                       "trip). Past DUETIME_SAFETY_LAG_MS the answer is 503 clock-skewed."})
    releaser_clock_gap_ms = fields.Integer(required=True, allow_none=True, metadata={
        "description": "This clock minus the clock of the live releaser farthest from it, in "
                       "ms (each measured against Cassandra's, every 10 s); null when no "
                       "releaser reported in the last minute. Logged past half of "
                       "DUETIME_SAFETY_LAG_MS; it does not make this process unready."})


class ProblemSchema(Schema):
    """RFC 9457 problem details; `errors` maps each invalid field to its messages."""

    type = fields.String(required=True)
    title = fields.String(required=True)
    status = fields.Integer(required=True)
    detail = fields.String(required=True)
    errors = fields.Dict(keys=fields.String(), values=fields.Raw())
