"""GET /openapi.yaml: the spec generated from the schemas (openapi.yaml in git is its copy)."""

from __future__ import annotations

import http
from typing import Any

from apispec import BasePlugin
from flask import Flask, Response
from flask_smorest import Api
from flask_smorest.utils import prepare_response
from marshmallow import Schema, fields

from app.api.links import Links
from app.schemas import ProblemSchema
from app.schemas.fields import ZONE_FORMAT, ZONES

PROBLEM_TYPE = "application/problem+json"


class CrossFieldRules(BasePlugin):
    """Adds a schema class's JSON_RULES (JSON Schema keywords over the whole object: fields
    that exclude or need each other, checked by its @validates_schema; or what a field's
    metadata cannot carry) to its component, so the document says what the server answers
    400 to."""

    def schema_helper(self, name: str, definition: dict[str, Any],
                      **kwargs: Any) -> dict[str, Any] | None:
        schema = kwargs.get("schema")
        cls = schema if isinstance(schema, type) else type(schema)
        if not issubclass(cls, Schema):
            return None
        rules = getattr(cls, "JSON_RULES", {})
        return {key: _merged(definition.get(key), value) for key, value in rules.items()} or None


ZONE_COMPONENT = "TimeZone"


def zone_reference(self: Any, field: fields.Field, ret: dict[str, Any],
                   **kwargs: Any) -> dict[str, Any]:
    """An apispec attribute function: a field of ZONE_FORMAT is documented as a reference to
    the TimeZone component (the enum of the zones the server takes), so that the ~600 names
    are in the document once. The type and format the other attribute functions gave it
    are the component's; null stays allowed where the field takes it."""
    if ret.get("format") != ZONE_FORMAT:
        return {}
    nullable = "null" in (ret.get("type") or [])
    for key in ("type", "format", "enum"):
        ret.pop(key, None)
    reference = {"$ref": f"#/components/schemas/{ZONE_COMPONENT}"}
    return {"anyOf": [reference, {"type": "null"}]} if nullable else reference


def _merged(generated: Any, extra: Any) -> Any:
    """extra over generated, dicts key by key (a rule on one property keeps the others)."""
    if isinstance(generated, dict) and isinstance(extra, dict):
        return {**generated, **{k: _merged(generated.get(k), v) for k, v in extra.items()}}
    return extra


class DuetimeApi(Api):
    """flask-smorest's Api, with every error response documented as what duetime answers:
    problem+json (RFC 9457). Each operation's `default` response is that body, so 401, 404,
    413, 429 and 503, answered by every route, are all in the document."""

    ERROR_SCHEMA = ProblemSchema

    def __init__(self, app: Flask) -> None:
        super().__init__(app, spec_kwargs={"extra_plugins": [CrossFieldRules(), Links()]})
        self.spec.components.schema(ZONE_COMPONENT, {
            "type": "string", "format": ZONE_FORMAT, "enum": list(ZONES),
            "description": "An IANA time zone: one of the tzdata package's zones, which the "
                           "server takes (any other name: 400)."})
        self.ma_plugin.converter.add_attribute_function(zone_reference)

    def _register_responses(self) -> None:
        for status in http.HTTPStatus:
            response: dict[str, Any] = {"description": status.phrase}
            if not 100 <= status < 200 and status not in (204, 304):
                response["schema"] = self.ERROR_SCHEMA
            prepare_response(response, self.spec, PROBLEM_TYPE)
            self.spec.components.response(status.name, response, lazy=True)
        default: dict[str, Any] = {
            "description": "An error: problem+json (type, title, status, detail; errors per "
                           "field for invalid input). 429 and 503 carry Retry-After.",
            "schema": self.ERROR_SCHEMA}
        prepare_response(default, self.spec, PROBLEM_TYPE)
        self.spec.components.response("DEFAULT_ERROR", default, lazy=True)


def spec_yaml(api: Api) -> str:
    """The OpenAPI document of the running code, as YAML."""
    return str(api.spec.to_yaml())


def register(app: Flask, api: Api) -> None:
    @app.route("/openapi.yaml")
    def openapi_yaml() -> Response:
        return Response(spec_yaml(api), mimetype="application/yaml")
