"""Message ids: client-supplied ones are validated; server ones are time-ordered and unique."""

from __future__ import annotations

import hashlib
import re
import secrets

CLIENT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_message_id(now_ms: int) -> str:
    """A ULID: 48 bits of milliseconds then 80 random bits, 26 Crockford base-32 characters.
    Sorts by creation time; collisions need 2^40 ids in one millisecond."""
    return _base32(now_ms & ((1 << 48) - 1), 10) + _base32(secrets.randbits(80), 16)


def import_id(campaign: str | None, recipient: str, time_spec: str) -> str:
    """The id of an imported send: the same campaign, recipient and time spec give the same
    id in every run and task, so a re-run or a retried task adds nothing."""
    key = "\x1f".join([campaign or "", recipient, time_spec])
    return "imp-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
