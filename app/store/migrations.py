"""Ordered CQL migrations from schema/NNN_name.cql, applied once each and recorded.

schema/ at the project's root is their source of truth; a built wheel carries a copy as
app/store/cql/ (setup.py), read when the package is installed away from the source tree.

Every statement in a migration is idempotent (IF NOT EXISTS), so a run interrupted half-way
is simply run again. Applied versions are recorded in schema_migrations with the file's
checksum; applying twice is a no-op.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cassandra import InvalidRequest, ReadFailure, WriteFailure

from app.store.session import CassandraSession

PACKAGED_SCHEMA = Path(__file__).resolve().parent / "cql"
SCHEMA_DIR = (PACKAGED_SCHEMA if PACKAGED_SCHEMA.is_dir()
              else Path(__file__).resolve().parents[2] / "schema")
DDL_RETRY_S = 60
log = logging.getLogger(__name__)
_FILE_PATTERN = re.compile(r"^(\d{3})_([a-z0-9_]+)\.cql$")


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    cql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.cql.encode()).hexdigest()[:16]

    def statements(self) -> list[str]:
        """The file's statements: comments stripped, split on ';' at line ends."""
        lines = [ln for ln in self.cql.splitlines() if not ln.strip().startswith("--")]
        parts = re.split(r";\s*$", "\n".join(lines), flags=re.MULTILINE)
        return [p.strip() for p in parts if p.strip()]


def discover(schema_dir: Path = SCHEMA_DIR) -> list[Migration]:
    """All migrations in schema_dir, ordered by version."""
    found = []
    for path in sorted(schema_dir.glob("*.cql")):
        match = _FILE_PATTERN.match(path.name)
        if match:
            found.append(Migration(int(match[1]), match[2], path.read_text()))
    return found


T = TypeVar("T")


def unsettled(exc: Exception) -> bool:
    """Whether exc says the nodes do not all know the schema a statement uses yet (a new
    cluster's gossip, a node that was down): refused as not existing, or failed on a
    replica whose table is not the coordinator's (INCOMPATIBLE_SCHEMA)."""
    if isinstance(exc, InvalidRequest):
        return "exist" in str(exc)
    return isinstance(exc, ReadFailure | WriteFailure) and "INCOMPATIBLE_SCHEMA" in str(exc)


def _settled(call: Callable[[], T]) -> T:
    """call(), tried again every second for up to DDL_RETRY_S while the schema it uses has
    not reached every node (every statement here is idempotent)."""
    deadline = time.monotonic() + DDL_RETRY_S
    while True:
        try:
            return call()
        except (InvalidRequest, ReadFailure, WriteFailure) as exc:
            if not unsettled(exc) or time.monotonic() > deadline:
                raise
            log.info("the schema has not reached every node yet (%s); trying again", exc)
            time.sleep(1)


def _ddl(db: CassandraSession, statement: str) -> None:
    """Run one schema statement once the schema it builds on has reached every node."""
    _settled(lambda: db.execute_raw(statement, timeout=120.0))


def _ensure_keyspace(db: CassandraSession) -> None:
    _ddl(db, f"CREATE KEYSPACE IF NOT EXISTS {db.keyspace} "
             f"WITH replication = {db.config.replication}")
    _ddl(db, "CREATE TABLE IF NOT EXISTS {ks}.schema_migrations "
             "(version int PRIMARY KEY, name text, checksum text, applied_at timestamp)")


def applied_versions(db: CassandraSession) -> set[int]:
    """Versions recorded as applied; empty when the keyspace does not exist yet."""
    tables = db.execute_raw(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = "
        f"'{db.keyspace}' AND table_name = 'schema_migrations'"
    )
    if not tables:
        return set()
    rows = _settled(lambda: db.execute_raw("SELECT version FROM {ks}.schema_migrations"))
    return {row["version"] for row in rows}


def pending(db: CassandraSession, schema_dir: Path = SCHEMA_DIR) -> list[Migration]:
    """Migrations of this code that the keyspace has not recorded."""
    done = applied_versions(db)
    return [m for m in discover(schema_dir) if m.version not in done]


def apply(db: CassandraSession, schema_dir: Path = SCHEMA_DIR) -> list[Migration]:
    """Create the keyspace if needed and apply every pending migration; returns those applied."""
    _ensure_keyspace(db)
    todo = pending(db, schema_dir)
    for migration in todo:
        for statement in migration.statements():
            _ddl(db, _qualify(statement, db.keyspace))
        record = (migration.version, migration.name, migration.checksum,
                  dt.datetime.now(dt.UTC))
        _settled(functools.partial(
            db.execute, "INSERT INTO {ks}.schema_migrations (version, name, checksum, "
            "applied_at) VALUES (?, ?, ?, ?)", record))
    return todo


def _qualify(statement: str, keyspace: str) -> str:
    """Prefix the table of a CREATE/DROP/ALTER TABLE, TYPE or view, and the table a CREATE
    [CUSTOM] INDEX is ON, with the keyspace (files name no keyspace; an index's own name
    takes none: it lives in its table's keyspace)."""
    if re.match(r"^CREATE\s+(?:CUSTOM\s+)?INDEX\b", statement, flags=re.IGNORECASE):
        return re.sub(r"\bON\s+(\w+)\s*\(", rf"ON {keyspace}.\1 (", statement, count=1,
                      flags=re.IGNORECASE)
    return re.sub(
        r"^((?:CREATE|DROP)\s+(?:TABLE|INDEX|TYPE|MATERIALIZED VIEW)\s+IF\s+(?:NOT\s+)?EXISTS\s+"
        r"|ALTER\s+TABLE\s+)(\w+)",
        rf"\1{keyspace}.\2", statement, flags=re.IGNORECASE,
    )
