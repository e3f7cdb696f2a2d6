"""The checker of a fault run, after Jepsen's total-queue: it reads the whole history
(tests/faults/workload.py) and counts every broken promise.

- lost: an enqueue was answered 200/201, no cancel of it was acknowledged or left without an
  answer, and it was never delivered (a pull ack answered 204, or one left without an answer
  when the message reads `delivered` afterwards; a webhook POST answered 200);
- unexpected: handed out although no enqueue of that id was ever sent;
- early: handed out (received here) before its deliver_at less `allowed_early_ms` (the clock
  offset a nemesis injected: never early is promised on the processes' clocks);
- after cancel: a lease asked for, or a POST received, after a cancel of that id was
  acknowledged;
- handed out after ack: a pull lease of an id after an ack of it was answered 204;
- dead without a hand-out: read `dead` after the round though no lease call got it and no
  POST of it reached the receiver (an attempt spent on a message nobody received);
- duplicates: ids handed out more than once (at least once allows them: lease expiry, nacks,
  500 answers, a crash mid-POST), counted; webhook POSTs after a 200 answer are counted apart;
- lag of first handouts (ms after deliver_at, or after the enqueue's answer when that came
  later): p50 / p99 / max, of all and of each mode; for pull also the wait duetime alone
  made (from that moment, or from when the lease call was sent if later: a consumer busy
  acking is not asking);
- enqueued late: accepted messages whose first accepted enqueue was answered after the
  deliver_at it asked for (the workload fell behind its plan, or the API was slow to answer:
  their lag counts from the answer, the path of a message due at once);
- first seen on a later attempt: ids whose first handout seen carries attempt 2 or more,
  their first lease or POST having reached nobody (a killed process may do that; with no
  nemesis it is a lease taken for a call that never got it).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tests.faults.workload import MOVE_DELAY_MS, Event, History

ANSWERED = (200, 201)
MUST_BE_ZERO = ("lost", "unexpected", "early", "after_cancel", "handed_out_after_ack",
                "dead_without_handout")


def _percentile(values: list[int], q: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _due_at(events: dict[str, list[Event]], asked_at_ms: int) -> int:
    """The earliest deliver_at a handout asked for at asked_at_ms may honour: the enqueued
    time, or a move's once that move was answered before the ask; a move whose answer came
    later (or never) allows either."""
    times = [e.deliver_at_ms for e in events["enqueue"] if e.status in ANSWERED]
    due = times[0] if times else 0
    for move in events["move"]:
        if move.status == 200 and move.done_ms < asked_at_ms:
            due = move.deliver_at_ms
        elif move.status in (0, 200) or move.status >= 500:  # maybe moved, to about then
            due = min(due, move.deliver_at_ms or move.sent_ms + MOVE_DELAY_MS)
    return due


def check(history: History, allowed_early_ms: int = 0,
          states: dict[str, str] | None = None) -> dict[str, Any]:
    """The counts of the module docstring. `states` are messages' states read after the
    round: an ack that got no answer (its API worker was killed) delivered the message if
    its state is `delivered`."""
    by_id: dict[str, dict[str, list[Event]]] = defaultdict(lambda: defaultdict(list))
    for event in history.of_all():
        by_id[event.id][event.kind].append(event)
    result: dict[str, Any] = dict.fromkeys(
        ("accepted", "maybe", "cancelled", "delivered", "lost", "unexpected", "early",
         "after_cancel", "handed_out_after_ack", "dead_without_handout", "duplicates",
         "webhook_repeats_after_200"), 0)
    result["first_seen_later"] = result["enqueued_late"] = 0
    lags: dict[str, list[int]] = {"pull": [], "webhook": [], "pull_wait": []}
    examples: list[str] = []
    for message_id, events in by_id.items():
        for broken in _judge(events, allowed_early_ms, result, lags,
                             (states or {}).get(message_id)):
            examples.append(f"{broken} {message_id}")
    result["lag_ms"] = _spread(lags["pull"] + lags["webhook"])
    result["lag_ms_by"] = {name: _spread(values) for name, values in lags.items()}
    result["ok"] = all(result[k] == 0 for k in MUST_BE_ZERO)
    result["all_lost"] = [e.split()[-1] for e in examples if e.startswith("lost ")]
    result["examples"] = examples[:10]
    return result


def _spread(values: list[int]) -> dict[str, int]:
    return {"p50": _percentile(values, 0.5), "p99": _percentile(values, 0.99),
            "max": max(values, default=0)}


def _judge(events: dict[str, list[Event]], allowed_early_ms: int, result: dict[str, Any],
           lags: dict[str, list[int]], state: str | None) -> list[str]:
    """Add one message's counts to result and its first handout's lag to lags; returns what
    it broke (for examples)."""
    broken = []
    enqueues = events["enqueue"]
    answered = [e for e in enqueues if e.status in ANSWERED]
    accepted = bool(answered)
    result["accepted"] += accepted
    result["enqueued_late"] += accepted and answered[0].done_ms > answered[0].deliver_at_ms
    result["maybe"] += not accepted and any(e.status == 0 or e.status >= 500 for e in enqueues)
    cancels_done = [e.done_ms for e in events["cancel"] if e.status == 204]
    cancel_unknown = any(e.status == 0 or e.status >= 500 for e in events["cancel"])
    result["cancelled"] += bool(cancels_done)
    acks = [e for e in events["ack"] if e.status == 204 or (
        state == "delivered" and (e.status == 0 or e.status >= 500))]
    handouts = sorted(events["handout"], key=lambda e: e.done_ms)
    result["delivered"] += bool(acks)
    if accepted and not acks and not cancels_done and not cancel_unknown:
        result["lost"] += 1
        broken.append("lost")
    if handouts and not enqueues:
        result["unexpected"] += 1
        broken.append("unexpected")
    if state == "dead" and not handouts:
        result["dead_without_handout"] += 1
        broken.append("dead without a hand-out")
    for h in handouts:
        due = _due_at(events, h.sent_ms)
        if h.done_ms < due - allowed_early_ms:
            result["early"] += 1
            broken.append(f"early by {due - h.done_ms} ms ({h.detail})")
        if cancels_done and h.sent_ms > min(cancels_done):
            result["after_cancel"] += 1
            broken.append(f"after cancel ({h.detail})")
    pull_acks = [a.done_ms for a in acks if a.topic.endswith("-pull")]
    if pull_acks:
        again = [h for h in handouts if h.sent_ms > min(pull_acks)]
        result["handed_out_after_ack"] += len(again)
        broken.extend(f"handed out after ack ({h.detail})" for h in again)
    hook_acks = [a.done_ms for a in acks if a.topic.endswith("-hook")]
    if hook_acks:
        result["webhook_repeats_after_200"] += sum(h.done_ms > min(hook_acks) for h in handouts)
    result["duplicates"] += len(handouts) > 1
    if handouts and accepted:
        broken.extend(_first_handout(events, handouts[0], result, lags))
    return broken


def _first_handout(events: dict[str, list[Event]], first: Event, result: dict[str, Any],
                   lags: dict[str, list[int]]) -> list[str]:
    """Add an accepted message's first handout's lags (from when it was due, or accepted if
    that came later) and whether it was its first attempt; returns what it broke."""
    since = max(_due_at(events, first.sent_ms),
                min(e.done_ms for e in events["enqueue"] if e.status in ANSWERED))
    pull = first.topic.endswith("-pull")
    lags["pull" if pull else "webhook"].append(first.done_ms - since)
    if pull:
        lags["pull_wait"].append(first.done_ms - max(since, first.sent_ms))
    if first.detail.endswith(" attempt 1"):
        return []
    result["first_seen_later"] += 1
    return [f"first seen on a later attempt ({first.detail})"]
