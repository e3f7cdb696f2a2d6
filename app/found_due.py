"""Due messages a pull lease pass found and did not take, kept for the next passes of this
process: a call for one message then costs the take (a pointer and one conditional write),
not a read of cursors, partitions, pointers and rows first.

What is kept is a list of app.scan.Due in the order the pass would have leased them
(priority, fairness, due time), for at most KEEP_MS after the timeline read that found them;
of a read cut short, only as far as a fresh read would hand them out first
(app.fairness.known_turns_end).
A pass leases from it first and reads the timeline only when it could not fill its calls
from it, so a call answered with fewer messages than it wanted has had a fresh read. Every
take is a conditional write on the row's version (app.leasing.take): a kept message that was
cancelled, moved or leased by another process meanwhile loses that write and is never handed
out; and the processes of one host, which take turns per topic (app.host_locks) and so keep
the same messages, tell each other what they took (app.taken_log): a pass first drops from
its list what the others took since its last one. What the list cannot know is a message
that came due after the read: it waits for the next read, at most KEEP_MS later. So this
process drops a topic's list when it writes a pointer due before the list could expire (an
enqueue, a nack, a lease given back), and a message of higher priority put on the timeline
by another process may be handed out up to KEEP_MS after kept messages of lower priority.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable

from app.scan import Due
from app.taken_log import TakenLog

KEEP_MS = 200
MAX_KEPT = 1000  # per topic: a pass never finds more than it can lease in a few rounds
MAX_TOPICS = 100_000  # topics whose latest pointer write is remembered
MAX_LISTS = 1000  # topics with a list kept; lists expire unread when no call comes back


@dataclasses.dataclass(frozen=True)
class Found:
    """What a timeline read found due: when the read started (epoch ms), the placement mark
    taken before it (FoundDue.mark) and the messages, in leasing order."""

    read_at_ms: int
    mark: int
    due: list[Due]


class FoundDue:
    """Thread-safe; one per process. Times are epoch ms of the process clock."""

    def __init__(self, clock: Callable[[], int], keep_ms: int = KEEP_MS,
                 shared: TakenLog | None = None) -> None:
        self.clock = clock
        self.keep_ms = keep_ms
        self.shared = shared
        self._kept: dict[uuid.UUID, Found] = {}
        self._placements = 0  # pointer writes heard of, of any topic
        self._last_placed: dict[uuid.UUID, int] = {}  # topic: its latest such write
        self._forgot_at = 0  # _last_placed was emptied after this many
        self._lock = threading.Lock()

    def mark(self) -> int:
        """Take before a timeline read; give to keep() with what it found."""
        with self._lock:
            return self._placements

    def keep(self, topic_uid: uuid.UUID, found: Found) -> None:
        """Keep what a pass found due and left untaken (replacing what was kept of the
        topic), unless this process wrote a pointer of the topic since found.mark or the
        read is too old. Only messages due by the read are kept."""
        due = [d for d in found.due if d.row.due_at_ms <= found.read_at_ms][:MAX_KEPT]
        with self._lock:
            placed_since = (self._last_placed.get(topic_uid, -1) > found.mark
                            or self._forgot_at > found.mark)
            self._kept.pop(topic_uid, None)  # so the dict's order is the order of keeping
            if due and not placed_since and self.clock() - found.read_at_ms < self.keep_ms:
                self._kept[topic_uid] = Found(found.read_at_ms, found.mark, due)
                while len(self._kept) > MAX_LISTS:  # the oldest first: topics no call came back to
                    del self._kept[next(iter(self._kept))]

    def take(self, topic_uid: uuid.UUID) -> Found | None:
        """What is kept of the topic, no longer kept; None when nothing is or it is older
        than keep_ms."""
        with self._lock:
            found = self._kept.pop(topic_uid, None)
        if found is None or self.clock() - found.read_at_ms >= self.keep_ms:
            return None
        return found

    def catch_up(self, topic_uid: uuid.UUID) -> None:
        """At the start of a pass, under the topic's host lock: what this host's other
        processes took since this one's last pass leaves the topic's list (all of it, when
        that is not known). With no list kept there is nothing to read: a list this pass
        keeps comes from its own read, which saw every take before it."""
        with self._lock:
            if self.shared is None or topic_uid not in self._kept:
                return
        elsewhere = self.shared.taken_elsewhere(topic_uid)
        with self._lock:
            found = self._kept.get(topic_uid)
            if found is None:
                return
            if elsewhere is None:
                del self._kept[topic_uid]
            elif elsewhere:
                self._kept[topic_uid] = dataclasses.replace(
                    found, due=[d for d in found.due if d.row.id not in elsewhere])

    def took(self, topic_uid: uuid.UUID, message_ids: list[str]) -> None:
        """At the end of a pass, under the topic's host lock: tell this host's other
        processes what it leased. A pass that leased nothing (an idle long poll's) touches
        no file once this process follows the topic's."""
        if self.shared is None:
            return
        if message_ids:
            self.shared.record(topic_uid, message_ids)
        else:
            self.shared.follow(topic_uid)

    def placed(self, topic_uid: uuid.UUID, earliest_due_ms: int) -> None:
        """Pointers of the topic were written, the earliest due at earliest_due_ms: when that
        is before a list could expire, the topic's list is dropped and no pass that read the
        timeline before now keeps one, so the next pass reads it again."""
        if earliest_due_ms >= self.clock() + self.keep_ms:
            return
        with self._lock:
            self._placements += 1
            if len(self._last_placed) >= MAX_TOPICS:
                self._last_placed.clear()
                self._forgot_at = self._placements
            self._last_placed[topic_uid] = self._placements
            self._kept.pop(topic_uid, None)
