"""Message ids: client-supplied ones are validated; server ones are time-ordered and unique.

Every id also names its *home*: the state partition that holds the message's row next to the
rows of messages likely to change together (docs/design.md, "Homes"). A server-made id embeds
the home its enqueue request chose; any other id is hashed onto one of HASHED_HOMES.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import uuid
import zlib

# "." and ".." are not ids: a URL path cannot carry them (clients remove dot segments, so a
# DELETE of message ".." would reach its topic)
CLIENT_ID = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.:-]{1,128}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
HOME_BITS = 20
EMBEDDED_HOMES = 1 << HOME_BITS
HASHED_HOMES = 256


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_message_id(now_ms: int, home: int | None = None) -> str:
    """A ULID: 48 bits of milliseconds, then the 20-bit home (random when not given), then 60
    random bits; 26 Crockford base-32 characters. Sorts by creation time; a collision needs
    2^30 ids of one home in one millisecond."""
    chosen = secrets.randbelow(EMBEDDED_HOMES) if home is None else home
    if not 0 <= chosen < EMBEDDED_HOMES:
        raise ValueError(f"home {chosen} is outside [0, {EMBEDDED_HOMES})")
    return (_base32(now_ms & ((1 << 48) - 1), 10) + _base32(chosen, 4)
            + _base32(secrets.randbits(60), 12))


def embedded_home(message_id: str) -> int | None:
    """The home a ULID-shaped id carries (characters 11-14), or None for any other id."""
    if not _ULID.match(message_id):
        return None
    value = 0
    for char in message_id[10:14]:
        value = value * 32 + _CROCKFORD.index(char)
    return value


def home_of(message_id: str) -> int:
    """The state partition of a message within its topic: the embedded home of a ULID-shaped
    id, else CRC-32 of the id modulo HASHED_HOMES. Pure, and the same in every process."""
    embedded = embedded_home(message_id)
    if embedded is not None:
        return embedded
    return zlib.crc32(message_id.encode("utf-8")) % HASHED_HOMES


def homes_for_request(shards: int) -> list[int]:
    """One fresh home per topic shard, home % shards == shard, for the server-made ids of one
    enqueue request: the messages of a request that share a shard share a partition, so their
    later transitions go in one conditional batch (one Paxos round)."""
    base = secrets.randbelow(EMBEDDED_HOMES // shards) * shards
    return [base + shard for shard in range(shards)]


# Requests of fewer messages than this (or than the topic's shards) take a shared home: a
# fresh home of their own would hold their few messages alone on a topic of few shards.
SHARED_BELOW = 16
SHARED_HOME_ROWS = 100  # a conditional batch's rows (app.store.messages.CONDITIONAL_BATCH)
SHARED_HOME_MS = 1_000
SHARED_HOME_TOPICS = 1_000  # past this many topics, those whose home has run out are let go


class SharedHomes:
    """The homes of one process's small enqueue requests (fewer messages than the topic has
    shards or SHARED_BELOW, to which homes_for_request would give a home or a few messages a
    home): one home per topic at a time, taking up to SHARED_HOME_ROWS messages within
    SHARED_HOME_MS of its first, then a fresh one (so a random shard: home % shards).
    Messages a process enqueues one at a time then share partitions as a batch's do: a group
    commit of them is one write, and the walk's row reads, the takes and the acks of what
    comes due together are one request per home, not one per message. Thread-safe; times
    are epoch ms."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[uuid.UUID, tuple[int, int, int]] = {}  # topic: home, since, rows

    def home(self, topic_uid: uuid.UUID, rows: int, now_ms: int) -> int:
        """The home for `rows` more messages of the topic."""
        with self._lock:
            found = self._current.get(topic_uid)
            if found is None or not self._fits(found, rows, now_ms):
                if len(self._current) >= SHARED_HOME_TOPICS:
                    self._current = {t: c for t, c in self._current.items()
                                     if self._fits(c, 0, now_ms)}
                found = (secrets.randbelow(EMBEDDED_HOMES), now_ms, 0)
            home, since, used = found
            self._current[topic_uid] = (home, since, used + rows)
            return home

    @staticmethod
    def _fits(current: tuple[int, int, int], rows: int, now_ms: int) -> bool:
        _, since, used = current
        return used + rows <= SHARED_HOME_ROWS and 0 <= now_ms - since < SHARED_HOME_MS


def import_id(campaign: str | None, recipient: str, time_spec: str) -> str:
    """The id of an imported send: the same campaign, recipient and time spec give the same
    id in every run and task, so a re-run or a retried task adds nothing."""
    key = "\x1f".join([campaign or "", recipient, time_spec])
    return "imp-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
