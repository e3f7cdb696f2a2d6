"""/v1/topics/{topic}/messages views: enqueue, batch, read, reschedule, cancel."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView
from marshmallow import ValidationError

from app.api.common import SECURITY, enqueue_groups, services, tenant
from app.api.json_body import Blueprint
from app.api.problems import error_fields
from app.api.validation import check_message_id
from app.errors import DuetimeError, InvalidInput, PayloadTooLarge
from app.messages import by_id as usecases
from app.messages import dead_letters, search
from app.messages import enqueue as enqueueing
from app.models import MessageState, Payload, Topic
from app.schemas.messages import (
    BatchInSchema,
    BatchOutSchema,
    DeadListSchema,
    DeadQuerySchema,
    EnqueuedSchema,
    MessageInSchema,
    MessageSchema,
    RescheduleSchema,
)
from app.schemas.search import SearchPageSchema, SearchQuerySchema
from app.topics.manage import get_topic_cached

blp = Blueprint("messages", __name__, url_prefix="/v1/topics/<name:topic>",
                description="Messages on a topic's timeline.")


def payload_fields(payload: Payload | None) -> dict[str, Any]:
    """payload (JSON) or payload_base64 (binary), plus headers, as the API shows them."""
    if payload is None:
        return {"payload": None}
    key = "payload" if payload.encoding == "json" else "payload_base64"
    return {key: payload.as_api_value(), "headers": payload.headers}


def summary_view(topic: Topic, row: MessageState) -> dict[str, Any]:
    """A message as the API shows it, without its payload (search pages)."""
    return {
        "id": row.id, "topic": topic.name, "state": row.state, "deliver_at": row.deliver_at_ms,
        "priority": row.priority, "campaign": row.campaign, "group": row.group,
        "recipient": row.recipient, "labels": row.labels or {}, "timezone": row.timezone,
        "attempts": row.attempts,
        "created_at": row.created_at_ms, "updated_at": row.updated_at_ms,
        "last_error": row.last_error, "cancel_reason": row.cancel_reason,
        "frequency_cap_exempt": bool(row.cap_exempt),
        **({} if row.requested_at_ms is None
           else {"requested_deliver_at": row.requested_at_ms}),
    }


def message_view(topic: Topic, row: MessageState, payload: Payload | None) -> dict[str, Any]:
    return {**summary_view(topic, row), **payload_fields(payload)}


def _new(data: dict[str, Any], topic: Topic) -> enqueueing.NewMessage:
    cfg = services().config
    return enqueueing.new_message(data, services().clock(), cfg.max_payload_bytes, topic)


@blp.route("/messages")
class MessageCollection(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(MessageInSchema())
    @blp.response(201, EnqueuedSchema, description="Created.")
    @blp.alt_response(200, schema=EnqueuedSchema, description="Same id and content again.")
    @blp.alt_response(409, description="The id exists with different content.")
    @blp.alt_response(413, description="Payload over the limit.")
    def post(self, body: dict[str, Any], topic: str) -> tuple[dict[str, Any], int]:
        """Put one message on the timeline."""
        services().quotas.admit(tenant(), "messages")
        found = get_topic_cached(services(), tenant(), topic)
        result = enqueue_groups().submit(found, _new(body, found))
        if result.error is not None:
            raise result.error
        return {"id": result.id, "deliver_at": result.deliver_at_ms,
                "state": result.state}, result.status

    @blp.doc(security=SECURITY)
    @blp.arguments(SearchQuerySchema(), location="query")
    @blp.response(200, SearchPageSchema)
    def get(self, query: dict[str, Any], topic: str) -> dict[str, Any]:
        """Find the topic's messages by state, campaign, recipient, labels and due time.

        Every filter is optional and those given are ANDed (`label` may repeat: each is
        required). Pages come in storage order (by a hash of each message's home partition,
        then by id): the same for every page, not time order. Follow `next_page_token`
        until it is null; paging shows no message twice and skips none that matches
        throughout, while messages change state between pages. A message that starts or
        stops matching meanwhile shows if the search reaches it while it matches."""
        found = get_topic_cached(services(), tenant(), topic)
        rows, token = search.search(services(), found, search.filter_of(query),
                                    query["limit"], query.get("page_token"))
        return {"messages": [summary_view(found, r) for r in rows], "next_page_token": token}


# One instance for every item: building a marshmallow schema deep-copies its fields, which
# cost more than validating the item (a third of a 1,000-message batch's CPU).
_ITEM_SCHEMA = MessageInSchema()


def _batch_item(raw: dict[str, Any], topic: Topic) -> enqueueing.NewMessage | DuetimeError:
    try:
        return _new(_ITEM_SCHEMA.load(raw), topic)
    except ValidationError as exc:
        return InvalidInput("The message has invalid fields.", exc.normalized_messages())
    except DuetimeError as exc:
        return exc


@blp.route("/messages:batch")
class MessageBatch(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(BatchInSchema())
    @blp.response(200, BatchOutSchema)
    @blp.alt_response(413, description="More messages than the batch limit (1,000).")
    def post(self, body: dict[str, Any], topic: str) -> dict[str, Any]:
        """Enqueue up to 1,000 messages; results in input order, one bad item fails no other."""
        limit = services().config.max_batch
        if len(body["messages"]) > limit:
            raise PayloadTooLarge(f"{len(body['messages'])} messages; a batch holds {limit}.")
        services().quotas.admit(tenant(), "messages", len(body["messages"]))
        found = get_topic_cached(services(), tenant(), topic)
        parsed = [_batch_item(raw, found) for raw in body["messages"]]
        good = [p for p in parsed if isinstance(p, enqueueing.NewMessage)]
        done = iter(enqueueing.enqueue(services(), found, good))
        results = []
        for raw, item in zip(body["messages"], parsed, strict=True):
            if isinstance(item, DuetimeError):
                results.append({"id": raw.get("id"), "status": item.status,
                                "error": error_fields(item)})
                continue
            r = next(done)
            entry: dict[str, Any] = {"id": r.id, "status": r.status}
            if r.error is not None:
                entry["error"] = error_fields(r.error)
            else:
                entry.update(deliver_at=r.deliver_at_ms, state=r.state)
            results.append(entry)
        return {"results": results}


@blp.route("/messages/<message_id:message_id>")
class MessageItem(MethodView):
    @blp.doc(security=SECURITY)
    @blp.response(200, MessageSchema)
    def get(self, topic: str, message_id: str) -> dict[str, Any]:
        """Read a message: state, attempts, payload."""
        check_message_id(message_id)
        found = get_topic_cached(services(), tenant(), topic)
        row, payload = usecases.get_message(services(), found, message_id)
        return message_view(found, row, payload)

    @blp.doc(security=SECURITY)
    @blp.arguments(RescheduleSchema())
    @blp.response(200, MessageSchema)
    @blp.alt_response(409, description="Neither scheduled nor paused (leased, delivered, "
                      "cancelled, dead).")
    def patch(self, body: dict[str, Any], topic: str, message_id: str) -> dict[str, Any]:
        """Move a scheduled message to a new time.

        A message stays scheduled until a consumer's lease call is answered with it (webhook
        topics: until its POST starts): nothing is leased ahead, so a move before that
        always wins, and the message is handed out at its new time only. A paused message
        (POST /operations, pause) moves too and stays paused."""
        check_message_id(message_id)
        found = get_topic_cached(services(), tenant(), topic)
        when = body.get("deliver_at", services().clock() + body.get("delay_ms", 0))
        row = usecases.reschedule(services(), found, message_id, when)
        _, payload = usecases.get_message(services(), found, message_id)
        return message_view(found, row, payload)

    @blp.doc(security=SECURITY)
    @blp.response(204)
    @blp.alt_response(409, description="Already delivered or dead, or its webhook POST has "
                                       "started.")
    def delete(self, topic: str, message_id: str) -> None:
        """Cancel a message: it will never be delivered.

        The producer's contract: a message is leased only once a consumer's lease call has
        been answered with it (webhook topics: once its POST has started). Nothing is leased
        ahead of a consumer, however busy the topic: until its hand-out a cancel answers 204
        and the message is never handed out; the race with a hand-out is decided by one
        conditional write on the message. A pull message a consumer already holds is
        cancelled too (204), and its ack answers 409. A webhook message whose POST has
        started answers 409 until its outcome is written."""
        check_message_id(message_id)
        found = get_topic_cached(services(), tenant(), topic)
        usecases.cancel(services(), found, message_id)


@blp.route("/dead-letters")
class DeadLetters(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(DeadQuerySchema(), location="query")
    @blp.response(200, DeadListSchema)
    def get(self, query: dict[str, Any], topic: str) -> dict[str, Any]:
        """The topic's dead messages (attempts exhausted), most recently dead first, each
        with its last error: the topic's dead-letter queue."""
        found = get_topic_cached(services(), tenant(), topic)
        return {"messages": [message_view(found, row, payload) for row, payload
                             in dead_letters.newest_dead(services(), found, query["limit"])]}


@blp.route("/messages/<message_id:message_id>/retry")
class RetryDead(MethodView):
    @blp.doc(security=SECURITY)
    @blp.response(200, MessageSchema)
    @blp.alt_response(409, description="Not dead, or past its retention.")
    def post(self, topic: str, message_id: str) -> dict[str, Any]:
        """Bring a dead message back (redrive): scheduled, due now, its attempts counted
        from 0 again; its last_error stays until a new one."""
        check_message_id(message_id)
        found = get_topic_cached(services(), tenant(), topic)
        row = dead_letters.retry(services(), found, message_id)
        _, payload = usecases.get_message(services(), found, message_id)
        return message_view(found, row, payload)
