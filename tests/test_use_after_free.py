"""Use after free, for every DELETE of openapi.yaml (schemathesis 3 has no such check; its
stateful one would also mistake a cancel for a deletion): what a DELETE answered 2xx for
is never used afterwards. A deleted topic or schedule is gone (404 for every route under
it, even once a topic of the same name exists again); a cancelled message or campaign stays
readable as cancelled and is never handed out again, and no call can bring it back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from flask import Flask
from flask.testing import FlaskClient

from app.services import Services
from tests.campaign_helpers import running_operations, wait_operation
from tests.consumers import TopicClient, now_ms

ROOT = Path(__file__).resolve().parent.parent
COVERED = {"/v1/topics/{topic}", "/v1/topics/{topic}/messages/{message_id}",
           "/v1/topics/{topic}/campaigns/{campaign}", "/v1/topics/{topic}/schedules/{name}"}


def test_every_delete_of_the_contract_is_covered_here() -> None:
    paths = yaml.safe_load((ROOT / "openapi.yaml").read_text())["paths"]
    assert {p for p, ops in paths.items() if "delete" in ops} == COVERED


def _status(client: FlaskClient, method: str, url: str, auth: dict[str, str],
            body: Any = None) -> int:
    answer = client.open(url, method=method, headers=auth, json=body)
    if answer.status_code >= 400:
        assert answer.headers["Content-Type"] == "application/problem+json", url
    return answer.status_code


def test_a_deleted_topic_is_gone_for_every_route_even_when_its_name_comes_back(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    assert topic.enqueue(id="old", delay_ms=60_000).status_code == 201
    assert _status(client, "DELETE", topic.url(), auth) == 204
    for method, path, body in (
            ("GET", "", None), ("GET", "/stats", None), ("GET", "/lag", None),
            ("GET", "/messages/old", None), ("POST", "/messages", {"payload": 1}),
            ("POST", "/leases", {"max": 1}), ("GET", "/campaigns", None),
            ("GET", "/dead-letters", None), ("GET", "/schedules", None),
            ("PATCH", "/messages/old", {"delay_ms": 5}), ("DELETE", "/messages/old", None)):
        assert _status(client, method, topic.url(path), auth, body) == 404, (method, path)
    assert _status(client, "DELETE", topic.url(), auth) == 404
    again = client.put(topic.url(), headers=auth, json={})
    assert again.status_code == 201  # a new topic of that name, not the old one back
    assert _status(client, "GET", topic.url("/messages/old"), auth) == 404
    assert client.post(topic.url("/leases"), headers=auth,
                       json={"max": 10}).get_json()["messages"] == []


def test_a_cancelled_message_is_never_handed_out_and_cannot_come_back(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, lease_seconds=1, max_attempts=1)
    assert topic.enqueue(id="m").status_code == 201
    [leased] = topic.lease(1, wait_ms=2000)
    assert _status(client, "DELETE", topic.url("/messages/m"), auth) == 204
    assert topic.get("m").get_json()["state"] == "cancelled"
    token = {"lease_token": leased["lease"]["token"]}
    for method, path, body in (("POST", "/messages/m/ack", token),
                               ("POST", "/messages/m/nack", token),
                               ("POST", "/messages/m/extend", {**token, "lease_seconds": 5}),
                               ("PATCH", "/messages/m", {"delay_ms": 0}),
                               ("POST", "/messages/m/retry", None)):
        assert _status(client, method, topic.url(path), auth, body) == 409, (method, path)
    assert _status(client, "DELETE", topic.url("/messages/m"), auth) == 204  # no-op
    same = client.post(topic.url("/messages"), headers=auth, json={"id": "m", "payload": {"n": 1}})
    assert same.status_code == 200 and same.get_json()["state"] == "cancelled"
    assert topic.lease(10, wait_ms=1500) == []
    assert topic.get("m").get_json()["state"] == "cancelled"


def test_a_cancelled_campaign_stays_cancelled_and_takes_no_new_message(
        app: Flask, services: Services, auth: dict[str, str]) -> None:
    client = app.test_client()
    topic = TopicClient(client, auth)
    topic.batch([{"campaign": "c", "deliver_at": now_ms() + 500} for _ in range(5)])
    answer = client.delete(topic.url("/campaigns/c"), headers=auth)
    assert answer.status_code == 202
    with running_operations(services):
        assert wait_operation(topic, answer.get_json()["operation"]["id"], 30)["changed"] == 5
    view = client.get(topic.url("/campaigns/c"), headers=auth).get_json()
    assert view["cancelled"] is True and view["counts"]["cancelled"] == 5
    assert topic.enqueue(campaign="c").status_code == 409
    # nothing brings it back: resuming or shifting a cancelled campaign is a conflict
    assert _status(client, "PATCH", topic.url("/campaigns/c"), auth, {"paused": False}) == 409
    assert _status(client, "PATCH", topic.url("/campaigns/c"), auth, {"shift_ms": 1000}) == 409
    assert client.get(topic.url("/campaigns/c"), headers=auth).get_json()["cancelled"] is True
    assert topic.lease(10, wait_ms=1500) == []


def test_a_deleted_schedule_is_gone_and_fires_no_more(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    url = topic.url("/schedules/tick")
    assert client.put(url, headers=auth, json={"cron": "* * * * * *", "payload": 1}
                      ).status_code == 201
    assert _status(client, "DELETE", url, auth) == 204
    assert _status(client, "GET", url, auth) == 404
    assert _status(client, "DELETE", url, auth) == 404
    assert client.get(topic.url("/schedules"), headers=auth).get_json()["schedules"] == []
