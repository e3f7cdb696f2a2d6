"""The per-process object graph: config, Cassandra session, stores, clock.

Built by create_app (or the CLI / workers) once per process; nothing connects until used.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from app.campaigns.rules import CampaignRules
from app.config import Config
from app.core.ids import SharedHomes
from app.delivery.desk import Desk
from app.delivery.scan import DueScanner
from app.delivery.waits import Waits
from app.delivery.wakeups import Waker
from app.messages.placement import PointerPlacer
from app.ops.cluster_clock import ClusterClock
from app.ops.lag_log import LagLog
from app.ops.quotas import Limit, Quotas
from app.store.campaigns import CampaignStore
from app.store.clocks import ClockStore
from app.store.counts import CountStore
from app.store.dead_letters import DeadLetterStore
from app.store.frequency_caps import CapStore
from app.store.keys import ApiKeyStore
from app.store.lag import LagStore
from app.store.messages import MessageStore
from app.store.operations import OperationStore
from app.store.ownership import OwnershipStore
from app.store.schedules import ScheduleStore
from app.store.session import CassandraSession
from app.store.timeline import TimelineStore
from app.store.topics import TopicStore
from app.topics.cache import TopicCache

Clock = Callable[[], int]


def system_clock_ms() -> int:
    """Wall-clock epoch milliseconds of this host (the server clock of every guarantee)."""
    return time.time_ns() // 1_000_000


def _offset_clock(offset_ms: int) -> int:
    """The host's clock moved by offset_ms (DUETIME_CLOCK_OFFSET_MS: fault injection)."""
    return system_clock_ms() + offset_ms


class Services:
    """Everything a request, a releaser tick or a CLI command needs."""

    def __init__(self, config: Config, clock: Clock = system_clock_ms) -> None:
        self.config = config
        if clock is system_clock_ms and config.clock_offset_ms:
            clock = functools.partial(_offset_clock, config.clock_offset_ms)
        self.clock = clock
        self.db = CassandraSession(config)
        self.waker = Waker(OwnershipStore(self.db, config.release_ring).wake_addresses)
        self.keys = ApiKeyStore(self.db)
        self.topics = TopicStore(self.db)
        self.topic_cache = TopicCache(self.topics)
        self.counts = CountStore(self.db)
        self.campaigns = CampaignStore(self.db)
        self.campaign_rules = CampaignRules(self.campaigns)
        self.operations = OperationStore(self.db)
        self.schedules = ScheduleStore(self.db)
        self.messages = MessageStore(self.db)
        self.caps = CapStore(self.db)
        self.shared_homes = SharedHomes()
        self.timeline = TimelineStore(self.db)
        self.clocks = ClockStore(self.db)
        self.cluster_clock = ClusterClock(clock, self.clocks.cassandra_now_ms,
                                          config.safety_lag_ms // 2)
        self.dead_letters = DeadLetterStore(self.db, config.retention_days)
        self.lag_minutes = LagStore(self.db)
        self.lag = LagLog(self.lag_minutes, clock)
        self.waits = Waits(config.api_waits, config.api_waits_per_tenant)
        self.desk = Desk(OwnershipStore(self.db, config.release_ring), config.release_slots,
                         clock, handover_s=2 * config.release_lease_ms / 1000)
        self.placer = PointerPlacer(self.timeline, config, self.cluster_clock.now,
                                    self.waker.wake, pull_written=self.desk.written)
        self.scanner = DueScanner(self.timeline, self.messages, config)
        self.quotas = Quotas(self.db, {
            "requests": Limit(config.rate_limit_per_s, config.rate_burst),
            "messages": Limit(config.message_rate_limit_per_s, config.message_rate_burst)},
            clock)

    def close(self) -> None:
        self.desk.close()
        self.waker.close()
        self.quotas.close()
        self.lag.close()
        self.topic_cache.close()
        self.counts.close()
        self.db.shutdown()
