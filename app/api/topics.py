"""/v1/topics views."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView

from app.api.common import SECURITY, services, tenant
from app.api.json_body import Blueprint
from app.api.validation import check_name
from app.core.send_window import SendWindow
from app.delivery import signing
from app.messages.send_windows import stored_window
from app.messages.zones import DEFAULT_ZONE
from app.models import Topic
from app.schemas.frequency_caps import shown_cap, stored_cap
from app.schemas.topics import (
    LagQuerySchema,
    LagSchema,
    RotateSecretSchema,
    StatsQuerySchema,
    TopicListSchema,
    TopicPutSchema,
    TopicSchema,
    TopicStatsSchema,
)
from app.topics import manage as usecases

blp = Blueprint("topics", __name__, url_prefix="/v1/topics",
                description="Topics: a tenant's timelines of messages.")

_FLAT = ("lease_seconds", "max_attempts", "shards", "timezone")
_NESTED = {"retry": ("backoff_seconds", "max_backoff_seconds"),
           "delivery": ("mode", "url", "timeout_seconds")}
_NESTED_FIELD = {("delivery", "mode"): "delivery_mode", ("delivery", "url"): "delivery_url",
                 ("delivery", "timeout_seconds"): "delivery_timeout_seconds"}


def topic_view(topic: Topic) -> dict[str, Any]:
    s = topic.settings
    return {
        "name": topic.name, "lease_seconds": s.lease_seconds, "max_attempts": s.max_attempts,
        "retry": {"backoff_seconds": s.backoff_seconds,
                  "max_backoff_seconds": s.max_backoff_seconds},
        "shards": s.shards,
        "delivery": {"mode": s.delivery_mode, "url": s.delivery_url,
                     "timeout_seconds": s.delivery_timeout_seconds},
        "signing_secret": signing.shown(topic.signing_secret),
        "previous_signing_secret_expires_at": (
            topic.previous_secret_until_ms if topic.previous_secret else None),
        "quiet_hours": None if s.quiet_start is None else {
            "start": s.quiet_start, "end": s.quiet_end, "timezone": s.quiet_timezone},
        "send_window": None if s.send_window is None else stored_window(s.send_window).api(),
        "timezone": s.timezone or DEFAULT_ZONE,
        "frequency_cap": shown_cap(s.frequency_cap),
        "created_at": topic.created_at_ms, "updated_at": topic.updated_at_ms,
    }


def _changes(body: dict[str, Any]) -> dict[str, Any]:
    """The request's given fields as TopicSettings field names (None = not given)."""
    changes = {k: body[k] for k in _FLAT if body.get(k) is not None}
    for group, names in _NESTED.items():
        for name in names:
            value = (body.get(group) or {}).get(name)
            if value is not None:
                changes[_NESTED_FIELD.get((group, name), name)] = value
    # one window a topic: setting either spelling removes the other (the schema refuses both)
    if "quiet_hours" in body:  # given as null: removed
        quiet = body["quiet_hours"] or {}
        changes.update(quiet_start=quiet.get("start"), quiet_end=quiet.get("end"),
                       quiet_timezone=quiet.get("timezone"), send_window=None)
    if "frequency_cap" in body:  # given as null: removed
        changes["frequency_cap"] = stored_cap(body["frequency_cap"])
    if "send_window" in body:  # given as null: removed
        window = body["send_window"]
        changes.update(quiet_start=None, quiet_end=None, quiet_timezone=None,
                       send_window=None if window is None else SendWindow.parse(
                           window["days"], window["start"], window["end"]).text())
    return changes


@blp.route("")
class TopicCollection(MethodView):
    @blp.doc(security=SECURITY)
    @blp.response(200, TopicListSchema)
    def get(self) -> dict[str, Any]:
        """List the tenant's topics."""
        return {"topics": [topic_view(t) for t in services().topics.list_for(tenant())]}


@blp.route("/<name:topic>")
class TopicItem(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(TopicPutSchema(), required=False)
    @blp.response(200, TopicSchema, description="Updated.")
    @blp.alt_response(201, schema=TopicSchema, description="Created.")
    @blp.alt_response(409, description="shards changed while messages are live.")
    def put(self, body: dict[str, Any], topic: str) -> tuple[dict[str, Any], int]:
        """Create or update a topic."""
        check_name("topic", topic)
        result, created = usecases.put_topic(services(), tenant(), topic, _changes(body))
        return topic_view(result), 201 if created else 200

    @blp.doc(security=SECURITY)
    @blp.response(200, TopicSchema)
    def get(self, topic: str) -> dict[str, Any]:
        """Read a topic."""
        return topic_view(usecases.get_topic(services(), tenant(), topic))

    @blp.doc(security=SECURITY)
    @blp.response(204)
    def delete(self, topic: str) -> None:
        """Delete a topic: its messages are cancelled and never delivered."""
        usecases.delete_topic(services(), tenant(), topic)


@blp.route("/<name:topic>/signing-secret:rotate")
class TopicSecretRotation(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(RotateSecretSchema(), required=False)
    @blp.response(200, TopicSchema, description="Rotated: the topic with its new secret.")
    def post(self, body: dict[str, Any], topic: str) -> dict[str, Any]:
        """Give the topic a new webhook signing secret. For `overlap_seconds` (default a
        day) the old one signs every POST too, so receivers can switch without a refused
        POST; then only the new one does. A POST is signed with the secrets of when its
        message was taken for it (at its due time): one taken after this answer carries the
        new secret's signature."""
        return topic_view(usecases.rotate_signing_secret(services(), tenant(), topic,
                                                         body["overlap_seconds"]))


@blp.route("/<name:topic>/stats")
class TopicStats(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(StatsQuerySchema(), location="query")
    @blp.response(200, TopicStatsSchema)
    def get(self, query: dict[str, Any], topic: str) -> dict[str, Any]:
        """Counts per state and the scheduled load ahead: per minute for the next hour, or
        with window=hour per hour for the next 7 days.

        Counts are approximate, as a queue's message counts are: each server process writes
        its moves within 0.2 s, so a change shows within about that time (at once when the
        same process made it), and a server process killed loses its last 0.2 s of moves."""
        found = usecases.get_topic(services(), tenant(), topic)
        return usecases.topic_stats(services(), found, query["window"])


@blp.route("/<name:topic>/lag")
class TopicLag(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(LagQuerySchema(), location="query")
    @blp.response(200, LagSchema)
    def get(self, query: dict[str, Any], topic: str) -> dict[str, Any]:
        """Delivery lag per minute over the last hour (or `minutes`): how late after their
        due time messages were handed out. Lag = lease time (pull) or POST start (push)
        less the due time; a paced message is due at its delivery slot."""
        found = usecases.get_topic(services(), tenant(), topic)
        return {"minutes": usecases.delivery_lag(services(), found, query["minutes"])}
