"""Message rows on the real node: a transition leaves a column that is null before and after
unwritten, and a delivered message keeps its lease, so its row holds no tombstone. Rows are
read whole by the Spark jobs; Cassandra warns at 1,000 tombstones a read and fails at 100,000."""

from __future__ import annotations

import uuid

from flask.testing import FlaskClient

from app.core.ids import home_of
from app.services import Services
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient
from tests.receiver import Receiver, receiving
from tests.releasing import wait_served, wait_state, webhook_topic
from tests.test_topic_rows import traced_tombstones


def topic_uid(services: Services, tenant: str, topic: TopicClient) -> uuid.UUID:
    found = services.topics.get(tenant, topic.name)
    assert found is not None
    return found.uid


def tombstones_read(services: Services, uid: uuid.UUID, message_id: str) -> int:
    """Tombstone cells the node reads for one message's state row (from the read's trace)."""
    return traced_tombstones(
        services, "SELECT * FROM {ks}.message_states WHERE topic_uid = %s AND home = %s "
        "AND id = %s", (uid, home_of(message_id), message_id))


def test_a_pulled_message_leased_and_acked_leaves_no_tombstone(
        client: FlaskClient, services: Services) -> None:
    tenant, auth = new_tenant_key(services, "rows")
    topic = TopicClient(client, auth)
    wait_served(client, auth, topic.name)
    uid = topic_uid(services, tenant, topic)
    message_id = topic.enqueue(payload={"n": 1}).get_json()["id"]  # no campaign, consumer or error
    got = topic.lease(1, wait_ms=10_000)
    assert [m["id"] for m in got] == [message_id]
    assert tombstones_read(services, uid, message_id) == 0
    assert topic.ack(got[0]) == 204
    assert tombstones_read(services, uid, message_id) == 0


def test_a_column_set_before_a_lease_and_null_after_it_is_still_cleared(
        client: FlaskClient, services: Services) -> None:
    """A nack keeps the consumer's name; the next lease, by a consumer without one, clears
    it (a tombstone, as a clear must be)."""
    tenant, auth = new_tenant_key(services, "rows")
    topic = TopicClient(client, auth)
    wait_served(client, auth, topic.name)
    uid = topic_uid(services, tenant, topic)
    message_id = topic.enqueue(payload={"n": 2}).get_json()["id"]
    named = topic.lease(1, wait_ms=10_000, consumer="worker-1")
    assert [m["id"] for m in named] == [message_id]
    nacked = client.post(topic.url(f"/messages/{message_id}/nack"), headers=auth,
                         json={"lease_token": named[0]["lease"]["token"], "delay_ms": 0})
    assert nacked.status_code == 204, nacked.get_json()
    row = services.messages.get(uid, message_id)
    assert row is not None and row.state == "scheduled" and row.consumer == "worker-1"
    again = topic.lease(1, wait_ms=10_000)
    assert [m["id"] for m in again] == [message_id]
    row = services.messages.get(uid, message_id)
    assert row is not None and row.state == "leased" and row.consumer is None
    assert tombstones_read(services, uid, message_id) >= 1


def test_a_pushed_message_taken_and_delivered_leaves_no_tombstone(
        client: FlaskClient, services: Services) -> None:
    """A POST's delivery keeps the lease it was made under, as a pull's ack does."""
    tenant, auth = new_tenant_key(services, "rows")
    with receiving(Receiver()) as target:  # the suite's releaser POSTs
        topic, _ = webhook_topic(client, auth, target.url)
        message_id = topic.enqueue(payload={"n": 1}).get_json()["id"]
        wait_state(topic, message_id, "delivered", 15)
        uid = topic_uid(services, tenant, topic)
        row = services.messages.get(uid, message_id)
        assert row is not None and row.lease_expires_at_ms is not None
        assert tombstones_read(services, uid, message_id) == 0


def test_a_replace_that_drops_the_campaign_clears_it(
        client: FlaskClient, services: Services) -> None:
    tenant, auth = new_tenant_key(services, "rows")
    topic = TopicClient(client, auth)
    uid = topic_uid(services, tenant, topic)
    first = topic.enqueue(id="r1", delay_ms=600_000, campaign="spring")
    assert first.status_code == 201, first.get_json()
    again = topic.enqueue(id="r1", delay_ms=300_000, if_exists="replace", payload={"n": 2})
    assert again.status_code == 200, again.get_json()
    row = services.messages.get(uid, "r1")
    assert row is not None and row.campaign is None and row.version == 2
