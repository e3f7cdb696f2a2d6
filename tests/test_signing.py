"""Standard Webhooks signatures of webhook POSTs, and the rotation of a topic's secret:
verified by the reference library (standardwebhooks, from PyPI), not by duetime's code."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import secrets
from typing import Any

import pytest
import standardwebhooks
from flask.testing import FlaskClient

from app.config import Config
from app.core.timeparse import parse_instant
from app.delivery import signing
from app.services import Services
from tests.consumers import TopicClient, now_ms
from tests.receiver import Arrival, Receiver, receiving
from tests.releasing import tenant_of, webhook_topic


def verifies(secret: str, arrival: Arrival) -> bool:
    """Whether the reference library accepts the POST under this secret."""
    try:
        standardwebhooks.Webhook(secret).verify(arrival.body, arrival.headers, json_parse=False)
    except standardwebhooks.webhooks.WebhookVerificationError:
        return False
    return True


def rotate(client: FlaskClient, auth: dict[str, str], topic: TopicClient,
           **body: Any) -> Any:
    answer = client.post(f"{topic.url()}/signing-secret:rotate", headers=auth,
                         json=body or None)
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()


def test_during_a_rotation_receivers_of_the_old_and_of_the_new_secret_both_verify(
        config: Config, client: FlaskClient, auth: dict[str, str]) -> None:
    with receiving(Receiver()) as target:
        topic, old = webhook_topic(client, auth, target.url)
        assert topic.enqueue(id="before").status_code == 201
        assert target.wait_for(lambda got: len(got) == 1, 20)
        rotated = rotate(client, auth, topic, overlap_seconds=3600)
        new = rotated["signing_secret"]
        assert new != old and new.startswith("whsec_")
        assert rotated["previous_signing_secret_expires_at"] is not None
        assert topic.enqueue(id="during").status_code == 201
        assert target.wait_for(lambda got: len(got) == 2, 20)
        # without an overlap the replaced secret stops signing at once
        latest = rotate(client, auth, topic, overlap_seconds=0)
        assert latest["previous_signing_secret_expires_at"] is None
        assert topic.enqueue(id="after").status_code == 201
        assert target.wait_for(lambda got: len(got) == 3, 20)
    before, during, after = target.arrivals
    assert verifies(old, before) and not verifies(new, before)
    assert verifies(old, during) and verifies(new, during)
    assert len(during.headers["webhook-signature"].split()) == 2
    assert verifies(latest["signing_secret"], after)
    assert not verifies(old, after) and not verifies(new, after)


def test_a_topic_made_before_whsec_secrets_keeps_its_key_in_the_new_form(
        config: Config, services: Services, client: FlaskClient,
        auth: dict[str, str]) -> None:
    """Its plain secret is shown as whsec_ + base64 of the same key: old receivers keep
    checking Duetime-Signature with the plain string, new ones verify with the shown one."""
    with receiving(Receiver()) as target:
        topic, _ = webhook_topic(client, auth, target.url)
        tenant = tenant_of(services, auth)
        made = services.topics.get(tenant, topic.name)
        assert made is not None
        plain = secrets.token_hex(32)  # how topics were given secrets before
        legacy = dataclasses.replace(made, signing_secret=plain, updated_at_ms=now_ms())
        assert services.topics.rotate_secret(legacy, made)
        shown = client.get(topic.url(), headers=auth).get_json()["signing_secret"]
        assert shown.startswith("whsec_") and shown != plain
        assert topic.enqueue(id="legacy").status_code == 201
        assert target.wait_for(lambda got: len(got) == 1, 20)
    [arrival] = target.arrivals
    assert verifies(shown, arrival)
    assert arrival.headers["Duetime-Signature"] == hmac.new(
        plain.encode(), arrival.body, hashlib.sha256).hexdigest()


def test_a_rotation_without_a_body_overlaps_a_day_and_bad_ones_are_refused(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    began = now_ms()
    rotated = rotate(client, auth, topic)
    until = parse_instant(rotated["previous_signing_secret_expires_at"])
    assert began + 86_400_000 <= until <= now_ms() + 86_400_000
    for body in ({"overlap_seconds": -1}, {"overlap_seconds": 2_592_001},
                 {"overlap_seconds": "soon"}):
        refused = client.post(f"{topic.url()}/signing-secret:rotate", headers=auth, json=body)
        assert refused.status_code == 400, refused.get_json()
        assert refused.content_type == "application/problem+json"
    missing = client.post("/v1/topics/no-such-topic/signing-secret:rotate", headers=auth,
                          json={})
    assert missing.status_code == 404
    assert client.get(topic.url(), headers=auth).get_json()["signing_secret"] == \
        rotated["signing_secret"]


@pytest.mark.parametrize("secret", ["whsec_" + "A" * 43 + "=", "plain-older-secret"])
def test_the_signature_is_the_reference_librarys_for_any_body(secret: str) -> None:
    """The header duetime sends is the one the reference library makes, for a whsec_
    secret and for an older topic's plain one (in its shown form)."""
    body = b'{"a": 1}'
    header = signing.standard_signature([secret], "m1", 1_767_225_600, body)
    expected = standardwebhooks.Webhook(signing.shown(secret)).sign(
        "m1", dt.datetime.fromtimestamp(1_767_225_600, dt.UTC), body.decode())
    assert header == expected
