"""A message's own webhook headers, checked at the door (real Cassandra): names are RFC 9110
tokens, values tabs and printable Latin-1, names duetime sets itself or HTTP/1.1 framing owns
are refused in any case, in
a single enqueue, a replace and a batch's item alone; and a POST never sends a name twice,
even for a row stored before the check."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.messages import enqueue as enqueueing
from app.services import Services
from app.topics.manage import get_topic
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient, now_ms
from tests.receiver import Receiver, receiving

BAD = [
    ({"Bad Name": "x"}, "Bad Name"), ({"": "x"}, ""), ({"X-\u00e9": "x"}, "X-\u00e9"),
    ({"X-A": "a\r\nInjected: 1"}, "X-A"), ({"X-A": "a\nb"}, "X-A"), ({"X-A": "a\u0000"}, "X-A"),
    ({"content-type": "text/plain"}, "content-type"), ({"Content-Length": "1"}, "Content-Length"),
    ({"HOST": "evil"}, "HOST"), ({"Transfer-Encoding": "chunked"}, "Transfer-Encoding"),
    ({"connection": "close"}, "connection"), ({"Webhook-Signature": "v1,x"}, "Webhook-Signature"),
    ({"webhook-id": "forged"}, "webhook-id"), ({"DUETIME-Topic": "x"}, "DUETIME-Topic"),
    ({"X-Twice": "1", "x-twice": "2"}, "x-twice"),
    # an Expect draws a 100 Continue, which a POST once took for the answer (dead after 200s)
    ({"Expect": "100-continue"}, "Expect"), ({"TE": "trailers"}, "TE"),
    ({"Upgrade": "h2c"}, "Upgrade"),
    # a value goes out as bytes: past U+00FF it arrived as "?", and controls are not text
    ({"X-Name": "Zo\u00eb \u0141ukasz"}, "X-Name"), ({"X-A": "\u65e5\u672c"}, "X-A"),
    ({"X-A": "a\u007fb"}, "X-A"), ({"X-A": "a\u0085b"}, "X-A"),
]


@pytest.mark.parametrize("headers, name", BAD, ids=[repr(n) for _, n in BAD])
def test_a_header_a_message_may_not_carry_is_a_400_naming_it(
        client: FlaskClient, auth: dict[str, str], headers: dict[str, str], name: str) -> None:
    topic = TopicClient(client, auth)
    answer = topic.enqueue(id="h", headers=headers)
    assert answer.status_code == 400, answer.get_json()
    assert answer.content_type == "application/problem+json"
    assert name in answer.get_json()["errors"]["headers"], answer.get_json()
    assert topic.get("h").status_code == 404
    assert topic.enqueue(id="h", headers={"X-Fine": "1"}).status_code == 201
    replaced = topic.enqueue(id="h", headers=headers, if_exists="replace")
    assert replaced.status_code == 400, replaced.get_json()
    assert topic.get("h").get_json()["headers"] == {"X-Fine": "1"}


def test_in_a_batch_only_the_item_with_the_header_fails(client: FlaskClient,
                                                          auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    results = topic.batch([{"id": "b1", "headers": {"X-Ok": "1"}},
                           {"id": "b2", "headers": {"Webhook-Id": "forged"}},
                           {"id": "b3", "headers": {"x": "a\r\nb"}}])
    assert [r["status"] for r in results] == [201, 400, 400]
    assert "Webhook-Id" in results[1]["error"]["errors"]["headers"]
    assert results[1]["error"]["type"].endswith("/invalid-request")  # a whole problem body
    assert "x" in results[2]["error"]["errors"]["headers"]
    assert topic.get("b1").get_json()["headers"] == {"X-Ok": "1"}
    assert topic.get("b2").status_code == 404


def test_token_names_and_ordinary_values_are_taken(client: FlaskClient,
                                                   auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    headers = {"X-Trace_Id.v2": "a b\tc", "!#$%&'*+-.^_`|~": "", "Authorization": "Bearer t",
               "X-Name": "Zo\u00eb \u00a0\u00ff"}
    assert topic.enqueue(id="ok", headers=headers).status_code == 201
    assert topic.get("ok").get_json()["headers"] == headers


def test_a_stored_header_never_goes_out_twice_or_over_ours(
        services: Services, client: FlaskClient) -> None:
    """A row stored before the check (written here past the schema, as one was) carries
    names of ours in other cases and a name twice: the POST sends ours, and each name once."""
    tenant, auth = new_tenant_key(services)
    with receiving(Receiver()) as target:
        topic = TopicClient(client, auth, delivery={"mode": "webhook", "url": target.url})
        stored: dict[str, Any] = {"id": "old", "payload": {"n": 1}, "priority": 100,
                                  "headers": {"content-type": "text/evil",
                                              "WEBHOOK-ID": "forged", "duetime-topic": "x",
                                              "X-Mine": "1", "x-mine": "2", "X-Bad": "a\rb"}}
        message = enqueueing.new_message(stored, now_ms(), 65536)
        found = get_topic(services, tenant, topic.name)
        assert enqueueing.enqueue(services, found, [message])[0].status == 201
        assert target.wait_for(lambda got: len(got) == 1, 20)
    headers = target.arrivals[0].headers
    assert max(Counter(name.lower() for name in headers).values()) == 1, headers
    assert headers["Content-Type"] == "application/json"
    assert headers["webhook-id"] == "old" and headers["Duetime-Topic"] == topic.name
    assert headers["X-Mine"] == "1" and "X-Bad" not in headers
