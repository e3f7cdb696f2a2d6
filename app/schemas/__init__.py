"""marshmallow schemas: the HTTP contract. openapi.yaml is generated from them."""

from app.schemas.operations import HealthSchema, ProblemSchema, ReadySchema

__all__ = ["HealthSchema", "ProblemSchema", "ReadySchema"]
