"""API keys: SHA-256 hashes mapped to tenants. The clear key is shown once, at creation."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from app.store.session import CassandraSession

KEY_PREFIX = "dt_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class ApiKeyStore:
    """Creates keys and resolves a presented key to its tenant."""

    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def create(self, tenant: str, name: str = "") -> str:
        """Make a new key for tenant and return it in clear (it is stored only hashed)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        self.db.execute(
            "INSERT INTO {ks}.api_keys (key_hash, tenant, name, created_at) VALUES (?, ?, ?, ?)",
            (hash_key(key), tenant, name, dt.datetime.now(dt.UTC)),
        )
        return key

    def tenant_of(self, key: str) -> str | None:
        """The tenant a key belongs to, or None for an unknown key."""
        rows = self.db.execute(
            "SELECT tenant FROM {ks}.api_keys WHERE key_hash = ?", (hash_key(key),))
        return rows[0]["tenant"] if rows else None
