"""What this process knows of the campaigns' controls, per topic, at most REFRESH_MS old.

Takes (pull leases and webhook pushes) and enqueues consult it: a paused campaign's messages
are not taken, a cancelled campaign's messages are cancelled instead of taken, and enqueues
into a cancelled campaign or one being shifted are refused. A control changed anywhere is
therefore obeyed by every process within REFRESH_MS plus the time of one pass (the pause
guarantee of one second), and at once by the process that changed it (forget()).
"""

from __future__ import annotations

import threading
import time
import uuid

from app.store.campaigns import Campaign, CampaignStore

REFRESH_MS = 500


class CampaignRules:
    """Thread-safe; one per process. A topic's campaigns are read (one partition) when asked
    for and older than REFRESH_MS (monotonic clock)."""

    def __init__(self, store: CampaignStore, refresh_ms: int = REFRESH_MS) -> None:
        self.store = store
        self.refresh_s = refresh_ms / 1000
        self._known: dict[uuid.UUID, tuple[float, dict[str, Campaign]]] = {}
        self._lock = threading.Lock()

    def of(self, topic_uid: uuid.UUID) -> dict[str, Campaign]:
        """{campaign name: its row} of the topic, as read at most refresh_ms ago."""
        with self._lock:
            known = self._known.get(topic_uid)
        if known is not None and time.monotonic() - known[0] < self.refresh_s:
            return known[1]
        read_at = time.monotonic()
        campaigns = {c.name: c for c in self.store.all(topic_uid)}
        with self._lock:
            self._known[topic_uid] = (read_at, campaigns)
        return campaigns

    def forget(self, topic_uid: uuid.UUID) -> None:
        """Read the topic again at the next question (after this process changed it)."""
        with self._lock:
            self._known.pop(topic_uid, None)
