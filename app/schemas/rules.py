"""JSON Schema keywords for rules over a whole object (a schema's JSON_RULES, added to its
component by app.api.openapi_file.CrossFieldRules), mirroring its @validates_schema."""

from __future__ import annotations

from typing import Any


def at_most_one(*names: str) -> dict[str, Any]:
    """No two of these fields together."""
    pairs = [[a, b] for n, a in enumerate(names) for b in names[n + 1:]]
    return {"not": {"anyOf": [{"required": p} for p in pairs]}}


def exactly_one(*names: str) -> dict[str, Any]:
    """One of these fields, and only one."""
    return {"oneOf": [{"required": [n]} for n in names]}


def needs(field: str, other: str) -> dict[str, Any]:
    """field only with other."""
    return {"anyOf": [{"not": {"required": [field]}}, {"required": [other]}]}
