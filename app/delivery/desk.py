"""The API process's end of the brokers (workers/broker.py; docs/design.md, "How a due message
is found"): a lease call's want goes to the releasers owning the topic's shards, over one
TCP connection per releaser, and what they leased for it comes back.

The owners are read from the release slots' leases and the releasers' membership rows at
most every OWNERS_EVERY_S. A want asks each owner for the call's n, one of them, in turns,
its first: only the first takes messages for it ahead of their due time, and once it has,
the call withdraws the others (workers.broker.SPILL_MS). What comes back beyond the n, or
after the call left, is given back at once (scheduled again, its attempt not counted). A
topic none of whose shards has had a reachable owner for handover_s (slots moving between
releasers, a dead one's running out) is answered nothing, as a poll with nothing due; past
that, want() answers None (no releaser).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from app.core.timeline import release_slot_of
from app.delivery import broker_wire
from app.delivery.broker_wire import Taken, Want
from app.delivery.wakeups import parse_address
from app.models import Topic
from app.store.ownership import OwnershipStore

OWNERS_EVERY_S = 1.0
UNSERVED_EVERY_S = 0.05  # a shard with no reachable owner: its owner read again after this
CONNECT_TIMEOUT_S = 1.0
RETRY_AFTER_S = 2.0  # an address that refused a connection is not tried again before this
ANSWER_GRACE_S = 2.0  # an owner answers a want by its wait; past this more, the call leaves
MAX_WRITTEN = 100_000  # topics whose last write a process remembers
log = logging.getLogger(__name__)

Answer = Callable[[list[Taken] | None], None]


class _Link:
    """One connection to a releaser's broker: wants out, answers in on a thread of its own.
    An answer goes to the callback its want was sent with; a closed link answers every
    pending want with None."""

    def __init__(self, address: tuple[str, int], token: str,
                 on_close: Callable[[_Link], None]) -> None:
        self._sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock.sendall(broker_wire.encode_hello(token))
        except OSError:
            self._sock.close()
            raise
        self._on_close = on_close
        self._lock = threading.Lock()
        # want id -> where its answer goes, and what to do when its messages are prepared
        self._pending: dict[int, tuple[Answer, Callable[[], None]]] = {}
        self._closed = False
        threading.Thread(target=self._read_loop, name="desk-link", daemon=True).start()

    def send(self, want: Want, answer: Answer, prepared: Callable[[], None]) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._pending[want.id] = (answer, prepared)
            try:
                self._sock.sendall(broker_wire.encode_want(want))
            except OSError:
                self._pending.pop(want.id, None)
                return False
        return True

    def withdraw(self, want_id: int) -> None:
        """Tell the broker the want's call is done, if it has not answered it yet; its
        answer still comes (nothing, or what it leased meanwhile, which goes back)."""
        with self._lock:
            if self._closed or want_id not in self._pending:
                return
            with contextlib.suppress(OSError):  # closed: the broker forgets the link's wants
                self._sock.sendall(broker_wire.encode_withdraw(want_id))

    def _read_loop(self) -> None:
        try:
            with self._sock.makefile("rb") as lines:
                for line in lines:
                    message = broker_wire.decode_line(line)
                    notice = broker_wire.decode_prepared(message)
                    if notice is not None:
                        with self._lock:
                            waiting = self._pending.get(notice)
                        if waiting is not None:
                            waiting[1]()
                        continue
                    want_id, taken = broker_wire.decode_got(message)
                    with self._lock:
                        answered = self._pending.pop(want_id, None)
                    if answered is not None:
                        answered[0](taken)
        except OSError as exc:
            log.debug("broker link closed: %r", exc)
        except (ValueError, KeyError, TypeError) as exc:
            # what the line carried is leased to nobody until those leases run out
            log.warning("broker link closed on an answer it could not read: %r", exc)
        finally:
            self.close()

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
        for answer, _ in pending.values():
            answer(None)


class _Call:
    """One lease call's wait for its owners' answers: done once one brought messages or all
    answered; what arrives after it left goes to `late`. Once an owner prepared messages
    for it (took them ahead of their due time, or is taking due ones), its wants at the other
    owners are withdrawn, so that they take nothing for it that would only go back."""

    def __init__(self, expected: int, late: Callable[[list[Taken]], None]) -> None:
        self._expected = expected
        self._late = late
        self._cond = threading.Condition()
        self._got: list[Taken] = []
        self._answered = 0
        self._open = True
        self.asked: list[tuple[_Link, int]] = []  # (owner, want id) of the wants sent
        self._prepared_by: _Link | None = None

    def sent(self, link: _Link, want_id: int) -> None:
        with self._cond:
            self.asked.append((link, want_id))
            prepared_by = self._prepared_by
        if prepared_by is not None and prepared_by is not link:  # came before this was sent
            link.withdraw(want_id)

    def prepared(self, by: _Link) -> None:
        with self._cond:
            self._prepared_by = by
            others = [(link, want_id) for link, want_id in self.asked if link is not by]
        for link, want_id in others:
            link.withdraw(want_id)

    def answer(self, taken: list[Taken] | None) -> None:
        with self._cond:
            if self._open:
                self._got.extend(taken or [])
                self._answered += 1
                self._cond.notify_all()
                return
        if taken:
            self._late(taken)

    def wait(self, timeout_s: float) -> list[Taken]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._got) or self._answered >= self._expected,
                                timeout_s)
            self._open = False
            return self._got


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
        self._turns = itertools.count()  # which owner is a call's first
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
             give_back: Callable[[list[Taken]], object]) -> list[Taken] | None:
        """Up to n messages leased by the topic's owners for lease_s to consumer; None when
        no owner could be asked for handover_s. give_back(taken) makes what comes past n, or
        after the call left, due again at once."""
        links = self._links_of(topic)
        if not links:
            return [] if self._handing_over(topic) else None

        def late(taken: list[Taken]) -> None:
            # off the link's reader and the call's thread: a give-back is Cassandra writes
            with contextlib.suppress(RuntimeError):  # closing: their leases expire instead
                self._giving_back.submit(give_back, taken)

        call = _Call(len(links), late)
        first = next(self._turns) % len(links)  # calls take turns
        for index, link in enumerate(links):
            want = Want(next(self._ids), topic.uid, n, lease_s, consumer, wait_ms,
                        topic.tenant, topic.name, self._written.get(topic.uid, 0),
                        index == first, len(links) > 1)
            if link.send(want, call.answer, functools.partial(call.prepared, link)):
                call.sent(link, want.id)
            else:
                call.answer(None)
        if not call.asked:
            return None
        got = call.wait(wait_ms / 1000 + ANSWER_GRACE_S)
        if len(call.asked) > 1:  # the other owners' wants would take messages nobody waits for
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

