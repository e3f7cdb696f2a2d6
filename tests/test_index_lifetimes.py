"""A campaign's index entries live at least as long as its messages' rows, whatever moves
them later (app/messages/lifetimes.py, relist): a campaign operation reaches a message
however far it was moved. Run with a retention of 0 days (which no process accepts from
its settings: here it makes lifetimes seconds long), so a row lives only until its due
time, and an entry written at enqueue to live as long as the row would be gone in
seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from flask import Flask

from app import create_app
from app.config import Config
from app.core.timeparse import parse_instant
from tests.campaign_helpers import running_operations, wait_operation
from tests.consumers import TopicClient, now_ms


@pytest.fixture()
def brief_app(config: Config) -> Iterator[Flask]:
    """An app whose rows keep nothing past their due time (retention 0 days)."""
    application = create_app(config.replace(retention_days=0))
    yield application
    application.extensions["duetime"].close()


def _shift(topic: TopicClient, campaign: str, shift_ms: int) -> dict[str, object]:
    answer = topic.client.patch(topic.url(f"/campaigns/{campaign}"), headers=topic.headers,
                                json={"shift_ms": shift_ms})
    assert answer.status_code == 202, answer.get_json()
    return wait_operation(topic, answer.get_json()["operation"]["id"], 30)


def test_messages_moved_past_their_first_due_time_stay_in_reach_of_their_campaign(
        brief_app: Flask, auth: dict[str, str]) -> None:
    """Two messages of a campaign due in 20 s (time for the first shift to reach them while
    their rows live): one is moved a minute on by PATCH, then the campaign is shifted a
    minute on. Once their first due time has passed (when an entry that lived as long as
    the row at enqueue expired), a second shift still reaches both and moves them."""
    topic = TopicClient(brief_app.test_client(), auth)
    first = now_ms() + 20_000
    for message_id in ("patched", "shifted"):
        answer = topic.enqueue(id=message_id, campaign="moved", deliver_at=first)
        assert answer.status_code == 201, answer.get_json()
    answer = topic.client.patch(topic.url("/messages/patched"), headers=topic.headers,
                                json={"deliver_at": first + 60_000})
    assert answer.status_code == 200, answer.get_json()
    with running_operations(brief_app.extensions["duetime"]):
        done = _shift(topic, "moved", 60_000)
        assert now_ms() < first, "the first shift ended after the rows' end: a slow host"
        assert (done["state"], done["changed"]) == ("succeeded", 2), done
        time.sleep(max(0.0, (first + 2000 - now_ms()) / 1000))
        done = _shift(topic, "moved", 1000)
        assert (done["state"], done["processed"], done["changed"]) == ("succeeded", 2, 2), done
    for message_id, due in (("patched", first + 121_000), ("shifted", first + 61_000)):
        row = topic.get(message_id).get_json()
        assert (row["state"], parse_instant(row["deliver_at"])) == ("scheduled", due), row
        assert topic.client.delete(topic.url(f"/messages/{message_id}"),
                                   headers=topic.headers).status_code == 204
