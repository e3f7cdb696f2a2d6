"""Runs operations (of a campaign: cancel, shift, resume; of a filter: cancel, shift) in the
background, resumably.

A runner claims an unfinished operation whose lease has passed (LWT), then walks the
campaign index in id order, all its partitions at once (up to PER_SPREAD ids of each a page,
so a page holds the messages of a home together and they change in one Paxos round): it
applies the operation to the page (app.campaigns.operations.apply), then checkpoints the position
(the last id done) and the counts with an LWT that renews its lease. Memory is one page,
whatever the campaign's size. If the
runner dies, another claims the operation once the lease has passed and starts after the last
checkpoint; the page it repeats is changed at most once per message (last_op), and its counts
are those of the checkpoint plus the page's. A runner whose checkpoint fails has lost the
operation and stops at once.

A page's counter moves are written before its checkpoint, so the campaign counts cover every
checkpointed page exactly. Counter writes cannot be repeated safely, so the heir moves no
counter for a row the dead runner changed: the counts of a runner killed mid-page can be short
by the changes of that one page (at most PER_SPREAD * CAMPAIGN_SPREAD messages).

A filtered operation walks the search of its filter instead (app.store.search: ring order,
which never changes for a message), FILTER_PAGE matches a page. Before changing a page it
checkpoints the page's ids and the search position after it; a runner that takes over
applies that page again by id (a message the dead runner changed is counted by its last_op,
whatever state it is in now), so processed and changed end exact here too.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from app.campaigns import operations as campaign_ops
from app.errors import DuetimeError
from app.messages import filtered_apply, filtered_ops, search
from app.models import Topic
from app.services import Services
from app.store.operations import Operation
from app.store.search import SearchStore

PER_SPREAD = 250  # ids of each index partition a page reads: at most 8,000 ids a page
FILTER_PAGE = 1000  # matches of a filter a page reads
LEASE_MS = 10_000
log = logging.getLogger("duetime.operations")


class LostOperation(Exception):
    """Another runner took the operation over (this one's lease had passed)."""


class OperationRunner:
    """Runs pending operations one at a time. tick() runs every pending operation it can
    claim to its end (a releaser calls it on a thread of its own)."""

    def __init__(self, services: Services, member: str,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.services = services
        self.member = member
        self.stopping = stopping
        self._lock = threading.Lock()

    def tick(self) -> int:
        """Claim and run what is pending; returns how many operations it finished."""
        if not self._lock.acquire(blocking=False):
            return 0  # the previous tick is still running one
        try:
            finished = 0
            for topic_uid, op_id in self.services.operations.pending():
                if self.stopping():
                    break
                op = self.services.operations.get(topic_uid, op_id)
                if op is None or op.state != "running":
                    self.services.operations.unlist(op_id)
                elif op.lease_until < self.services.clock():
                    finished += self._claim_and_run(op)
            return finished
        finally:
            self._lock.release()

    def _claim_and_run(self, op: Operation) -> int:
        now = self.services.clock()
        if not self.services.operations.claim(op, self.member, now + LEASE_MS, now):
            return 0
        op = dataclasses.replace(op, owner=self.member)
        topic = self.services.topics.get(op.tenant, op.topic)
        if topic is None or topic.uid != op.topic_uid:
            return int(self.services.operations.finish(op, "failed", "the topic was deleted",
                                                       now))
        try:
            return int(self.run(topic, op))
        except LostOperation:
            log.warning("operation %s was taken over by another runner", op.id)
        except DuetimeError as exc:  # Cassandra unavailable: the next tick resumes it
            log.warning("operation %s paused: %s", op.id, exc.detail)
        return 0

    def run(self, topic: Topic, op: Operation) -> bool:
        """Run a claimed operation from its checkpoint to its end (False: stopped early); its
        counter moves are written before it ends as succeeded."""
        wait_ms = op.not_before - self.services.clock()
        if wait_ms > 0:  # every process has seen the campaign's mark by then
            time.sleep(wait_ms / 1000)
        while not op.walked or op.page_ids is not None:
            if self.stopping():
                return False
            op = self._page(topic, op) if op.filter is None else self._filtered_page(topic, op)
        now = self.services.clock()
        if op.campaign is not None and op.filter is None:
            self.services.campaigns.end_op(topic.uid, op.campaign, op.id, op.new_gen, now)
            self.services.campaign_rules.forget(topic.uid)
        finished = self.services.operations.finish(op, "succeeded", None, now)
        log.info("operation %s (%s of %s) finished: %d processed, %d changed", op.id,
                 op.kind, op.filter or f"campaign {op.campaign}", op.processed, op.changed)
        return finished

    def _checkpoint(self, op: Operation) -> None:
        if not self.services.operations.checkpoint(op, self.services.clock() + LEASE_MS):
            raise LostOperation(str(op.id))

    def _filtered_page(self, topic: Topic, op: Operation) -> Operation:
        """One page of the filter's search: its ids checkpointed, then applied and
        checkpointed with its counts; the operation as it is after it."""
        assert op.filter is not None
        flt = filtered_ops.message_filter(op.filter)
        if op.page_ids is None:
            bound = search.fingerprint(topic.uid, flt)
            after = search.decode_token(op.after_id, bound) if op.after_id else None
            found = SearchStore(self.services.db).find(topic.uid, flt, FILTER_PAGE, after)
            rows = [r for r in found.rows if flt.matches(r)]
            op = dataclasses.replace(
                op, page_ids=tuple(r.id for r in rows), walked=found.position is None,
                after_id="" if found.position is None
                else search.encode_token(found.position, bound))
            self._checkpoint(op)  # the page is written down before any of it changes
        else:  # the page a runner before this one was applying
            rows = list(self.services.messages.get_many(topic.uid, op.page_ids).values())
        done = filtered_apply.apply(self.services, topic, op, flt, rows)
        op = dataclasses.replace(
            op, processed=op.processed + len(op.page_ids or ()),
            changed=op.changed + done.changed, delivering=op.delivering + done.delivering,
            page_ids=None)
        self.services.counts.flush()  # the checkpoint must not claim moves not yet written
        self._checkpoint(op)
        return op

    def _page(self, topic: Topic, op: Operation) -> Operation:
        """One page of the index applied and checkpointed; the operation as it is after it."""
        assert op.campaign is not None
        ids, finished = self.services.campaigns.members_after(topic.uid, op.campaign,
                                                              op.after_id, PER_SPREAD)
        if ids:
            done = campaign_ops.apply(self.services, topic, op, ids)
            if op.new_gen is not None and done.span is not None:
                self.services.campaigns.widen(topic.uid, {(op.campaign, op.new_gen): done.span})
            op = dataclasses.replace(
                op, processed=op.processed + len(ids), changed=op.changed + done.changed,
                delivering=op.delivering + done.delivering, after_id=ids[-1])
        if finished:
            op = dataclasses.replace(op, walked=True)
        self.services.counts.flush()  # the checkpoint must not claim moves not yet written
        self._checkpoint(op)
        return op
