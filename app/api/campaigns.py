"""/v1/topics/{topic}/campaigns views (their operations are followed in app.api.operations)."""

from __future__ import annotations

from typing import Any

from flask import Response, jsonify
from flask.views import MethodView

from app.api.common import SECURITY, services, tenant
from app.api.json_body import Blueprint
from app.api.operations import accepted as _accepted
from app.api.validation import check_name
from app.campaigns import manage as usecases
from app.schemas.campaigns import (
    CampaignListSchema,
    CampaignPatchSchema,
    CampaignSchema,
    OperationAcceptedSchema,
)
from app.topics.manage import get_topic_cached

blp = Blueprint("campaigns", __name__, url_prefix="/v1/topics/<name:topic>",
                description="Campaigns: watch, cancel, shift, pause a send of many messages.")


@blp.route("/campaigns")
class CampaignCollection(MethodView):
    @blp.doc(security=SECURITY)
    @blp.response(200, CampaignListSchema)
    def get(self, topic: str) -> dict[str, Any]:
        """The topic's campaigns (every campaign any of its messages carried)."""
        found = get_topic_cached(services(), tenant(), topic)
        return {"campaigns": usecases.list_views(services(), found)}


@blp.route("/campaigns/<name:campaign>")
class CampaignItem(MethodView):
    @blp.doc(security=SECURITY)
    @blp.response(200, CampaignSchema)
    def get(self, topic: str, campaign: str) -> dict[str, Any]:
        """Counts by state, first and last deliver_at, controls. 404 when no message ever
        carried the campaign."""
        check_name("campaign", campaign)
        found = get_topic_cached(services(), tenant(), topic)
        return usecases.campaign_view(services(), found, campaign)

    @blp.doc(security=SECURITY)
    @blp.response(202, OperationAcceptedSchema, headers={
        "Location": {"description": "The operation's URL.", "schema": {"type": "string"}}})
    @blp.alt_response(409, description="Another operation (shift, resume) runs on it.")
    def delete(self, topic: str, campaign: str) -> tuple[dict[str, Any], int, dict[str, str]]:
        """Cancel the campaign in the background: every message of it not yet delivered is
        cancelled, and the campaign stays cancelled (new messages of it: 409). A message being
        POSTed to a webhook when the cancel reaches it cannot be stopped (counted as
        `delivering`). Asking again while the cancel runs answers the same operation."""
        check_name("campaign", campaign)
        found = get_topic_cached(services(), tenant(), topic)
        return _accepted(topic, usecases.cancel_campaign(services(), found, campaign))

    @blp.doc(security=SECURITY)
    @blp.arguments(CampaignPatchSchema())
    @blp.response(200, CampaignSchema, description="paused / max_per_second set.")
    @blp.alt_response(202, schema=OperationAcceptedSchema,
                      description="shift_ms: the shift runs in the background.")
    @blp.alt_response(409, description="Cancelled, or a shift or a resume asked while another "
                                       "operation runs on it (a pause or a pace is taken).")
    def patch(self, body: dict[str, Any], topic: str, campaign: str) -> Any:
        """Shift every scheduled message (202, an operation), or pause / resume and pace the
        campaign (200). Resuming brings back at once what came due while paused."""
        check_name("campaign", campaign)
        found = get_topic_cached(services(), tenant(), topic)
        if "shift_ms" in body:
            # dumped here: the decorator's schema is the 200 answer's
            payload, status, headers = _accepted(topic, usecases.shift_campaign(
                services(), found, campaign, body["shift_ms"]))
            answer: Response = jsonify(OperationAcceptedSchema().dump(payload))
            answer.status_code = status
            answer.headers.update(headers)
            return answer
        return usecases.set_controls(services(), found, campaign, body)
