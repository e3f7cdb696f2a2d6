"""The API process's end of the brokers (workers/broker.py; docs/design.md, "How a due message
is found"): a lease call's want goes to the releasers owning the topic's shards, over one
TCP connection per releaser, and what they leased for it comes back.

The owners are read from the release slots' leases and the releasers' membership rows at
most every OWNERS_EVERY_S. A want asks each owner for the call's n; when there are several,
an owner holding due messages offers to take them, and the call grants one offer at a time
(the next when the granted owner passes), so only one owner takes for a call. What comes
back beyond the n, or after the call left, is given back at once (scheduled again, its
attempt not counted). A topic none of whose shards has had a reachable owner for handover_s (slots
moving between releasers, a dead one's running out) is answered nothing, as a poll with
nothing due; past that, want() answers None (no releaser). A send that makes no progress
for broker_wire.SEND_TIMEOUT_S (the releaser stopped or cut off) closes its link: a call
never waits on a stopped peer for longer.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.core.timeline import release_slot_of
from app.delivery import broker_wire
from app.delivery.broker_wire import Taken, Want
from app.delivery.waits import STAYING, Departure
from app.delivery.wakeups import parse_address
from app.models import Topic
from app.store.ownership import OwnershipStore

OWNERS_EVERY_S = 1.0
UNSERVED_EVERY_S = 0.05  # a shard with no reachable owner: its owner read again after this
CONNECT_TIMEOUT_S = 1.0
RETRY_AFTER_S = 2.0  # an address that refused a connection is not tried again before this
ANSWER_GRACE_S = 0.5  # an owner answers a want by its wait; past this more, the call leaves
MAX_WRITTEN = 100_000  # topics whose last write a process remembers
log = logging.getLogger(__name__)


class _Link:
    """One connection to a releaser's broker: wants out, answers in on a thread of its own.
    An answer goes to the callback its want was sent with; a closed link answers every
    pending want with None."""

    def __init__(self, address: tuple[str, int], token: str,
                 on_close: Callable[[_Link], None]) -> None:
        self._sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
        self._sock.settimeout(None)
        broker_wire.bound_sends(self._sock)
        try:
            self._sock.sendall(broker_wire.encode_hello(token))
        except OSError:
            self._sock.close()
            raise
        self._on_close = on_close
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # one line at a time on the socket
        # want id -> the call it was sent for
        self._pending: dict[int, _Call] = {}
        self._closed = False
        threading.Thread(target=self._read_loop, name="desk-link", daemon=True).start()

    def send(self, want: Want, call: _Call) -> bool:
        """Send the want; its answer, offers and passes go to `call` (the answer None once
        the link closes, as when this send fails). False when the link was closed already
        (nothing sent, no answer will come)."""
        with self._lock:
            if self._closed:
                return False
            self._pending[want.id] = call
        self._write(broker_wire.encode_want(want))
        return True

    def grant(self, want_id: int) -> None:
        """Let the broker take for the want (it offered)."""
        self._write(broker_wire.encode_grant(want_id))

    def withdraw(self, want_id: int) -> None:
        """Tell the broker the want's call is done, if it has not answered it yet; its
        answer still comes (nothing, or what it leased meanwhile, which goes back)."""
        with self._lock:
            if self._closed or want_id not in self._pending:
                return
        self._write(broker_wire.encode_withdraw(want_id))

    def _write(self, line: bytes) -> bool:
        """Send one line; False, and the link closed, when it failed or made no progress
        for SEND_TIMEOUT_S (a line cut short leaves the stream unreadable)."""
        try:
            with self._sending:
                self._sock.sendall(line)
            return True
        except OSError as exc:
            log.warning("broker link closed: a send failed: %r", exc)
            self.close()
            return False

    def _read_loop(self) -> None:
        try:
            with self._sock.makefile("rb") as lines:
                for line in lines:
                    self._dispatch(broker_wire.decode_line(line))
        except OSError as exc:
            log.debug("broker link closed: %r", exc)
        except (ValueError, KeyError, TypeError) as exc:
            # what the line carried is leased to nobody until those leases run out
            log.warning("broker link closed on an answer it could not read: %r", exc)
        finally:
            self.close()

    def _dispatch(self, message: dict[str, Any]) -> None:
        """One line from the broker: an offer or a pass for a want, or its answer."""
        for kind in ("offer", "pass"):
            want_id = broker_wire.decode_notice(message, kind)
            if want_id is not None:
                with self._lock:
                    call = self._pending.get(want_id)
                if call is not None:
                    (call.offer if kind == "offer" else call.passed)(self, want_id)
                return
        want_id, taken = broker_wire.decode_got(message)
        with self._lock:
            call = self._pending.pop(want_id, None)
        if call is not None:
            call.answer(self, taken)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = self._pending, {}
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._on_close(self)
        for call in pending.values():
            call.answer(self, None)


class _Call:
    """One lease call's wait for its owners' answers: done once one brought messages or all
    answered; what arrives after it left goes to `late`. Of the owners that offer to take
    for it, one at a time is granted; the next offer is granted when that one passes or
    answers with nothing."""

    def __init__(self, expected: int, late: Callable[[list[Taken]], None]) -> None:
        self._expected = expected
        self._late = late
        self._cond = threading.Condition()
        self._got: list[Taken] = []
        self._answered = 0
        self._open = True
        self.asked: list[tuple[_Link, int]] = []  # (owner, want id) of the wants sent
        self._granted: _Link | None = None
        self._offers: list[tuple[_Link, int]] = []  # waiting for a grant, in arrival order

    def sent(self, link: _Link, want_id: int) -> None:
        with self._cond:
            self.asked.append((link, want_id))

    def offer(self, link: _Link, want_id: int) -> None:
        with self._cond:
            if not self._open or self._got:
                return
            if self._granted is not None:
                self._offers.append((link, want_id))
                return
            self._granted = link
        link.grant(want_id)

    def passed(self, link: _Link, want_id: int) -> None:
        self._grant_next(link)

    def _grant_next(self, link: _Link) -> None:
        """The granted owner (`link`) took nothing: the next offer, if any, is granted."""
        with self._cond:
            if self._granted is not link:
                return
            self._granted = None
            if not self._open or self._got or not self._offers:
                return
            self._granted, want_id = self._offers.pop(0)
            granted = self._granted
        granted.grant(want_id)

    def answer(self, link: _Link, taken: list[Taken] | None) -> None:
        with self._cond:
            if self._open:
                self._got.extend(taken or [])
                self._answered += 1
                self._cond.notify_all()
                opened = True
            else:
                opened = False
        if not opened and taken:
            self._late(taken)
        elif opened and not taken:
            self._grant_next(link)

    def wait(self, timeout_s: float, gone: Departure) -> list[Taken]:
        """What the owners brought within timeout_s; the wait ends sooner, with nothing
        more, once the call's client leaves (`gone`)."""
        forget = gone.on_leave(self._client_left)
        try:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._got) or self._answered >= self._expected
                                    or gone(), timeout_s)
                self._open = False
                return self._got
        finally:
            forget()

    def _client_left(self) -> None:
        with self._cond:
            self._cond.notify_all()


class Desk:
    """Thread-safe; one per API process."""

    def __init__(self, ownership: OwnershipStore, slots: int, clock: Callable[[], int],
                 handover_s: float) -> None:
        self.ownership = ownership
        self.slots = slots
        self.clock = clock
        self.handover_s = handover_s
        self._giving_back = ThreadPoolExecutor(1, thread_name_prefix="desk-give-back")
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._connecting = threading.Lock()
        # slot -> its owner's broker: address and token
        self._owners: dict[int, tuple[tuple[str, int], str]] = {}
        self._owners_read = -float("inf")
        self._links: dict[tuple[str, int], _Link] = {}
        self._refused: dict[tuple[str, int], float] = {}
        self._ids = itertools.count(1)
        # slot -> when (monotonic s) it last had a reachable owner; the desk's start for all
        self._served_s: dict[int, float] = {}
        self._started_s = time.monotonic()
        self._written: dict[uuid.UUID, int] = {}  # topic -> last write due soon (epoch ms)

    def written(self, topic_uid: uuid.UUID) -> None:
        """This process wrote pointers of the pull topic due soon: its next wants say when,
        so that the owner reads the topic before handing out what it holds."""
        with self._lock:
            if len(self._written) > MAX_WRITTEN:
                self._written.clear()
            self._written[topic_uid] = self.clock()

    def want(self, topic: Topic, n: int, wait_ms: int, lease_s: int, consumer: str | None,
             give_back: Callable[[list[Taken]], object],
             gone: Departure = STAYING) -> list[Taken] | None:
        """Up to n messages leased by the topic's owners for lease_s to consumer; None when
        no owner could be asked for handover_s. give_back(taken) makes what comes past n, or
        after the call left, due again at once. The wait ends early once gone() (the
        client closed its connection)."""
        links = self._links_of(topic)
        if not links:
            return [] if self._handing_over(topic) else None

        def late(taken: list[Taken]) -> None:
            # off the link's reader and the call's thread: a give-back is Cassandra writes
            with contextlib.suppress(RuntimeError):  # closing: their leases expire instead
                self._giving_back.submit(give_back, taken)

        call = _Call(len(links), late)
        for link in links:
            want = Want(next(self._ids), topic.uid, n, lease_s, consumer, wait_ms,
                        topic.tenant, topic.name, self._written.get(topic.uid, 0),
                        len(links) > 1)
            if link.send(want, call):
                call.sent(link, want.id)
            else:
                call.answer(link, None)
        if not call.asked:
            return None
        got = call.wait(wait_ms / 1000 + ANSWER_GRACE_S, gone)
        if len(call.asked) > 1 or not got:
            # the other owners' wants, or that of a call that left early, would take
            # messages nobody waits for
            for link, want_id in call.asked:
                link.withdraw(want_id)
        if len(got) > n:
            late(got[n:])
        return got[:n]

    def serves(self, topic: Topic) -> bool:
        """Whether an owner of the topic's shards can be asked now."""
        return bool(self._links_of(topic))

    def _slots_of(self, topic: Topic) -> list[int]:
        """The release slots of the topic's shards, each once (shards may share a slot)."""
        return list(dict.fromkeys(release_slot_of(str(topic.uid), s, self.slots)
                                  for s in range(topic.settings.shards)))

    def _handing_over(self, topic: Topic) -> bool:
        """Whether one of the topic's slots had a reachable owner (or the desk started)
        within handover_s: its slots are moving, not unserved."""
        now_s = time.monotonic()
        with self._lock:
            return any(now_s - self._served_s.get(slot, self._started_s) < self.handover_s
                       for slot in self._slots_of(topic))

    def _links_of(self, topic: Topic) -> list[_Link]:
        """The links to the owners of the topic's shards. A shard without a reachable owner
        (slots moving between releasers, one stopped) has its owners read again after
        UNSERVED_EVERY_S, not OWNERS_EVERY_S: a call waiting 200 ms finds the new owner."""
        slots = self._slots_of(topic)
        self._read_owners(OWNERS_EVERY_S)
        links = self._links_to(slots)
        if len(links) < len(slots) and self._read_owners(UNSERVED_EVERY_S):
            links = self._links_to(slots)
        now_s = time.monotonic()
        with self._lock:
            self._served_s.update((slot, now_s) for slot in links)
        return list(dict.fromkeys(links.values()))

    def _links_to(self, slots: list[int]) -> dict[int, _Link]:
        with self._lock:
            owners = {slot: self._owners.get(slot) for slot in slots}
        return {slot: link for slot, owner in owners.items()
                if owner is not None and (link := self._link(*owner)) is not None}

    def _read_owners(self, every_s: float) -> bool:
        """Read who owns each slot if the last read is every_s old; calls meanwhile wait
        for it rather than find none. Whether it was read."""
        if time.monotonic() - self._owners_read < every_s:
            return False
        with self._reading:
            now_s = time.monotonic()
            if now_s - self._owners_read < every_s:
                return False
            self._read_owners_now()
            self._owners_read = now_s
            return True

    def _read_owners_now(self) -> None:
        try:
            leases = self.ownership.slots(self.slots)
            brokers = self.ownership.brokers()
        except Exception as exc:  # no owner known: the caller finds messages itself
            log.debug("slot owners not read: %s", exc)
            leases, brokers = {}, {}
        clock = self.clock()
        owners = {}
        for slot, lease in leases.items():
            address, token = brokers.get(lease.owner or "", ("", ""))
            parsed = parse_address(address) if address else None
            if parsed is not None and lease.expires_at_ms > clock:
                owners[slot] = (parsed, token)
        with self._lock:
            self._owners = owners

    def _link(self, address: tuple[str, int], token: str) -> _Link | None:
        """The connection to a broker, made by one call while the others wait for it (a
        call whose link exists does not wait for another's connecting)."""
        with self._lock:
            link = self._links.get(address)
        if link is not None:
            return link
        with self._connecting:
            with self._lock:
                link = self._links.get(address)
                if link is not None:
                    return link
                if time.monotonic() - self._refused.get(address, -RETRY_AFTER_S) < RETRY_AFTER_S:
                    return None
            try:
                link = _Link(address, token, self._closed)
            except OSError as exc:
                log.debug("broker %s not reached: %s", address, exc)
                with self._lock:
                    self._refused[address] = time.monotonic()
                return None
            with self._lock:
                self._links[address] = link
            return link

    def _closed(self, link: _Link) -> None:
        with self._lock:
            for address, known in list(self._links.items()):
                if known is link:
                    del self._links[address]
                    self._refused[address] = time.monotonic()

    def close(self) -> None:
        """Close the links (what their owners still send is not read: those leases expire),
        then finish the give-backs under way."""
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.close()
        self._giving_back.shutdown(wait=True)

