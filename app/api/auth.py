"""Bearer API-key authentication: every /v1 request is tied to exactly one tenant."""

from __future__ import annotations

import threading
import time

from app.errors import Unauthorized
from app.store.keys import ApiKeyStore, hash_key


class Authenticator:
    """Resolves `Authorization: Bearer <key>` to a tenant, caching hits for cache_s seconds (a
    revoked key may work that long on a process that saw it: DUETIME_KEY_CACHE_S). Keys are
    looked up and cached by their SHA-256 hash: no clear key is kept or compared."""

    def __init__(self, keys: ApiKeyStore, cache_s: float = 30.0) -> None:
        self.keys = keys
        self.cache_s = cache_s
        self._cache: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def tenant_for_header(self, header: str | None) -> str:
        if not header or not header.startswith("Bearer "):
            raise Unauthorized("Send an API key as 'Authorization: Bearer <key>'.")
        key_hash = hash_key(header[len("Bearer "):].strip())
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(key_hash)
        if cached and now - cached[1] < self.cache_s:
            return cached[0]
        tenant = self.keys.tenant_of_hash(key_hash)
        if tenant is None:
            raise Unauthorized("Unknown API key.")
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key_hash] = (tenant, now)
        return tenant
