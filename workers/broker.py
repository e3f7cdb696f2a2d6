"""The releaser's broker: what the walk read of the owned shards, held and taken in rounds for
lease calls (pull topics) and for the releaser's POST pool (webhook topics; docs/design.md,
"How a due message is found").

Nothing is taken ahead of a consumer: a round takes only messages due now (on this host's
clock), and only for a want that is waiting (pull) or for the POST pool, which POSTs what it
is given at once (push). So a producer's cancel or move of a message nobody holds is decided
by the take's conditional write, never by a clock compared with a deadline.

A webhook topic's round takes what is due, in fair order, up to the room its POST pool has
(workers.push.PushDispatcher). It runs when the walk holds more of the topic (a message
found late: at once), when room frees, and at the moment the next message held comes due.

API processes send their lease calls' *wants* (app.delivery.broker_wire) over TCP to the
releasers owning the topic's shards, on the port number of the releaser's wake-ups, after a
hello with the token the releaser publishes in its membership row (others are closed). A
round puts the messages held of the topic and due now in fair order, leases them on the
callers' terms (one take: conditional batches per home across the wants) and sends them
back. A round first has the walk read the topic (`read_now`) where a write count moved,
unless a read of it began after its newest want came or, while what is held and due covers
the wants, after the last write it was told of (_read_since); a want that finds nothing
waits, parked, until the walk holds more of the topic, a due wake-up names it (a write due
soon), a message held comes due (or a consumer's lease on it ends), the idle period
(DUETIME_PULL_IDLE_MS) passes or its wait ends; one check a topic at a time.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from app.core.timeline import pointer_of
from app.delivery import broker_wire
from app.delivery.broker_wire import Taken, Want
from app.delivery.fairness import fair_first
from app.delivery.leasing import (
    Hold,
    attempts_used_up,
    give_back,
    pauses,
    take_with_payloads,
)
from app.delivery.scan import Due, PointerKey, is_live, pointer_key
from app.models import Pointer, Topic
from app.services import Services
from workers.broker_server import BrokerServer, Reply
from workers.held import HeldMessages, ready_ms
from workers.push import PushDispatcher

# A round leases at most this many messages (and makes at most as many more dead, their
# attempts used up), and the next round starts at once. Its take must
# end within its callers' waits: the desk gives back what comes after a want's wait plus
# ANSWER_GRACE_S, and rounds of thousands of LWTs on a loaded host came back too late, round
# after round, so calls asking for hundreds got nothing while their messages went back and
# forth.
ROUND_MAX = 250
# The most messages the walk holds here for one topic, and for one fair-delivery lane of a
# shard: a backlog is read this many at a time, and a lane with one does not keep the others'
# messages out (their turns come from what is held: app.delivery.fairness).
HELD_MAX = 8192
HELD_PER_LANE = 128
# A webhook topic's round takes at most this many messages (the POST pool's takes run several
# at once); the next round starts at once.
PUSH_ROUND_MAX = 4000
UNKNOWN_RECHECK_S = 0.1
UNDECIDED_RETRY_MS = 100  # a take left undecided (a write failed) is tried again after this
BROKER_THREADS = 4
log = logging.getLogger("duetime.broker")



class _Parked:
    """A want waiting for messages, with where its answer goes and until when it waits. A
    want its call sent to other owners too is taken for only once the call granted it
    (broker_wire: *offer*, *grant*); `offered` says an offer is out."""

    def __init__(self, want: Want, reply: Reply, link: int, arrived_ms: int) -> None:
        self.want = want
        self.reply = reply
        self.link = link
        self.arrived_ms = arrived_ms  # epoch ms, the releaser's clock
        self.deadline = time.monotonic() + want.wait_ms / 1000
        self.granted = not want.several
        self.offered = False


class Broker:
    """Serves wants for the shards the releaser owns. Thread-safe; one per releaser.
    `shards_of(topic)` gives the topic's shards this releaser owns now; `on_unknown(uid)`
    is told of a want for a topic `topic_of` does not know (yet); `read_now(topic, since)`
    has the walk read the topic unless a read of it began at or after `since` (epoch ms);
    `read_again(uid, pointers)` has the walk read pointers again that it passed; `push`,
    set before start(), takes webhook topics' rounds."""

    def __init__(self, services: Services, token: str,
                 topic_of: Callable[[uuid.UUID], Topic | None],
                 shards_of: Callable[[Topic], set[int]],
                 on_unknown: Callable[[uuid.UUID], None],
                 read_now: Callable[[Topic, int], None],
                 read_again: Callable[[uuid.UUID, list[Pointer]], None]) -> None:
        self.services = services
        self.token = token
        self.topic_of = topic_of
        self.shards_of = shards_of
        self.on_unknown = on_unknown
        self.read_now = read_now
        self.read_again = read_again
        self.recheck_s = services.config.pull_idle_ms / 1000
        self.push: PushDispatcher | None = None
        self._starved: set[uuid.UUID] = set()  # webhook topics whose POST pool had no room
        self._lock = threading.Lock()
        self._wants: dict[uuid.UUID, list[_Parked]] = defaultdict(list)
        # per topic, the waiting messages the walk read (workers.releaser.Releaser.walk)
        self.held: dict[uuid.UUID, HeldMessages] = {}
        self._woken_at: dict[uuid.UUID, int] = {}  # topic -> its last due wake-up (epoch ms)
        self._serving: set[uuid.UUID] = set()
        self.rounds = 0  # rounds served since start, for stats and tests (approximate)
        self._again: set[uuid.UUID] = set()
        self._pool = ThreadPoolExecutor(BROKER_THREADS, thread_name_prefix="broker")
        # give-backs of answers that could not be sent run apart: a stalled process's many
        # would otherwise queue ahead of other processes' rounds on the broker's threads
        self._giving_back = ThreadPoolExecutor(1, thread_name_prefix="broker-give-back")
        # (monotonic s, seq, what to do then): parked topics' and webhook topics' next checks
        self._checks: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._checks_changed = threading.Condition()
        # per topic, the time (monotonic s) of its parked wants' next check: one at a time,
        # or every round would start a chain of checks of its own
        self._check_due: dict[uuid.UUID, float] = {}
        self._stopping = threading.Event()
        self._clock = threading.Thread(target=self._clock_loop, name="broker-clock", daemon=True)
        self._server: BrokerServer | None = None
        self._started = False

    def bind(self, port: int) -> int:
        """Bind the TCP listening socket on `port` (0: any free one) and return its number;
        OSError when it is taken. Nothing is served before start()."""
        self._server = BrokerServer(("0.0.0.0", port), self)
        return int(self._server.server_address[1])

    def unbind(self) -> None:
        """Close what bind() opened (the releaser found the number taken for UDP)."""
        if self._server is not None:
            self._server.server_close()
            self._server = None

    def start(self) -> None:
        """Serve wants on the socket bind() opened."""
        assert self._server is not None, "bind() first"
        self._started = True
        threading.Thread(target=self._server.serve_forever, name="broker-listener",
                         daemon=True).start()
        self._clock.start()
        log.info("broker on tcp port %d", self._server.server_address[1])

    def want(self, want: Want, reply: Reply, link: int) -> None:
        with self._lock:
            self._wants[want.topic_uid].append(_Parked(want, reply, link,
                                                       self.services.clock()))
        self._kick(want.topic_uid)

    def grant(self, link: int, want_id: int) -> None:
        """The want's call lets this owner take for it (it offered): a round does, at once.
        A want answered meanwhile (its wait ended) is not there any more: nothing to do."""
        with self._lock:
            found = next((p for parked in self._wants.values() for p in parked
                          if p.link == link and p.want.id == want_id), None)
            if found is not None:
                found.granted = True
        if found is not None:
            self._kick(found.want.topic_uid)

    def woken(self, topic_uid: uuid.UUID) -> None:
        """A pointer of the topic due soon was written: waiting wants look again, and have
        the walk read the topic if it has not since."""
        with self._lock:
            self._woken_at[topic_uid] = self.services.clock()
            waiting = bool(self._wants.get(topic_uid))
        if waiting:
            self._kick(topic_uid)

    def hold(self, topic: Topic, found: list[Due]) -> None:
        """What the walk read of the topic: waiting messages, handed out from here (those
        held already are not read again: holding). A webhook topic's round comes when the
        first of them comes due (at once for one found late)."""
        if not found:
            return
        with self._lock:
            held = self.held.setdefault(topic.uid, HeldMessages(topic.uid, topic.pushed))
            for d in found:
                held.add(pointer_key(topic.uid, d.pointer.id, d.pointer.version), d)
            waiting = bool(self._wants.get(topic.uid))
        if topic.pushed:
            first_ms = min(ready_ms(d.row) for d in found) - self.services.clock()
            self._check_at(time.monotonic() + max(0, first_ms) / 1000, topic.uid)
        elif waiting:
            self._kick(topic.uid)

    def room_freed(self, topic_uid: uuid.UUID) -> None:
        """The POST pool has room for the topic again: a round it stopped goes on."""
        with self._lock:
            starved = topic_uid in self._starved
            self._starved.discard(topic_uid)
        if starved:
            self._kick(topic_uid)

    def holding(self, topic_uid: uuid.UUID) -> Callable[[PointerKey], bool]:
        """Whether a pointer of the topic (by its pointer_key) is held here."""
        def holds(key: PointerKey) -> bool:
            held = self.held.get(topic_uid)
            return held is not None and key in held
        return holds

    def held_of(self, topic_uid: uuid.UUID) -> list[Due]:
        """The messages of the topic held now, a snapshot."""
        with self._lock:
            held = self.held.get(topic_uid)
            return [d for _, d in held.items()] if held is not None else []

    def room(self, topic_uid: uuid.UUID) -> int:
        """How many more messages of the topic the walk may hold here."""
        return HELD_MAX - len(self.held.get(topic_uid, ()))

    def full_lanes(self, topic_uid: uuid.UUID) -> frozenset[tuple[int, int]]:
        """The (shard, lane)s of the topic of which HELD_PER_LANE or more are held."""
        with self._lock:
            held = self.held.get(topic_uid)
            if held is None:
                return frozenset()
            return frozenset(lane for lane, n in held.lanes.items() if n >= HELD_PER_LANE)

    def held_pointers(self) -> list[tuple[uuid.UUID, int, int]]:
        """(topic uid, shard, due ms) of the earliest message held of each shard: no cursor
        may pass one."""
        with self._lock:
            return [(uid, shard, due) for uid, held in self.held.items()
                    for shard, due in held.earliest().items()]

    def withdraw(self, link: int, want_id: int) -> None:
        """The want's call got its answer elsewhere or left: if it still waits here, it is
        answered with nothing now (what a round under way leases for it is given back)."""
        found: _Parked | None = None
        with self._lock:
            for uid, waiting in self._wants.items():
                found = next((p for p in waiting if p.link == link and p.want.id == want_id),
                             None)
                if found is not None:
                    waiting.remove(found)
                    if not waiting:
                        del self._wants[uid]
                    break
        if found is not None:
            self._hand(found, broker_wire.encode_got(want_id, []), None, [])

    def forget_link(self, link: int) -> None:
        """The connection closed: its wants have nobody to answer."""
        with self._lock:
            for uid, parked in list(self._wants.items()):
                left = [p for p in parked if p.link != link]
                if left:
                    self._wants[uid] = left
                else:
                    del self._wants[uid]

    def _kick(self, topic_uid: uuid.UUID) -> None:
        """Serve the topic's wants on a broker thread; once at a time per topic, again at
        once when wants came meanwhile."""
        if self._stopping.is_set():
            return
        with self._lock:
            if topic_uid in self._serving:
                self._again.add(topic_uid)
                return
            self._serving.add(topic_uid)
        try:
            self._pool.submit(self._serve_loop, topic_uid)
        except RuntimeError:  # shut down by stop()
            with self._lock:
                self._serving.discard(topic_uid)

    def _serve_loop(self, topic_uid: uuid.UUID) -> None:
        while True:
            try:
                self._serve(topic_uid)
            except Exception:
                log.exception("serving the wants of topic %s failed", topic_uid)
                self._check_at(time.monotonic() + self.recheck_s, topic_uid)
            with self._lock:
                if topic_uid in self._again and not self._stopping.is_set():
                    self._again.discard(topic_uid)
                    continue
                self._serving.discard(topic_uid)
                return

    def _serve(self, topic_uid: uuid.UUID) -> None:
        """One round for the topic's wants, in their arrival order: each is tried at least
        once (a want with no wait gets this round's answer), and answered once it got
        messages or its wait is over. A webhook topic's round is its POST pool's (_push)."""
        topic = self.topic_of(topic_uid)
        if topic is not None and topic.pushed:
            self._push(topic)
            return
        with self._lock:
            parked = list(self._wants.get(topic_uid, []))
        if not parked:
            return
        topic = topic or self._read_topic(topic_uid, parked[0].want)
        if topic is None:  # made a moment ago: its wants wait while the releaser learns it
            self._answer(None, topic_uid, parked, {}, None, UNKNOWN_RECHECK_S)
            return
        shards = self.shards_of(topic) if not topic.pushed else set()
        if not shards:  # not ours (any more): the API process asks the owners it reads next
            self._answer(topic, topic_uid, parked, {}, None, 0.0, final=True)
            return
        self.rounds += 1
        with self._lock:
            serving = [p for p in parked if p.granted]
        answers, next_ms, capped = (self._lease(topic, shards, serving) if serving
                                    else ({}, None, False))
        left = self._answer(topic, topic_uid, parked, answers, next_ms, self.recheck_s)
        self._negotiate(topic, shards, left)
        if capped:  # the wants left are served by the next round, at once
            with self._lock:
                self._again.add(topic_uid)

    def _negotiate(self, topic: Topic, shards: set[int], left: list[_Parked]) -> None:
        """For the wants left waiting whose calls asked other owners too: a granted one this
        round found nothing for gives its grant back (*pass*), and while messages held here
        are due, each one not granted offers to take (*offer*), once until it hears back.
        So one owner at a time takes for a call, and nothing is taken for it that would
        only go back."""
        shared = [p for p in left if p.want.several]
        if not shared:
            return
        due = bool(self._firsts(topic, shards, self.services.clock(), 1,
                                _sorter(self.services, topic))["hand"])
        lines: list[tuple[_Parked, bytes]] = []
        with self._lock:
            for p in shared:
                if p.granted and not due:
                    p.granted = p.offered = False
                    lines.append((p, broker_wire.encode_pass(p.want.id)))
                elif due and not p.granted and not p.offered:
                    p.offered = True
                    lines.append((p, broker_wire.encode_offer(p.want.id)))
        for p, line in lines:
            p.reply(line)  # not sent: the link closed, and its wants are forgotten

    def _push(self, topic: Topic) -> None:
        """One round of a webhook topic: what is due now, in fair order, up to the POST
        pool's room for the topic and PUSH_ROUND_MAX, taken and POSTed at once there; due
        messages whose attempts are used up made dead, a paused campaign's let go (resuming
        brings them back). What a take left undecided stays held for the next round."""
        pool = self.push
        if pool is None:
            return
        self.rounds += 1
        now = self.services.clock()
        shards = self.shards_of(topic)
        with self._lock:
            held = self._owned(topic.uid, shards)
            ready = held.ready_by(now) if held else []
        sort = _sorter(self.services, topic)
        found: dict[str, list[Due]] = defaultdict(list)
        for d in ready:  # a lease still running is never taken over, however soon it ends
            if is_live(d.pointer, d.row, now) and not pool.settling(d.row):
                found[sort(d)].append(d)
        room = pool.room(topic.uid)
        hand = fair_first(found["hand"], min(room, PUSH_ROUND_MAX))
        chunk = hand + found["end"][:PUSH_ROUND_MAX]
        if found["pass"]:
            self.services.scanner.spend(topic, [d.pointer for d in found["pass"]])
            self._drop(topic.uid, found["pass"])
        undecided = False
        if chunk:
            pool.take(topic, chunk)
            spent = self.services.scanner.spent
            decided = [d for d in chunk
                       if pointer_key(topic.uid, d.pointer.id, d.pointer.version) in spent]
            self._drop(topic.uid, decided)
            undecided = len(decided) < len(chunk)  # tried again next round
        left = len(found["hand"]) > len(hand)
        starved = left and len(hand) >= room
        if starved:  # room_freed starts the next round, or this one if it freed meanwhile
            with self._lock:
                self._starved.add(topic.uid)
        more = len(found["end"]) > PUSH_ROUND_MAX or (left and not starved) or (
            starved and pool.room(topic.uid) > 0)
        with self._lock:
            if more:
                self._again.add(topic.uid)
            held = self.held.get(topic.uid)
            next_ms = held.next_moment(now) if held is not None else None
        if undecided:  # a node that refused the take is not asked again at once
            next_ms = now + UNDECIDED_RETRY_MS
        if next_ms is not None and not more:
            self._check_at(time.monotonic() + (next_ms - self.services.clock()) / 1000,
                           topic.uid)

    def _read_topic(self, topic_uid: uuid.UUID, want: Want) -> Topic | None:
        """A topic this releaser does not know yet (made a moment ago), read by the tenant
        and name its want carries; the releaser is told to follow the changes. None when it
        is not there (or is another incarnation)."""
        self.on_unknown(topic_uid)
        if not want.name:
            return None
        found = self.services.topics.get(want.tenant, want.name)
        return found if found is not None and found.uid == topic_uid else None

    def _answer(self, topic: Topic | None, topic_uid: uuid.UUID, parked: list[_Parked],
                answers: dict[int, list[Taken]], next_ms: int | None, recheck_s: float,
                final: bool = False) -> list[_Parked]:
        """Send the answers of the wants that got messages, whose wait is over, or all
        (`final`); what was leased for a want withdrawn or closed meanwhile is given back.
        The others wait for their next check: within recheck_s, their earliest deadline, or
        the next moment a message held may be taken (next_ms, epoch ms:
        HeldMessages.next_moment). Returns the wants left waiting."""
        now_s = time.monotonic()
        now_ms = self.services.clock()
        answering = [p for p in parked
                     if final or answers.get(id(p.want)) or p.deadline <= now_s]
        answered, left = self._take_out(topic_uid, answering)
        gone = [t for p in answering if not any(p is a for a in answered)
                for t in answers.get(id(p.want), [])]
        if gone and topic is not None:
            self._give_back(topic, gone)
        for p in answered:
            taken = answers.get(id(p.want), [])
            self._hand(p, broker_wire.encode_got(p.want.id, taken), topic, taken)
        if not left:
            return left
        when = min([p.deadline for p in left] + [now_s + recheck_s])
        if next_ms is not None:
            when = min(when, now_s + (next_ms - now_ms) / 1000)
        self._check_at(when, topic_uid)
        return left

    def _hand(self, parked: _Parked, line: bytes, topic: Topic | None,
              taken: list[Taken]) -> None:
        """Send a want's answer (its connection's outbox sends it: no round waits on an API
        process); what it carried goes back at once if it is not sent whole (the API process
        closed the connection, died, or stopped reading), not when those leases run out."""
        if not taken or topic is None:
            parked.reply(line)
            return

        def unsent() -> None:
            log.warning("broker: the connection of a want closed; %d messages leased for it "
                        "go back", len(taken))
            with contextlib.suppress(RuntimeError):  # stopping: their leases run out
                self._giving_back.submit(self._give_back, topic, taken)

        parked.reply(line, unsent)

    def _take_out(self, topic_uid: uuid.UUID, answering: list[_Parked]
                  ) -> tuple[list[_Parked], list[_Parked]]:
        """Take the wants about to be answered out of the topic's waiting ones: those still
        there (not withdrawn, their link open), and the topic's wants left waiting."""
        with self._lock:
            waiting = self._wants.get(topic_uid, [])
            present = [p for p in answering if any(p is w for w in waiting)]
            left = [w for w in waiting if not any(w is p for p in answering)]
            if left:
                self._wants[topic_uid] = left
            else:
                self._wants.pop(topic_uid, None)
        return present, left

    def _give_back(self, topic: Topic, taken: list[Taken]) -> None:
        """Messages leased for a want that has gone: due again now, the attempt not
        counted (app.delivery.leasing.give_back, which logs a failure: their leases run
        out), and held here again at once: the next round hands them out, not the one after
        the walk has read them again."""
        again = give_back(self.services, topic, taken)
        shards = self.shards_of(topic)
        self.hold(topic, [Due(pointer_of(r), r) for r in again if r.shard in shards])

    def _lease(self, topic: Topic, shards: set[int], parked: list[_Parked]
               ) -> tuple[dict[int, list[Taken]], int | None, bool]:
        """Lease held messages of these shards due now for the wants, in fair order, in
        arrival order of the wants, at most ROUND_MAX in all. Besides, up to ROUND_MAX due
        whose attempts are used up are made dead. Returns {id(want): taken}; the next moment
        one held may be taken (epoch ms, HeldMessages.next_moment); and whether the wants
        left are to be served again at once (the cap cut the round short, or messages it
        took for them had been moved or cancelled meanwhile)."""
        services = self.services
        wants = [p.want for p in parked]
        wanted = sum(w.n for w in wants)
        total = min(wanted, ROUND_MAX)
        now = services.clock()
        sort = _sorter(services, topic)
        self.read_now(topic, self._read_since(topic, shards, parked, total, now, sort))
        now = services.clock()
        found = self._firsts(topic, shards, now, total, sort)
        # a message whose attempts are used up is made dead by the take, never handed out:
        # it takes no want's room, or expired last attempts ahead of it in fair order would
        # be ended only n per round while the messages behind them wait
        ending = found["end"][:ROUND_MAX]
        chunk, owners = _share(fair_first(found["hand"], total), [w.n for w in wants], total)
        if found["pass"]:  # resuming brings them back (app.campaigns.operations)
            services.scanner.spend(topic, [d.pointer for d in found["pass"]])
            self._drop(topic.uid, found["pass"])
        holds = [Hold(wants[o].lease_s, wants[o].consumer) for o in owners]
        by_id = {d.row.id: (d, o) for d, o in zip(chunk, owners, strict=True)}
        chunk = chunk + ending
        holds += [Hold(0, None)] * len(ending)
        taken = take_with_payloads(services, topic, chunk, now, holds) if chunk else []
        # a pointer whose take was decided (leased, lost to another writer, made dead) is
        # spent; one undecided (a write failed) stays held for the next round
        spent = services.scanner.spent
        decided = [d for d in chunk
                   if pointer_key(topic.uid, d.pointer.id, d.pointer.version) in spent]
        self._drop(topic.uid, decided)
        # messages that lost to another writer (moved, cancelled: what is held may be stale)
        # leave wants unserved: the next round, at once, takes the next ones, or a backlog
        # of stale messages would cost a want one idle period each
        handed = {d.row.id for d in chunk[:len(owners)]}
        lost = bool({d.row.id for d in decided if d.row.id in handed}
                    - {row.id for row, _ in taken})
        answers: dict[int, list[Taken]] = defaultdict(list)
        for row, payload in taken:
            d, o = by_id[row.id]
            if payload is None:  # it comes due again when its lease runs out
                log.warning("broker: message %s of topic %s leased without its payload",
                            row.id, topic.uid)
                continue
            answers[id(wants[o])].append(
                Taken(d.row.attempts, d.row.consumer, row, payload, d.row.due_at_ms))
        # the wants left look again when a message held may next be taken
        with self._lock:
            held_now = self.held.get(topic.uid)
            next_ms = held_now.next_moment(now) if held_now is not None else None
        return answers, next_ms, (len(owners) == total < wanted or len(ending) == ROUND_MAX
                                  or lost)

    def _read_since(self, topic: Topic, shards: set[int], parked: list[_Parked], wanted: int,
                    now: int, sort: Callable[[Due], str]) -> int:
        """Since when (epoch ms) a round's writes must have been read before it hands out:
        while what is held and due covers what the wants ask, only the writes it may not
        have read (a want's own process wrote the topic, or a due wake-up came, after its
        read began); otherwise everything written before the newest want came, so that a
        round hands out in fair order what is due, not only what the walk had read. A read
        on every round cost each one-message lease a count read."""
        live = len(self._firsts(topic, shards, now, wanted, sort)["hand"])
        with self._lock:
            woken = self._woken_at.get(topic.uid, 0)
        if live >= wanted:
            return max([p.want.written_ms for p in parked] + [woken])
        return max([p.arrived_ms for p in parked] + [woken])

    def _firsts(self, topic: Topic, shards: set[int], now_ms: int, n: int,
                sort: Callable[[Due], str]) -> dict[str, list[Due]]:
        """HeldMessages.firsts of the topic's messages held of the shards in `shards`."""
        with self._lock:
            held = self._owned(topic.uid, shards)
            return held.firsts(now_ms, n, sort) if held else defaultdict(list)

    def _owned(self, topic_uid: uuid.UUID, shards: set[int]) -> HeldMessages | None:
        """The messages held of the topic, once those of other shards (their slots moved, or
        their validity lapsed a moment) are let go, and the walk reads them again: a new
        owner's walk from the cursors, which never passed a message held here; this
        releaser's own walk from its position otherwise, which has passed them when the
        slots stay or come back before one of its steps saw them go (its steps fail while a
        node restarts, and a round needs no read first). The caller holds the lock."""
        held = self.held.get(topic_uid)
        if not held:
            return None
        if not held.shards() <= shards:
            gone = [(k, d) for k, d in held.items() if d.pointer.shard not in shards]
            log.info("broker: %d messages held of topic %s are of shards not owned now; "
                     "the walk reads them again", len(gone), topic_uid)
            self.read_again(topic_uid, [d.pointer for _, d in gone])
            for key, _ in gone:
                held.remove(key)
        return held

    def _drop(self, topic_uid: uuid.UUID, done: list[Due]) -> None:
        with self._lock:
            held = self.held.get(topic_uid)
            if held is None:
                return
            for d in done:
                held.remove(pointer_key(topic_uid, d.pointer.id, d.pointer.version))
            if not held:
                del self.held[topic_uid]

    def forget(self, topic_uid: uuid.UUID) -> None:
        """A deleted topic: what is held of it goes."""
        with self._lock:
            self.held.pop(topic_uid, None)
            self._woken_at.pop(topic_uid, None)
            self._check_due.pop(topic_uid, None)

    def _check_at(self, when_s: float, topic_uid: uuid.UUID) -> None:
        """A round of the topic at when_s (monotonic s), unless a check of the topic comes
        before (its round sets the next one). One whose time has passed and that the clock
        thread has not run yet still comes before: replaced, it would not run at all."""
        with self._lock:
            due = self._check_due.get(topic_uid)
            if due is not None and due <= when_s:
                return
            self._check_due[topic_uid] = when_s
        self._at(when_s, lambda: self._kick_waiting(topic_uid, when_s))

    def _kick_waiting(self, topic_uid: uuid.UUID, when_s: float) -> None:
        """A check at when_s: a round of the topic, unless an earlier check replaced this
        one."""
        with self._lock:
            if self._check_due.get(topic_uid) != when_s:
                return
            del self._check_due[topic_uid]
        self._kick(topic_uid)

    def _at(self, when_s: float, action: Callable[[], None]) -> None:
        """Run action on the clock thread at when_s (monotonic s), never before."""
        with self._checks_changed:
            heapq.heappush(self._checks, (when_s, next(self._seq), action))
            self._checks_changed.notify()

    def _clock_loop(self) -> None:
        """Run what is due on the clock: the next checks of parked and webhook topics (their
        earliest message held coming due, a want's deadline, or the idle period)."""
        while not self._stopping.is_set():
            due: list[Callable[[], None]] = []
            with self._checks_changed:
                now = time.monotonic()
                while self._checks and self._checks[0][0] <= now:
                    due.append(heapq.heappop(self._checks)[2])
                if not due:
                    wait = self._checks[0][0] - now if self._checks else self.recheck_s
                    self._checks_changed.wait(min(wait, self.recheck_s))
                    continue
            for action in due:
                try:
                    action()
                except Exception:
                    log.exception("broker clock action failed")

    def stop(self) -> None:
        """No new want is served; the parked ones are dropped (their callers' waits end).
        Nothing is held leased here: a take is answered as soon as it is written."""
        self._stopping.set()
        if self._server is not None:
            if self._started:  # serve_forever runs: shutdown() waits for it to end
                self._server.shutdown()
            self._server.close_all()
        with self._checks_changed:
            self._checks_changed.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._giving_back.shutdown(wait=False, cancel_futures=True)


def _share(ready: list[Due], rooms: Sequence[int], total: int) -> tuple[list[Due], list[int]]:
    """The prefix of `ready` the wants take, at most `total`, each message with the index of
    its want: the wants in arrival order, each filled up to its room."""
    chunk: list[Due] = []
    owners: list[int] = []
    room = list(rooms)
    which = 0
    for d in ready[:total]:
        while which < len(room) and room[which] == 0:
            which += 1
        if which == len(room):
            break
        chunk.append(d)
        owners.append(which)
        room[which] -= 1
    return chunk, owners


def _sorter(services: Services, topic: Topic) -> Callable[[Due], str]:
    """What a round does with a message it may take (HeldMessages.firsts): "pass" when its
    campaign is paused (let go: resuming brings it back), "end" when its attempts are used
    up (made dead), else "hand"."""
    paused = pauses(services, topic)

    def sort(d: Due) -> str:
        if paused(d.row):
            return "pass"
        return "end" if attempts_used_up(topic, d.row) else "hand"

    return sort
