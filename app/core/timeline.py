"""Pure bucket, shard and time math of the timeline. No I/O; `now` is always an argument.

Units: every *_ms is epoch milliseconds (UTC) or a duration in milliseconds.
"""

from __future__ import annotations

import zlib

from app.core.ids import embedded_home
from app.models import MessageState, Pointer

MS_PER_DAY = 86_400_000
# the furthest ahead a delivery time may be (days); DUETIME_HORIZON_DAYS may only lower it
MAX_HORIZON_DAYS = 365
MS_PER_MINUTE = 60_000
MS_PER_HOUR = 3_600_000
CAMPAIGN_SPREAD = 32
# Pointer writes due further than this after their write landed are not counted in
# bucket_writes. The counts tell a releaser's walk to re-read part of its window
# (release_lookahead_ms + safety_lag_ms, at most this); a pointer due later than that lies
# beyond every window already read, so it is found when the window reaches it. Lease pointers
# and future schedules would otherwise re-trigger those re-reads with every write.
COUNTED_AHEAD_MS = 10_000


# the slowest pace a campaign may have, messages a second: a slower one would push a
# round's slots past the microsecond counter of campaign_pace, and the take with them
MIN_PER_SECOND = 0.001


def bucket_of(due_ms: int, bucket_ms: int) -> int:
    """The time bucket holding a pointer due at due_ms."""
    return due_ms // bucket_ms


def bucket_start_ms(bucket: int, bucket_ms: int) -> int:
    return bucket * bucket_ms


def stable_hash(text: str) -> int:
    """A hash that is the same in every process and language (CRC-32 of UTF-8)."""
    return zlib.crc32(text.encode("utf-8"))


def shard_of(message_id: str, shards: int) -> int:
    """The topic shard of a message, fixed for its life: its embedded home modulo shards (so a
    home never spans shards), else a hash of the id. For hashed ids with shards dividing
    HASHED_HOMES, home and shard agree the same way."""
    home = embedded_home(message_id)
    return (stable_hash(message_id) if home is None else home) % shards


def part_of(slot: int, partition_cap: int) -> int:
    """The partition (part) of a pointer slot; every part holds at most partition_cap slots."""
    return slot // partition_cap


LANES = 1024  # lane 0: messages with neither group nor campaign; 1..1023: hashed groups
LANE_STRIDE = 1_000_000  # parts of lane L are L * LANE_STRIDE + (slot // partition_cap)


def lane_of(group: str | None) -> int:
    """The timeline lane of a fair-delivery group (MessageState.fair_group; None: neither
    group nor campaign): every lane has partitions of its own, so a pass reads the head of
    each lane and one group's backlog cannot hide another's messages. Groups share a lane
    only when their hashes collide (1 in 1,023 for two groups)."""
    return 0 if group is None else 1 + stable_hash(group) % (LANES - 1)


def pointer_of(row: MessageState, due_at_ms: int | None = None,
               version: int | None = None) -> Pointer:
    """The timeline pointer of a row (at its due time and version unless given), in its
    fair-delivery lane."""
    return Pointer(row.due_at_ms if due_at_ms is None else due_at_ms, row.id,
                   row.version if version is None else version, row.priority, row.shard,
                   lane_of(row.fair_group))


def lane_part(lane: int, slot: int, partition_cap: int) -> int:
    """The part (partition) of a pointer slot in a lane."""
    return lane * LANE_STRIDE + part_of(slot, partition_cap)


def parts_for(next_slot: int, partition_cap: int) -> int:
    """How many parts a (bucket, shard) has when next_slot slots were handed out."""
    return (next_slot + partition_cap - 1) // partition_cap


def placement_ms(due_ms: int, now_ms: int) -> int:
    """Where a pointer goes: never behind the writer's clock, so it lands ahead of readers'
    cursors (which trail their clocks by the safety lag) even for past deliver_at times."""
    return max(due_ms, now_ms)


def parked_ms(deliver_ms: int, now_ms: int, horizon_days: int) -> int:
    """Where a message asking for deliver_ms (epoch ms) goes on the timeline: placement_ms,
    but never past the horizon (now + horizon_days). One further ahead is parked there and
    hops on when it comes due (app.delivery.hops), its deliver_at kept."""
    return min(placement_ms(deliver_ms, now_ms), now_ms + horizon_days * MS_PER_DAY)


MAX_TTL_S = 630_720_000  # Cassandra refuses a longer TTL (20 years)


def ttl_s(due_ms: int, now_ms: int, retention_days: int, slack_ms: int = 0) -> int:
    """Seconds a row must live: until due, plus the retention window, plus slack_ms; at most
    Cassandra's 20 years (a write asking more would fail, and its take with it)."""
    return min(MAX_TTL_S, max(1, (max(due_ms - now_ms, 0) + slack_ms) // 1000
                              + retention_days * 86_400))


def retry_backoff_ms(attempt: int, base_s: float, max_s: float) -> int:
    """Exponential backoff after the attempt-th failed attempt (1-based): base * 2^(attempt-1),
    capped at max_s."""
    exponent = min(max(attempt - 1, 0), 62)
    return int(min(base_s * (2**exponent), max_s) * 1000)


def campaign_spread(message_id: str) -> int:
    """Which of CAMPAIGN_SPREAD partitions of a campaign index holds this message."""
    return stable_hash(message_id) % CAMPAIGN_SPREAD


def release_slot_of(topic_uid: str, shard: int, slots: int) -> int:
    """The release slot (unit of releaser ownership) of one topic shard."""
    return stable_hash(f"{topic_uid}:{shard}") % slots


def schedule_slot_of(topic_uid: str, name: str, slots: int) -> int:
    """The release slot whose owner produces a schedule's fires."""
    return stable_hash(f"{topic_uid}:schedule:{name}") % slots


def fair_share(members: list[str], me: str, slots: int) -> int:
    """How many of `slots` the releaser `me` should own among `members` (sorted, including
    me): an even split, the first members taking one extra when it does not divide."""
    ranked = sorted(set(members) | {me})
    base, extra = divmod(slots, len(ranked))
    return base + (1 if ranked.index(me) < extra else 0)
