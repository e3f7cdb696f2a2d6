"""API keys: SHA-256 hashes mapped to tenants. The clear key is shown once, at creation, and
never stored or logged; a key is named afterwards by its id (the first KEY_ID_CHARS hex
characters of its hash)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import secrets

from app.core.timeparse import cql_ms
from app.store.session import CassandraSession

KEY_PREFIX = "dt_"
KEY_ID_CHARS = 16


@dataclasses.dataclass(frozen=True)
class KeyInfo:
    """A key as an operator sees it: its id, never the key."""

    key_id: str
    tenant: str
    name: str
    created_at_ms: int


class KeyNotFound(LookupError):
    """No key (or more than one) has that id."""


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
        return self.tenant_of_hash(hash_key(key))

    def tenant_of_hash(self, key_hash: str) -> str | None:
        rows = self.db.execute("SELECT tenant FROM {ks}.api_keys WHERE key_hash = ?",
                               (key_hash,))
        return rows[0]["tenant"] if rows else None

    def _rows(self) -> list[dict[str, object]]:
        # an operator's command over a small table: a full read is fine here
        return list(self.db.iterate(
            "SELECT key_hash, tenant, name, created_at FROM {ks}.api_keys", (), 1000))

    def all(self, tenant: str | None = None) -> list[KeyInfo]:
        """Every key (of one tenant), by tenant and creation time."""
        keys = [KeyInfo(str(r["key_hash"])[:KEY_ID_CHARS], str(r["tenant"]), str(r["name"] or ""),
                         cql_ms(r["created_at"]) if isinstance(r["created_at"], dt.datetime)
                         else 0)
                for r in self._rows() if tenant is None or r["tenant"] == tenant]
        return sorted(keys, key=lambda k: (k.tenant, k.created_at_ms))

    def revoke(self, key_id: str) -> KeyInfo:
        """Remove the key with this id (or this clear key); KeyNotFound if none or several
        match. Processes that resolved it stop taking it within their cache time."""
        wanted = hash_key(key_id) if key_id.startswith(KEY_PREFIX) else key_id.lower()
        found = [r for r in self._rows() if str(r["key_hash"]).startswith(wanted)]
        if len(found) != 1 or len(wanted) < 8:
            raise KeyNotFound(f"{len(found)} keys match {key_id!r} (give at least 8 characters "
                              "of a key id)" if found else f"no key has id {key_id!r}")
        row = found[0]
        self.db.execute("DELETE FROM {ks}.api_keys WHERE key_hash = ?", (row["key_hash"],))
        return KeyInfo(str(row["key_hash"])[:KEY_ID_CHARS], str(row["tenant"]),
                       str(row["name"] or ""), 0)
