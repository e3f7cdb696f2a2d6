"""/v1/topics/{topic}/operations views: start an operation on the messages a filter
matches, and follow any operation (of a campaign or of a filter)."""

from __future__ import annotations

import dataclasses
from typing import Any

from flask import url_for
from flask.views import MethodView

from app.api.common import SECURITY, services, tenant
from app.api.json_body import Blueprint
from app.campaigns import manage as campaigns
from app.messages import filtered_ops
from app.schemas.campaigns import OperationAcceptedSchema, OperationSchema
from app.schemas.filtered_operations import OperationRequestSchema
from app.store.operations import Operation
from app.topics.manage import get_topic_cached

blp = Blueprint("background_operations", __name__, url_prefix="/v1/topics/<name:topic>",
                description="Operations on many messages, run in the background: on a "
                            "campaign, or on the messages a filter matches.")


def operation_view(op: Operation) -> dict[str, Any]:
    view = {k: v for k, v in dataclasses.asdict(op).items() if k in OperationSchema().fields}
    view["filter"] = None if op.filter is None else filtered_ops.filter_fields(op.filter)
    return view


def accepted(topic: str, op: Operation) -> tuple[dict[str, Any], int, dict[str, str]]:
    """The 202 answer of a started operation: the operation, and its URL as Location."""
    location = url_for("background_operations.OperationItem", topic=topic, op_id=str(op.id))
    return {"operation": operation_view(op)}, 202, {"Location": location}


@blp.route("/operations")
class OperationCollection(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(OperationRequestSchema())
    @blp.response(202, OperationAcceptedSchema, headers={
        "Location": {"description": "The operation's URL.", "schema": {"type": "string"}}})
    @blp.alt_response(404, description="pause / resume: no message ever carried the "
                                       "campaign.")
    @blp.alt_response(409, description="pause / resume: the campaign is cancelled; resume: "
                                       "another operation runs on it.")
    def post(self, body: dict[str, Any], topic: str
             ) -> tuple[dict[str, Any], int, dict[str, str]]:
        """Cancel, shift, pause or resume the messages a filter matches.

        See `kind` for what each does; follow the operation at its Location."""
        found = get_topic_cached(services(), tenant(), topic)
        return accepted(topic, filtered_ops.start(services(), found, body["kind"],
                                                  body["filter"], body.get("shift_ms", 0)))


@blp.route("/operations/<string:op_id>")
class OperationItem(MethodView):
    @blp.doc(security=SECURITY)
    @blp.response(200, OperationSchema)
    def get(self, topic: str, op_id: str) -> dict[str, Any]:
        """An operation's progress (of a campaign, or of a filter)."""
        found = get_topic_cached(services(), tenant(), topic)
        return operation_view(campaigns.get_operation(services(), found, op_id))
