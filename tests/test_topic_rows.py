"""Topic rows on the real node: settings a topic does not use are no cells at all, not
tombstones. The releasers read the topics table whole, and Cassandra warns at 1,000
tombstones a read and fails it at 100,000: with a null written for each unused setting, a
keyspace of some tens of thousands of pull topics would make that read fail."""

from __future__ import annotations

import re
from typing import Any

from flask.testing import FlaskClient

from app.services import Services
from tests.consumers import TopicClient

TOMBSTONES = re.compile(r"Read \d+ live rows and (\d+) tombstone cells")


def tombstones_read(services: Services, tenant: str, name: str) -> int:
    """Tombstone cells the node reads for one topic row (from the read's trace)."""
    return traced_tombstones(
        services, "SELECT * FROM {ks}.topics WHERE tenant = %s AND name = %s", (tenant, name))


def traced_tombstones(services: Services, cql: str, params: tuple[Any, ...]) -> int:
    """Tombstone cells the node reads for the one row `cql` ({ks}: the keyspace) selects, from
    the read's trace."""
    future = services.db.session().execute_async(
        cql.replace("{ks}", services.config.keyspace), params, trace=True)
    assert future.result().one() is not None
    events = [e.description for e in future.get_query_trace(max_wait=10).events]
    counts = [int(m.group(1)) for m in map(TOMBSTONES.search, events) if m]
    assert counts, events  # the trace says how many it read
    return sum(counts)


def test_a_topic_writes_no_tombstone_for_a_setting_it_does_not_use(
        client: FlaskClient, services: Services) -> None:
    tenant = "rows"
    headers = {"Authorization": f"Bearer {services.keys.create(tenant)}"}
    topic = TopicClient(client, headers)  # a pull topic: no URL, no quiet hours
    assert tombstones_read(services, tenant, topic.name) == 0
    changed = client.put(topic.url(), headers=headers, json={"lease_seconds": 45})
    assert changed.status_code == 200
    assert tombstones_read(services, tenant, topic.name) == 0
    webhook = {"mode": "webhook", "url": "http://127.0.0.1:9/x", "timeout_seconds": 2}
    assert client.put(topic.url(), headers=headers,
                      json={"delivery": webhook}).status_code == 200
    assert tombstones_read(services, tenant, topic.name) == 0
    quiet = {"start": "21:00", "end": "08:00", "timezone": "UTC"}
    assert client.put(topic.url(), headers=headers,
                      json={"quiet_hours": quiet}).status_code == 200
    assert tombstones_read(services, tenant, topic.name) == 0
    # quiet hours removed: what they were is cleared, which is a tombstone, and reads as none
    cleared = client.put(topic.url(), headers=headers, json={"quiet_hours": None})
    assert cleared.status_code == 200
    assert cleared.get_json().get("quiet_hours") is None, cleared.get_json()
    found = client.get(topic.url(), headers=headers).get_json()
    assert found.get("quiet_hours") is None and found["lease_seconds"] == 45
    assert found["delivery"]["url"] == webhook["url"]
    assert tombstones_read(services, tenant, topic.name) >= 1
