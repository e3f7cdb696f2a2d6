"""Starting an operation on the messages a search filter matches (POST
/v1/topics/{topic}/operations): cancel, shift, pause or resume.

They run in the background like a campaign operation (workers/operations.py walks the
search page by page, app.messages.filtered_apply changes each page): pause makes each
matching waiting message `paused`, resume schedules each matching paused one again. A pause
or resume whose filter is a campaign alone pauses or resumes that campaign by its flag
instead (app.campaigns.manage.pause_or_resume), which holds back its later messages too.

A filtered operation takes no lock: several may run on a topic at once, beside a campaign's,
each message's change being an LWT of its own.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from app.campaigns import manage as campaigns
from app.messages.search import filter_of
from app.models import MessageFilter, Topic
from app.services import Services
from app.store.operations import Operation

CAMPAIGN_KINDS = ("pause", "resume")  # with a filter of a campaign alone: its flag


def filter_json(query: dict[str, Any]) -> str:
    """A validated filter (app.schemas.search.MessageFilterSchema, times as epoch ms) as the
    canonical JSON an operation row keeps (fields given only, labels sorted)."""
    kept = {k: v for k, v in query.items() if v is not None and v != []}
    if "label" in kept:
        kept["label"] = sorted(kept["label"])
    return json.dumps(kept, sort_keys=True, separators=(",", ":"))


def filter_fields(text: str) -> dict[str, Any]:
    """An operation's filter as the API shows it (times epoch ms)."""
    fields: dict[str, Any] = json.loads(text)
    return fields


def message_filter(text: str) -> MessageFilter:
    """An operation's stored filter as the search's MessageFilter."""
    return filter_of(filter_fields(text))


def start(services: Services, topic: Topic, kind: str, query: dict[str, Any],
          shift_ms: int = 0) -> Operation:
    """Start `kind` on the messages matching the validated filter `query`: recorded, listed
    for the runners, answered at once. A pause or resume of a filter of a campaign alone
    pauses or resumes that campaign (404 when no message ever carried it, 409 when it is
    cancelled)."""
    if kind in CAMPAIGN_KINDS and set(json.loads(filter_json(query))) == {"campaign"}:
        return campaigns.pause_or_resume(services, topic, query["campaign"],
                                         paused=kind == "pause")
    now = services.clock()
    op = Operation(topic_uid=topic.uid, id=uuid.uuid1(), tenant=topic.tenant, topic=topic.name,
                   kind=kind, campaign=None, shift_ms=shift_ms, not_before=now,
                   started_at=now, filter=filter_json(query))
    services.operations.record(op)
    services.operations.enlist(op)
    services.waker.wake("operations")
    return op
