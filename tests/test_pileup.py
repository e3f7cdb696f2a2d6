"""A pile-up at one millisecond (a campaign's sends all due at 09:00:00.000) is drained by
leases that read each pointer about once, not from the first pointer of the pile every time."""

from __future__ import annotations

import time

from flask.testing import FlaskClient

from app.delivery import leasing
from app.services import Services
from tests.consumers import TopicClient, now_ms


def test_leases_over_a_one_millisecond_pile_read_each_pointer_about_once(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    topic_api = TopicClient(client, auth, shards=1, lease_seconds=60)
    past = now_ms() - 60_000  # placed at the writer's clock: one millisecond per request
    for _ in range(2):
        assert {r["status"] for r in topic_api.batch(
            [{"deliver_at": past} for _ in range(1000)])} == {201}
    time.sleep(services.config.safety_lag_ms / 1000 + 0.2)  # the pile is settled time
    tenant = services.keys.tenant_of(auth["Authorization"].split()[1])
    assert tenant is not None
    topic = services.topics.get(tenant, topic_api.name)
    assert topic is not None
    before = services.scanner.pointers_read
    leased: list[str] = []
    for _ in range(25):
        got = leasing.lease(services, topic, 100, 0, 60, "pile")
        assert all(g.row.deliver_at_ms <= now_ms() for g in got)
        leased += [g.row.id for g in got]
    assert len(leased) == len(set(leased)) == 2000
    read = services.scanner.pointers_read - before
    # from the pile's start every time this would be about 20 x 1,100 = 22,000 reads
    assert read <= 2 * 2000 + 25 * 2 * 100, read
