"""Topics: one partition per tenant, every write an LWT (see schema/001_tenancy.cql)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from cassandra.query import UNSET_VALUE
from cassandra.util import unix_time_from_uuid1

from app.core.timeparse import cql_ms
from app.models import Topic, TopicSettings
from app.store.session import CassandraSession

_SETTING_COLUMNS = [f.name for f in dataclasses.fields(TopicSettings)]
_COLUMNS = ["uid", *_SETTING_COLUMNS, "signing_secret", "created_at", "updated_at",
            "previous_secret", "previous_secret_until"]


def _row_to_topic(tenant: str, row: dict[str, Any]) -> Topic:
    settings = TopicSettings(**{name: row[name] for name in _SETTING_COLUMNS})
    return Topic(
        tenant=tenant, name=row["name"], uid=row["uid"], settings=settings,
        signing_secret=row["signing_secret"], created_at_ms=cql_ms(row["created_at"]),
        updated_at_ms=cql_ms(row["updated_at"]), previous_secret=row["previous_secret"],
        previous_secret_until_ms=(None if row["previous_secret_until"] is None
                                  else cql_ms(row["previous_secret_until"])),
    )


class TopicStore:
    """Topic rows. Guarantees: create is first-writer-wins (IF NOT EXISTS); update and delete
    apply only to the incarnation (uid) the caller read, so a concurrent re-create is never
    clobbered."""

    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def get(self, tenant: str, name: str) -> Topic | None:
        rows = self.db.execute(
            f"SELECT name, {', '.join(_COLUMNS)} FROM {{ks}}.topics WHERE tenant = ? AND name = ?",
            (tenant, name),
        )
        return _row_to_topic(tenant, rows[0]) if rows else None

    def list_for(self, tenant: str) -> list[Topic]:
        rows = self.db.execute(
            f"SELECT name, {', '.join(_COLUMNS)} FROM {{ks}}.topics WHERE tenant = ?", (tenant,))
        return [_row_to_topic(tenant, row) for row in rows]

    def all(self) -> list[Topic]:
        """Every topic of every tenant. The table holds one small row per topic, so the
        releasers read it whole every few seconds (paged, token order)."""
        rows = self.db.iterate(
            f"SELECT tenant, name, {', '.join(_COLUMNS)} FROM {{ks}}.topics", (), 1000)
        return [_row_to_topic(row["tenant"], row) for row in rows]

    def create(self, topic: Topic) -> bool:
        """Insert a new topic; False when one of that name already exists. An unset setting
        (None) writes no cell: a null bound in an INSERT is a tombstone, and the releasers
        read this table whole (4 tombstones a pull topic made the reload of a 400-topic
        keyspace warn)."""
        values = [UNSET_VALUE if v is None else v for v in self._values(topic)]
        placeholders = ", ".join("?" for _ in values)
        rows = self.db.execute(
            f"INSERT INTO {{ks}}.topics (tenant, name, {', '.join(_COLUMNS)}) "
            f"VALUES (?, ?, {placeholders}) IF NOT EXISTS",
            (topic.tenant, topic.name, *values),
        )
        return self._noted(bool(rows[0]["[applied]"]), topic.tenant, topic.name)

    def update(self, topic: Topic, before: Topic) -> bool:
        """Rewrite the settings of the incarnation topic.uid (as read: `before`); False if it
        is gone or replaced. A setting unset before and after writes nothing (no tombstone);
        one cleared writes its null."""
        assignments = ", ".join(f"{c} = ?" for c in [*_SETTING_COLUMNS, "updated_at"])
        settings = [UNSET_VALUE if new is None and getattr(before.settings, c) is None else new
                    for c in _SETTING_COLUMNS for new in [getattr(topic.settings, c)]]
        rows = self.db.execute(
            f"UPDATE {{ks}}.topics SET {assignments} WHERE tenant = ? AND name = ? IF uid = ?",
            (*settings, topic.updated_at_ms, topic.tenant, topic.name, topic.uid),
        )
        return self._noted(bool(rows[0]["[applied]"]), topic.tenant, topic.name)

    def rotate_secret(self, topic: Topic, before: Topic) -> bool:
        """Write topic's secrets (a rotation) if the incarnation still holds the secret read
        in `before`: two rotations at once cannot both drop a secret; False otherwise."""
        rows = self.db.execute(
            "UPDATE {ks}.topics SET signing_secret = ?, previous_secret = ?, "
            "previous_secret_until = ?, updated_at = ? WHERE tenant = ? AND name = ? "
            "IF uid = ? AND signing_secret = ?",
            (topic.signing_secret, topic.previous_secret, topic.previous_secret_until_ms,
             topic.updated_at_ms, topic.tenant, topic.name, topic.uid, before.signing_secret),
        )
        return self._noted(bool(rows[0]["[applied]"]), topic.tenant, topic.name)

    def delete(self, tenant: str, name: str, uid: uuid.UUID) -> bool:
        """Remove the incarnation uid. Topic deletion is rare and its partition tiny, so this
        one delete is no tombstone burden; its messages are unreachable through the new uid."""
        rows = self.db.execute(
            "DELETE FROM {ks}.topics WHERE tenant = ? AND name = ? IF uid = ?",
            (tenant, name, uid),
        )
        return self._noted(bool(rows[0]["[applied]"]), tenant, name)

    def _noted(self, applied: bool, tenant: str, name: str) -> bool:
        """After an applied change: add it to topic_changes (the releasers follow it)."""
        if applied:
            self.db.execute("INSERT INTO {ks}.topic_changes (part, changed, tenant, name) "
                            "VALUES (0, now(), ?, ?)", (tenant, name))
        return applied

    def changes_since(self, since_ms: int) -> list[tuple[uuid.UUID, str, str]]:
        """(change id, tenant, name) of the topic changes written since since_ms, oldest
        first (one read)."""
        rows = self.db.execute(
            "SELECT changed, tenant, name FROM {ks}.topic_changes WHERE part = 0 "
            "AND changed > minTimeuuid(?)", (since_ms,))
        return [(r["changed"], r["tenant"], r["name"]) for r in rows]

    @staticmethod
    def change_ms(changed: uuid.UUID) -> int:
        """When a change of changes_since was written (epoch ms, the writer's clock)."""
        return int(unix_time_from_uuid1(changed) * 1000)

    @staticmethod
    def _values(topic: Topic) -> list[Any]:
        return [
            topic.uid, *[getattr(topic.settings, c) for c in _SETTING_COLUMNS],
            topic.signing_secret, topic.created_at_ms, topic.updated_at_ms,
            topic.previous_secret, topic.previous_secret_until_ms,
        ]
