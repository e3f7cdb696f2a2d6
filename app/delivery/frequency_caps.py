"""Frequency caps at the hand-out: at most `max` messages per recipient per local day or
rolling window, exact across every process (docs/design.md, "Frequency caps").

The take (app.delivery.leasing.take, for pull and push alike) asks admit() which of the
messages it is about to lease may go: each capped one claims a slot of its recipient
(app.store.frequency_caps, one LWT) before the take's own LWT, and one with no slot free is
deferred to the recipient's next allowed moment (through its send window) or dropped
(cancelled, reason `frequency_capped`). settle() gives back the slots of claimed messages
whose take did not apply and counts deferrals and drops. A nack, a failed POST and a
give-back free the message's slot (give_back()); an expired lease does not. A topic without
a cap, and a message without recipient or exempt, costs no read and no write. Times are
epoch ms.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Sequence

from app.core.frequency_cap import DEFERRED, DROPPED, FrequencyCap
from app.core.timeparse import zone
from app.messages.send_windows import place_row
from app.messages.transitions import Move, count_moves, move_many
from app.messages.zones import zone_of
from app.models import MessageState, Topic
from app.services import Services
from app.store.frequency_caps import Claim, Slot

CLAIM_GRACE_MS = 10_000  # a claim's take, LWT timeouts included, is decided within this
CLAIM_TRIES = 8  # claims of one message that may lose to other processes' in one take
RETRY_MS = 1_000  # a message not decided this take (contention, an error) is due again then
REASON = "frequency_capped"
log = logging.getLogger("duetime.frequency_caps")


@dataclasses.dataclass
class Admission:
    """What admit() decided for the messages of one take, by id: claimed (the recipient
    and the slot claimed, given back if the take does not apply), capped (the row moved
    or cancelled in the take's place) and later (not decided now: left for a next take)."""

    claimed: dict[str, tuple[str, Slot]] = dataclasses.field(default_factory=dict)
    capped: dict[str, MessageState] = dataclasses.field(default_factory=dict)
    later: set[str] = dataclasses.field(default_factory=set)
    deferred: set[str] = dataclasses.field(default_factory=set)  # to a window's end

    def goes(self, message_id: str) -> bool:
        """Whether the take may lease it."""
        return message_id not in self.capped and message_id not in self.later


def cap_of(topic: Topic) -> FrequencyCap | None:
    """The topic's cap, or None."""
    text = topic.settings.frequency_cap
    return None if text is None else FrequencyCap.from_text(text)


def counted(topic: Topic, row: MessageState) -> bool:
    """Whether the topic's cap counts this message: it has a recipient, is not exempt."""
    return bool(topic.settings.frequency_cap and row.recipient and not row.cap_exempt)


def admit(services: Services, topic: Topic, rows: Sequence[MessageState],
          now: int) -> Admission:
    """Decide, in the order given (the take's fair order), which rows may be leased now.
    No read and no write when none is counted."""
    admission = Admission()
    cap = cap_of(topic)
    mine = [r for r in rows if counted(topic, r)]
    if cap is None or not mine:
        return admission
    per: dict[str, list[MessageState]] = collections.defaultdict(list)
    for r in mine:
        per[r.recipient or ""].append(r)
    try:
        slots = services.caps.read_many(topic.uid, list(per))
    except Exception:
        log.warning("cap slots of topic %s not read", topic.uid, exc_info=True)
        admission.later.update(r.id for r in mine)
        return admission
    for recipient, its in per.items():
        for row in its:
            try:
                _admit_one(services, topic, cap, recipient, slots[recipient], row, now,
                           admission)
            except Exception:
                log.warning("cap of message %s not decided", row.id, exc_info=True)
                admission.later.add(row.id)
    _widen(services, topic, admission)
    return admission


def _widen(services: Services, topic: Topic, admission: Admission) -> None:
    """Before the deferrals are written: widen their campaigns' bounds to the new
    deliver_at, so a campaign shift or cancel covers them (bounds may end wider than the
    messages). If that fails they are not deferred this take (left for a next one)."""
    deferred = [r for i, r in admission.capped.items()
                if i in admission.deferred and r.campaign]
    if not deferred:
        return
    from app.campaigns.manage import widen_to_cover  # which imports this module

    try:
        widen_to_cover(services, topic, deferred)
    except Exception:
        log.warning("bounds of campaigns of %d deferred messages of topic %s not widened",
                    len(deferred), topic.uid, exc_info=True)
        for r in deferred:
            del admission.capped[r.id]
            admission.deferred.discard(r.id)
            admission.later.add(r.id)


def _admit_one(services: Services, topic: Topic, cap: FrequencyCap, recipient: str,
               slots: dict[int, Slot], row: MessageState, now: int,
               admission: Admission) -> None:
    """Claim a slot for row (or use the one it holds: a lease that ran out, taken again),
    else cap it. `slots` (as read) is updated with what this does."""
    claim = Claim(row.id, cap.window_end(zone(zone_of(topic.settings, row)), now), now,
                  row.version, row.attempts)
    own = next((s for s in slots.values() if s.message_id == row.id and s.live(now)), None)
    if own is not None:
        if row.attempts > own.attempts:  # handed out under it: a lease ran out, taken again
            return
        # its take under that claim never applied (a process died, a write undecided):
        # claimed over again, so that a reclaimer's fence and this take meet at the slot
        if services.caps.claim(topic.uid, recipient, own.slot, claim, own):
            slots[own.slot] = Slot(own.slot, claim.message_id, claim.window_end_ms,
                                   claim.claimed_at_ms, claim.version, claim.attempts)
            admission.claimed[row.id] = (recipient, slots[own.slot])
            return
        slots.clear()
        slots.update(services.caps.read_many(topic.uid, [recipient])[recipient])
    for _ in range(CLAIM_TRIES):
        free = _free(cap, slots, now) or _reclaimable(services, topic, cap, recipient,
                                                      slots, now, admission)
        if free is None:
            _cap(topic, cap, row, _next_moment(services, topic, cap, slots, now, admission),
                 now, admission)
            return
        index, over = free
        if services.caps.claim(topic.uid, recipient, index, claim, over):
            slots[index] = Slot(index, claim.message_id, claim.window_end_ms,
                                claim.claimed_at_ms, claim.version, claim.attempts)
            admission.claimed[row.id] = (recipient, slots[index])
            return
        slots.clear()
        slots.update(services.caps.read_many(topic.uid, [recipient])[recipient])
    admission.later.add(row.id)


def _live(slots: dict[int, Slot], now: int) -> list[Slot]:
    """The slots that count now, in slot order: those below max and any at or past it, left
    by a max since lowered (they count until their windows end; they are never claimed)."""
    return [slots[i] for i in sorted(slots) if slots[i].live(now)]


def _free(cap: FrequencyCap, slots: dict[int, Slot], now: int
          ) -> tuple[int, Slot | None] | None:
    """The first slot below max that is free (never used: None, run out or given back),
    when fewer than max slots count."""
    if len(_live(slots, now)) >= cap.max:
        return None
    for index in range(cap.max):
        found = slots.get(index)
        if found is None or not found.live(now):
            return index, found
    return None


def _settled(services: Services, topic: Topic, s: Slot, admission: Admission) -> bool:
    """Whether the slot's message is known handed out under its claim (or is being so by
    this take, which claimed it)."""
    return ((topic.uid, s.message_id, s.claimed_at_ms) in services.caps.handed_out
            or admission.claimed.get(s.message_id, ("", None))[1] == s)


def _reclaimable(services: Services, topic: Topic, cap: FrequencyCap, recipient: str,
                 slots: dict[int, Slot], now: int, admission: Admission
                 ) -> tuple[int, Slot | None] | None:
    """A slot held by a claim whose message was not handed out under it (its releaser died
    between claim and take), made free to claim over: its holder read at SERIAL; one still
    as at its claim past CLAIM_GRACE_MS is fenced first (moved due now, so that no take of
    the version it claimed with can apply). Such a slot at or past max (a max since
    lowered) is given back instead, and a slot below max then free is returned. None when
    every slot counting was used."""
    for s in _live(slots, now):
        if _settled(services, topic, s, admission):
            continue
        holder = services.messages.get(topic.uid, s.message_id, serial=True)
        # no row (expired with its retention, within a long window) or one made again
        # since the claim: nothing says it was not handed out, so the slot counts
        if (holder is None or holder.created_at_ms > s.claimed_at_ms
                or holder.attempts > s.attempts):
            services.caps.handed_out.add((topic.uid, s.message_id, s.claimed_at_ms))
            continue
        # a version moved: its take can no longer apply, it was never handed out
        if not (holder.version != s.version
                or (s.claimed_at_ms + CLAIM_GRACE_MS <= now
                    and _fence(services, topic, holder, s, now))):
            continue
        if s.slot < cap.max:
            return s.slot, s
        if services.caps.give_back(topic.uid, [(recipient, s)])[0]:
            slots[s.slot] = dataclasses.replace(s, window_end_ms=0)
            free = _free(cap, slots, now)
            if free is not None:
                return free
    return None


def _fence(services: Services, topic: Topic, holder: MessageState, s: Slot,
           now: int) -> bool:
    """Move a holder whose take may still be in flight to due now, at the next version, so
    that take can never apply; True when it applied, or the row moved meanwhile without
    being handed out (the caller's claim over the slot decides); False when it was handed
    out meanwhile (its slot counts)."""
    moved = dataclasses.replace(holder, state="scheduled", version=holder.version + 1,
                                due_at_ms=now, lease_token=None, lease_expires_at_ms=None,
                                updated_at_ms=now)
    if move_many(services, topic, [moved], now, {holder.id: holder}):
        count_moves(services, topic, [(holder.state, "scheduled", holder.campaign)])
        return True
    again = services.messages.get(topic.uid, holder.id, serial=True)
    if again is None or again.attempts > holder.attempts:
        services.caps.handed_out.add((topic.uid, s.message_id, s.claimed_at_ms))
        return False
    return again.version != holder.version


def _next_moment(services: Services, topic: Topic, cap: FrequencyCap,
                 slots: dict[int, Slot], now: int, admission: Admission) -> tuple[int, bool]:
    """When a slot may next be free (when enough of the slots counting end that fewer
    than max count), and whether that is a window's end (True) or only the end of a
    claim's grace, whose take is still undecided (False)."""
    ends = []
    for s in _live(slots, now):
        if (_settled(services, topic, s, admission)
                or s.claimed_at_ms + CLAIM_GRACE_MS >= s.window_end_ms):
            ends.append((s.window_end_ms, True))
        else:
            ends.append((s.claimed_at_ms + CLAIM_GRACE_MS + 1, False))
    return sorted(ends)[len(ends) - cap.max]


def _cap(topic: Topic, cap: FrequencyCap, row: MessageState, moment: tuple[int, bool],
         now: int, admission: Admission) -> None:
    """The row past the cap: moved to `moment` (deferred: through its send window, its
    deliver_at the new time and the time asked kept) or cancelled (dropped). A moment that
    is not a window's end moves only its due time (it is looked at again then)."""
    at, final = moment
    if not final:
        # scheduled, whatever it was: a lease that ran out, taken again, left "leased" would
        # have its pointer spent and stay leased to nobody
        admission.capped[row.id] = dataclasses.replace(
            row, state="scheduled", version=row.version + 1, due_at_ms=max(at, now + RETRY_MS),
            lease_token=None, lease_expires_at_ms=None, updated_at_ms=now)
        return
    if cap.on_cap == "drop":
        admission.capped[row.id] = dataclasses.replace(
            row, state="cancelled", version=row.version + 1, lease_token=None,
            lease_expires_at_ms=None, updated_at_ms=now, cancel_reason=REASON)
        return
    placed = place_row(topic, row, at, now)
    admission.deferred.add(row.id)
    admission.capped[row.id] = dataclasses.replace(
        row, state="scheduled", version=row.version + 1, due_at_ms=placed.deliver_at_ms,
        deliver_at_ms=placed.deliver_at_ms, lease_token=None, lease_expires_at_ms=None,
        requested_at_ms=row.requested_at_ms or row.deliver_at_ms, updated_at_ms=now,
        paced=False)


def settle(services: Services, topic: Topic, admission: Admission,
           before: dict[str, MessageState], won: Sequence[MessageState],
           undecided: set[str]) -> None:
    """After the take's LWTs: give back the slots of claimed messages whose take lost (a
    cancel or a move won; an undecided one keeps its slot, which a later take of it uses,
    or which the holder check frees), and count the deferrals and drops that applied."""
    if not admission.claimed and not admission.capped:
        return
    leased = {r.id for r in won if r.state == "leased"}
    unused = [held for i, held in admission.claimed.items()
              if i not in leased and i not in undecided]
    if unused:
        services.caps.give_back(topic.uid, unused)
    for i, (_, s) in admission.claimed.items():
        if i in leased:
            services.caps.handed_out.add((topic.uid, s.message_id, s.claimed_at_ms))
    applied = [r for r in won if r.id in admission.capped]
    moves: list[Move] = [(None, DEFERRED, r.campaign) for r in applied
                         if r.id in admission.deferred]
    moves += [(None, DROPPED, r.campaign) for r in applied if r.state == "cancelled"]
    moved = [r for r in applied if r.state == "scheduled"]
    ups = services.counts
    also = [*ups.upcoming_updates_at(topic.uid, [before[r.id].due_at_ms for r in moved
                                                 if before[r.id].state == "scheduled"], -1),
            *ups.upcoming_updates_at(topic.uid, [r.due_at_ms for r in moved])]
    count_moves(services, topic, moves, also)


def give_back(services: Services, topic: Topic, rows: Sequence[MessageState]) -> None:
    """Free the live slots these messages hold (a nack, a failed POST, a give-back: nobody
    was notified). Best effort: a failure is logged (the slot then counts until its window
    ends, never more)."""
    mine = [r for r in rows if counted(topic, r)]
    if not mine:
        return
    try:
        now = services.clock()
        recipients = sorted({r.recipient or "" for r in mine})
        slots = services.caps.read_many(topic.uid, recipients)
        ids = {r.id for r in mine}
        gone = [(recipient, s) for recipient in recipients
                for s in slots[recipient].values() if s.message_id in ids and s.live(now)]
        if gone:
            services.caps.give_back(topic.uid, gone)
    except Exception:
        log.warning("cap slots of %d messages of topic %s not given back", len(mine),
                    topic.uid, exc_info=True)
