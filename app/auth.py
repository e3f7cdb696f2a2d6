"""Bearer API-key authentication: every /v1 request is tied to exactly one tenant."""

from __future__ import annotations

import threading
import time

from app.errors import Unauthorized
from app.store.keys import ApiKeyStore

CACHE_TTL_S = 30.0


class Authenticator:
    """Resolves `Authorization: Bearer <key>` to a tenant, caching hits for CACHE_TTL_S seconds
    (a revoked key may work that long on a process that saw it)."""

    def __init__(self, keys: ApiKeyStore) -> None:
        self.keys = keys
        self._cache: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def tenant_for_header(self, header: str | None) -> str:
        if not header or not header.startswith("Bearer "):
            raise Unauthorized("Send an API key as 'Authorization: Bearer <key>'.")
        key = header[len("Bearer "):].strip()
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(key)
        if cached and now - cached[1] < CACHE_TTL_S:
            return cached[0]
        tenant = self.keys.tenant_of(key)
        if tenant is None:
            raise Unauthorized("Unknown API key.")
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (tenant, now)
        return tenant
