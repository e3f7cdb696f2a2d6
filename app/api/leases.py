"""Pull consumption views: leases (long poll), ack, nack, extend."""

from __future__ import annotations

import contextlib
from typing import Any

from flask import request
from flask.views import MethodView

from app.api.common import SECURITY, ack_groups, services, tenant
from app.api.json_body import Blueprint
from app.api.messages import payload_fields
from app.api.problems import error_fields
from app.api.validation import check_message_id
from app.delivery import leasing
from app.delivery.waits import STAYING
from app.schemas.messages import (
    AckBatchResultSchema,
    AckBatchSchema,
    AckSchema,
    ExtendResponseSchema,
    ExtendSchema,
    LeaseRequestSchema,
    LeaseResponseSchema,
    NackSchema,
)
from app.topics.manage import get_topic_cached

blp = Blueprint("consuming", __name__, url_prefix="/v1/topics/<name:topic>",
                description="Pull consumption: lease due messages, then ack, nack or extend.")


def _lease_seconds(body: dict[str, Any], default: int) -> int:
    cfg = services().config
    return max(cfg.min_lease_s, min(cfg.max_lease_s, body.get("lease_seconds") or default))


@blp.route("/leases")
class Leases(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(LeaseRequestSchema(), required=False)
    @blp.response(200, LeaseResponseSchema)
    @blp.alt_response(409, description="A webhook topic: its messages are pushed, not leased.")
    def post(self, body: dict[str, Any], topic: str) -> dict[str, Any]:
        """Lease up to `max` due messages, waiting up to `wait_ms` for the first.

        A message is never handed out before its deliver_at, and to one consumer at a time.
        It is leased only for a call that waits, at or after its due moment: nothing is
        leased ahead of a consumer, so no attempt is counted for a message no consumer
        received. Among due messages: lower priority value first, then earlier due time,
        then turns across groups. Leases are served by the releasers that own the topic's
        shards. While its shards move between releasers the answer may be empty; when none
        has been reachable for twice the slot lease (10 s by default) it is 503
        `no-releaser` with `Retry-After`. Each of them hands a call at most 250 messages,
        so an answer may hold fewer than `max` while more are due: ask again.

        A waiting call (`wait_ms` > 0) ends by `wait_ms` plus half a second, and as soon
        as its client closes the connection. Each API process holds at
        most DUETIME_API_WAITS_PER_TENANT waiting calls of one tenant (250 by default):
        past that, 429 `too-many-waits` with `Retry-After` at once; past
        DUETIME_API_WAITS of all tenants (1000), 503 `overloaded`."""
        found = get_topic_cached(services(), tenant(), topic)
        wait = min(body["wait_ms"], services().config.max_wait_ms)
        with (services().waits.held(tenant(), request.environ) if wait
              else contextlib.nullcontext(STAYING)) as gone:
            got = leasing.lease(services(), found, body["max"], wait,
                                _lease_seconds(body, found.settings.lease_seconds),
                                body.get("consumer"), gone)
        return {"messages": [{
            "id": m.row.id, "deliver_at": m.row.deliver_at_ms, "priority": m.row.priority,
            "campaign": m.row.campaign, "group": m.row.group,
            "recipient": m.row.recipient, "labels": m.row.labels or {},
            "attempt": m.row.attempts, **payload_fields(m.payload),
            "lease": {"token": leasing.token_of(m.row), "expires_at": m.row.lease_expires_at_ms},
        } for m in got]}


@blp.route("/messages/<message_id:message_id>/ack")
class Ack(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(AckSchema())
    @blp.response(204)
    @blp.alt_response(409, description="The lease is no longer held.")
    def post(self, body: dict[str, Any], topic: str, message_id: str) -> None:
        """Mark the message delivered."""
        check_message_id(message_id)
        found = get_topic_cached(services(), tenant(), topic)
        error = ack_groups().submit(found, (message_id, body["lease_token"]))
        if error is not None:
            raise error


@blp.route("/acks")
class Acks(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(AckBatchSchema())
    @blp.response(200, AckBatchResultSchema)
    def post(self, body: dict[str, Any], topic: str) -> dict[str, Any]:
        """Ack up to 1,000 leased messages in one call (like SQS DeleteMessageBatch): each
        item is answered on its own, in order, as the single ack would answer it."""
        found = get_topic_cached(services(), tenant(), topic)
        pairs = [(a["id"], a["lease_token"]) for a in body["acks"]]
        answers = leasing.ack_many(services(), found, pairs)
        return {"results": [
            {"id": i, "status": 204} if err is None else
            {"id": i, "status": err.status, "error": error_fields(err)}
            for (i, _), err in zip(pairs, answers, strict=True)]}


@blp.route("/messages/<message_id:message_id>/nack")
class Nack(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(NackSchema())
    @blp.response(204)
    @blp.alt_response(409, description="The lease is no longer held.")
    def post(self, body: dict[str, Any], topic: str, message_id: str) -> None:
        """Give the message back: due again after delay_ms, or the topic's backoff."""
        check_message_id(message_id)
        found = get_topic_cached(services(), tenant(), topic)
        leasing.nack(services(), found, message_id, body["lease_token"],
                     body.get("delay_ms"), body.get("error"))


@blp.route("/messages/<message_id:message_id>/extend")
class Extend(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(ExtendSchema())
    @blp.response(200, ExtendResponseSchema)
    @blp.alt_response(409, description="The lease is no longer held.")
    def post(self, body: dict[str, Any], topic: str, message_id: str) -> dict[str, Any]:
        """Keep the lease lease_seconds more from now; the token stays the same."""
        check_message_id(message_id)
        found = get_topic_cached(services(), tenant(), topic)
        row = leasing.extend(services(), found, message_id, body["lease_token"],
                             _lease_seconds(body, found.settings.lease_seconds))
        # the same token: an extended lease is the same lease (acks with it are decided on a
        # read, as its version moved)
        return {"lease": {"token": body["lease_token"], "expires_at": row.lease_expires_at_ms}}
