"""Transform of the import (pure, no Spark, no I/O): one file row → one message as the API
would make it, or a reject with its reason.

The checks are the API's own (app.schemas.messages.MessageInSchema,
app.messages.enqueue.new_message), and the state row, shard and bucket come from the same app code,
so an imported message is
indistinguishable from one enqueued over HTTP (apart from its deterministic id).

File columns: recipient (required; the message's recipient, the API's id pattern); payload
(JSON text) or, without it, every other column becomes a field of a JSON payload (template
fields); at most one of deliver_at (RFC 3339 or epoch ms), delay_ms, or local_time +
timezone (none: due now); timezone alone names the recipient's zone; optional id, priority,
campaign, labels (a JSON object of at most 10 key: value pairs).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from marshmallow import ValidationError

from app.core.ids import CLIENT_ID, home_of, import_id
from app.core.timeline import MS_PER_DAY, bucket_of, campaign_spread, shard_of, ttl_s
from app.errors import DuetimeError
from app.messages.enqueue import new_message, state_row
from app.messages.lifetimes import life_slack_ms, slack_ms
from app.models import Topic
from app.schemas.messages import MessageInSchema

TIME_COLUMNS = ("deliver_at", "delay_ms", "local_time", "timezone")
RESERVED = {"id", "recipient", "payload", "priority", "campaign", "labels", *TIME_COLUMNS}
_SCHEMA = MessageInSchema()


class Reject(ValueError):
    """A row that cannot be imported; str() is the reason written to the rejects file."""


@dataclasses.dataclass(frozen=True)
class ImportSettings:
    """What every row of one import shares. Times in epoch ms, durations as named."""

    topic: Topic
    campaign: str | None
    now_ms: int
    max_payload_bytes: int
    horizon_days: int
    retention_days: int
    bucket_ms: int


def _present(raw: dict[str, Any], name: str) -> bool:
    value = raw.get(name)
    return value is not None and str(value).strip() != ""


def _time_fields(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if _present(raw, "deliver_at"):
        text = str(raw["deliver_at"]).strip()
        out["deliver_at"] = int(text) if text.lstrip("-").isdigit() else text
    if _present(raw, "delay_ms"):
        try:
            out["delay_ms"] = int(str(raw["delay_ms"]).strip())
        except ValueError as exc:
            raise Reject("delay_ms: not an integer") from exc
    for name in ("local_time", "timezone"):
        if _present(raw, name):
            out[name] = str(raw[name]).strip()
    return out


def _payload(raw: dict[str, Any]) -> Any:
    if _present(raw, "payload"):
        try:
            return json.loads(str(raw["payload"]))
        except json.JSONDecodeError as exc:
            raise Reject(f"payload: not JSON ({exc.msg})") from exc
    return {k: v for k, v in raw.items() if k not in RESERVED - {"recipient"} and v is not None}


def _labels(text: Any) -> Any:
    """The labels column: a JSON object (its entries are checked as the API checks them)."""
    try:
        return json.loads(str(text))
    except json.JSONDecodeError as exc:
        raise Reject(f"labels: not JSON ({exc.msg})") from exc


def message_fields(raw: dict[str, Any], campaign: str | None) -> dict[str, Any]:
    """The API's message body for a file row (before the API's own validation)."""
    if not _present(raw, "recipient"):
        raise Reject("recipient: missing")
    recipient = str(raw["recipient"]).strip()
    times = _time_fields(raw)
    campaign = campaign or (str(raw["campaign"]).strip() if _present(raw, "campaign") else None)
    spec = json.dumps(times, sort_keys=True)
    body: dict[str, Any] = {
        "id": str(raw["id"]).strip() if _present(raw, "id") else import_id(campaign, recipient,
                                                                           spec),
        "payload": _payload(raw), **times}
    if campaign:
        body["campaign"] = campaign
    body["recipient"] = recipient
    if _present(raw, "labels"):
        body["labels"] = _labels(raw["labels"])
    if _present(raw, "priority"):
        try:
            body["priority"] = int(str(raw["priority"]).strip())
        except ValueError as exc:
            raise Reject("priority: not an integer") from exc
    return body


def _reason(err: ValidationError) -> str:
    messages = err.normalized_messages()
    return "; ".join(f"{field}: {' '.join(map(str, m if isinstance(m, list) else [m]))}"
                     for field, m in sorted(messages.items()))


def to_message(raw: dict[str, Any], s: ImportSettings) -> dict[str, Any]:
    """One output row (the columns of the messages, payload and timeline tables), or Reject."""
    try:
        data = _SCHEMA.load(message_fields(raw, s.campaign))
    except ValidationError as err:
        raise Reject(_reason(err)) from err
    try:
        m = new_message(data, s.now_ms, s.max_payload_bytes, s.topic)
    except DuetimeError as err:
        raise Reject(err.detail) from err
    row = state_row(s.topic, m, data["id"], s.now_ms, s.horizon_days)
    return {
        "id": row.id, "home": home_of(row.id), "shard": row.shard,
        "bucket": bucket_of(row.due_at_ms, s.bucket_ms),
        "due_at": row.due_at_ms, "deliver_at": row.deliver_at_ms, "priority": row.priority,
        "requested_at": row.requested_at_ms,
        "campaign": row.campaign, "content_hash": row.content_hash, "payload": m.payload.data,
        "recipient": row.recipient, "labels": row.labels, "timezone": row.timezone,
        "encoding": m.payload.encoding, "created_at": s.now_ms,
        "ttl": ttl_s(row.due_at_ms, s.now_ms, s.retention_days,
                     life_slack_ms(row, s.horizon_days)),
        "spread": campaign_spread(row.id),
        "payload_ttl": ttl_s(row.due_at_ms, s.now_ms, s.retention_days,
                             s.horizon_days * MS_PER_DAY),
    }


RESTORED_STATES = {"scheduled": "scheduled", "paused": "paused", "leased": "scheduled",
                   "delivered": "delivered", "cancelled": "cancelled", "dead": "dead"}


def restored(row: dict[str, Any], s: ImportSettings) -> dict[str, Any]:
    """One message of an export (spark.export_job, times in epoch ms) as a row of the target
    topic: its own id, state, times, attempts and last error, placed on this topic's shards
    and homes. A scheduled or leased one waits (scheduled) for its due time, or for now if
    that has passed: a pointer is never placed behind the writer's clock. A paused one stays
    paused (its row lives as long as its payload, app.messages.transitions.row_ttl_s).
    Reject when it is not a message of an export."""
    state = RESTORED_STATES.get(row.get("state") or "")
    message_id = row.get("id") or ""
    if state is None or not CLIENT_ID.match(message_id) or row.get("payload") is None:
        payload = "missing" if row.get("payload") is None else "present"
        raise Reject(f"not a message of a duetime export: id {message_id!r}, state "
                     f"{row.get('state')!r}, payload {payload}")
    due = row["due_at"] if row.get("due_at") is not None else row["deliver_at"]
    if state == "scheduled":
        due = max(due, s.now_ms)
    return {
        "id": message_id, "home": home_of(message_id),
        "shard": shard_of(message_id, s.topic.settings.shards),
        "bucket": bucket_of(due, s.bucket_ms), "due_at": due, "deliver_at": row["deliver_at"],
        "priority": row["priority"] if row.get("priority") is not None else 100,
        "campaign": row.get("campaign"), "delivery_group": row.get("group"),
        "recipient": row.get("recipient"), "labels": row.get("labels") or None,
        "timezone": row.get("timezone"),
        "content_hash": row.get("content_hash") or "", "payload": bytes(row["payload"]),
        "encoding": row.get("encoding") or "json", "headers": row.get("headers"),
        "created_at": row.get("created_at") or s.now_ms,
        "updated_at": row.get("updated_at") or s.now_ms, "state": state,
        "attempts": row.get("attempts") or 0, "last_error": row.get("last_error"),
        "ttl": ttl_s(due, s.now_ms, s.retention_days,
                     slack_ms(state, due, row["deliver_at"], s.horizon_days)),
        "spread": campaign_spread(message_id),
        "payload_ttl": ttl_s(due, s.now_ms, s.retention_days, s.horizon_days * MS_PER_DAY),
    }
