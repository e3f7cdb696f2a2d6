"""The releaser's end of wake-ups (app.wakeups): a UDP socket whose datagrams wake the steps
registered for their kinds, and the address other processes send to, published with the
releaser's membership heartbeat."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from app import metrics, wakeups
from app.config import Config

log = logging.getLogger("duetime.releaser")


def advertised_host(config: Config) -> str:
    """DUETIME_WAKE_HOST, else this host's name resolved (a pod's IP), else loopback."""
    if config.wake_host:
        return config.wake_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class WakeListener:
    def __init__(self, config: Config) -> None:
        self._callbacks: dict[str, list[Callable[[], None]]] = {k: [] for k in wakeups.KINDS}
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("0.0.0.0", config.wake_port))
        self.address = f"{advertised_host(config)}:{self._socket.getsockname()[1]}"
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="wake-listener", daemon=True)

    def on(self, kind: str, callback: Callable[[], None]) -> None:
        self._callbacks[kind].append(callback)

    def start(self) -> None:
        self._thread.start()
        log.info("wake-ups on udp %s", self.address)

    def _loop(self) -> None:
        while not self._closed:
            try:
                datagram = self._socket.recv(512)
            except OSError:
                return  # closed
            for kind in wakeups.decode(datagram):
                metrics.WAKEUPS_RECEIVED.labels(kind).inc()
                for callback in self._callbacks[kind]:
                    callback()

    def close(self) -> None:
        self._closed = True
        try:  # recv() does not return on close() alone: a datagram to ourselves ends it
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"", ("127.0.0.1", self._socket.getsockname()[1]))
        except OSError:
            pass
        self._socket.close()
        self._thread.join(timeout=5)
