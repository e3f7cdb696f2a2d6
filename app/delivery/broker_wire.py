"""What an API process and a releaser say to each other about pull leases (docs/design.md,
"How a due message is found"): one JSON object per line over a TCP connection.

A connection opens with a *hello* carrying the token the releaser published with its
membership row (`releaser_members.broker_token`); the releaser closes one that does not.
A *want* asks the releaser owning some of a topic's shards for up to `n` of its due messages,
leased on the caller's terms, waiting up to `wait_ms` for the first. A want whose call asked
other owners too (`several`) is taken for only with the call's leave: an owner holding due
messages *offers*, the call *grants* one owner at a time, and a granted owner that then finds
nothing to take gives the grant back (*pass*), so that the call grants the next offer; so one
owner at a time takes for a call, and nothing is leased for it only to go back. Its answer,
*got*, names
the want and carries the messages leased for it: each row as leased, the attempt count and
consumer it had before (to give it back unchanged) and its payload. A *withdraw* tells a
releaser that a want's call has its answer (from another owner) or has gone: a want still
waiting there is answered with nothing, and what was leased for it meanwhile is given back
by the releaser. Times are epoch ms.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import socket
import struct
import uuid
from typing import Any

from app.models import MessageState, Payload

# A write to the other end that makes no progress for this long fails (s): a stopped or
# cut-off peer, whose buffers filled, never holds the writer's thread (and every call or
# round waiting behind it) for longer.
SEND_TIMEOUT_S = 1.0
# TCP keep-alive of the links: first probe after 10 s idle, then every 5 s, 3 unanswered
# probes close it (a peer gone with its host or network found within KEEPALIVE_S)
KEEPALIVE = (10, 5, 3)
KEEPALIVE_S = KEEPALIVE[0] + KEEPALIVE[1] * KEEPALIVE[2]
_UUIDS = ("topic_uid", "lease_token", "last_op")
_STATE_FIELDS = tuple(f.name for f in dataclasses.fields(MessageState))
_KNOWN = frozenset(_STATE_FIELDS)


@dataclasses.dataclass(frozen=True)
class Want:
    """Up to n due messages of a topic, leased for lease_s (seconds) to consumer. tenant and
    name let a releaser that does not know the topic yet (made a moment ago) read it."""

    id: int
    topic_uid: uuid.UUID
    n: int
    lease_s: int
    consumer: str | None
    wait_ms: int
    tenant: str = ""
    name: str = ""
    # when the caller's process last wrote pointers of the topic due soon (epoch ms, 0: not
    # since it started): a round reads the topic again before handing out what it holds only
    # for a write it may not have read (workers.broker)
    written_ms: int = 0
    # whether the call asked other owners too: an owner then takes for it only once the
    # call granted it (offer, grant, pass)
    several: bool = False


@dataclasses.dataclass(frozen=True)
class Taken:
    """A message a releaser leased for a want: the row before and as leased, its payload."""

    before_attempts: int
    before_consumer: str | None
    leased: MessageState
    payload: Payload
    due_ms: int  # when it was due, before the lease moved it


def bound_sends(sock: socket.socket, timeout_s: float = SEND_TIMEOUT_S) -> None:
    """Make every send on this blocking socket fail (OSError) once it has made no progress
    for timeout_s, and send small lines at once (no Nagle wait). Reads stay blocking, as a
    connection may rightly be idle for hours: a reader thread waits for lines and nobody
    waits on it (a call waits for its answer by its own deadline); a peer whose host or
    network is gone is found by TCP keep-alive within KEEPALIVE_S, and its reads fail."""
    seconds = int(timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                    struct.pack("ll", seconds, int((timeout_s - seconds) * 1_000_000)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, every, probes = KEEPALIVE
    with contextlib.suppress(AttributeError, OSError):  # the TCP_KEEP* options are Linux's
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, every)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)


def encode_hello(token: str) -> bytes:
    return _line({"hello": token})


def decode_hello(message: dict[str, Any]) -> str:
    """The token of a hello; KeyError or TypeError when the line is not one."""
    token = message["hello"]
    if not isinstance(token, str):
        raise TypeError("the token is not a string")
    return token


def encode_want(want: Want) -> bytes:
    return _line({"want": want.id, "topic": str(want.topic_uid), "n": want.n,
                  "lease_s": want.lease_s, "consumer": want.consumer, "wait_ms": want.wait_ms,
                  "tenant": want.tenant, "name": want.name, "written_ms": want.written_ms,
                  "several": want.several})


def decode_want(message: dict[str, Any]) -> Want:
    """A want from its decoded line; ValueError or KeyError for a malformed one."""
    return Want(int(message["want"]), uuid.UUID(message["topic"]), int(message["n"]),
                int(message["lease_s"]), message.get("consumer"), int(message["wait_ms"]),
                str(message.get("tenant", "")), str(message.get("name", "")),
                int(message.get("written_ms", 0)), bool(message.get("several", False)))


def encode_got(want_id: int, taken: list[Taken]) -> bytes:
    return _line({"got": want_id, "messages": [_taken(t) for t in taken]})


def encode_offer(want_id: int) -> bytes:
    return _line({"offer": want_id})


def encode_grant(want_id: int) -> bytes:
    return _line({"grant": want_id})


def encode_pass(want_id: int) -> bytes:
    return _line({"pass": want_id})


def decode_notice(message: dict[str, Any], kind: str) -> int | None:
    """The want id an `offer`, `grant`, `pass` or `withdraw` line names, by kind; None when
    the line is not of that kind."""
    return int(message[kind]) if kind in message else None


def encode_withdraw(want_id: int) -> bytes:
    return _line({"withdraw": want_id})


def decode_got(message: dict[str, Any]) -> tuple[int, list[Taken]]:
    return int(message["got"]), [_untaken(m) for m in message["messages"]]


def decode_line(line: bytes) -> dict[str, Any]:
    """One line's object; ValueError when it is not a JSON object, or not whole: a line
    without its newline was cut short (its sender could not send the rest, and gave back what
    it carried), even if what came is JSON."""
    if not line.endswith(b"\n"):
        raise ValueError("a line cut short")
    found = json.loads(line)
    if not isinstance(found, dict):
        raise ValueError("not an object")
    return found


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _taken(t: Taken) -> dict[str, Any]:
    # field by field: dataclasses.asdict deep-copies every value, and this runs per message
    row = {name: getattr(t.leased, name) for name in _STATE_FIELDS}
    for name in _UUIDS:
        if row[name] is not None:
            row[name] = str(row[name])
    return {"row": row, "before_attempts": t.before_attempts,
            "before_consumer": t.before_consumer, "due_ms": t.due_ms,
            "payload": base64.b64encode(t.payload.data).decode("ascii"),
            "encoding": t.payload.encoding, "headers": t.payload.headers}


def _untaken(m: dict[str, Any]) -> Taken:
    # a row's fields this version does not know are left out, one it knows but the sender
    # did not send takes its default: processes of two versions read each other's answers
    # during a rolling upgrade (a line one cannot read closes the link, and what it carried
    # stays leased to nobody until the lease runs out)
    row: dict[str, Any] = {k: (uuid.UUID(v) if k in _UUIDS and v is not None else v)
                           for k, v in m["row"].items() if k in _KNOWN}
    return Taken(m["before_attempts"], m["before_consumer"], MessageState(**row),
                 Payload(base64.b64decode(m["payload"]), m["encoding"], m["headers"]),
                 m["due_ms"])
