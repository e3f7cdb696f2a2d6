"""The releaser's end of wake-ups (app.delivery.wakeups): a UDP socket whose datagrams wake the
steps registered for their kinds, and the address other processes send to, published with the
releaser's membership heartbeat."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from app.config import Config
from app.delivery import wakeups
from app.ops import metrics

log = logging.getLogger("duetime.releaser")


class WakeListener:
    def __init__(self, config: Config, port: int | None = None) -> None:
        """Bind UDP `port` (default DUETIME_WAKE_PORT); OSError when it is taken."""
        self._callbacks: dict[str, list[Callable[[], None]]] = {k: [] for k in wakeups.KINDS}
        self._on_named: dict[str, list[Callable[[uuid.UUID], None]]] = {wakeups.DUE: []}
        self._socket = wakeups.DatagramListener(config, self._wake, "wake-listener", port)
        self.address = self._socket.address

    def on(self, kind: str, callback: Callable[[], None]) -> None:
        self._callbacks[kind].append(callback)

    def on_named(self, prefix: str, callback: Callable[[uuid.UUID], None]) -> None:
        """callback(topic uid) for each kind received that names a topic after this prefix
        (app.delivery.wakeups.DUE)."""
        self._on_named[prefix].append(callback)

    def start(self) -> None:
        self._socket.start()
        log.info("wake-ups on udp %s", self.address)

    def _wake(self, datagram: bytes) -> None:
        for kind in wakeups.decode(datagram):
            metrics.WAKEUPS_RECEIVED.labels(wakeups.label_of(kind)).inc()
            for prefix, callbacks in self._on_named.items():
                topic_uid = wakeups.named_topic(kind, prefix)
                if topic_uid is not None:
                    for named in callbacks:
                        named(topic_uid)
            for callback in self._callbacks.get(kind, ()):
                callback()

    def close(self) -> None:
        self._socket.close()
