"""Floors of a one-message request, served by gunicorn with duetime's own settings
(app/gunicorn_conf.py) beside the stack and called through the same client
(tests.bench.single.bare_floor). Both answer duetime's routes of one message (enqueue,
lease, ack) with answers of the same shape:

- the no-op app (`app`) does nothing: what one request costs on the machine before any of
  duetime's code runs;
- the storage floor (`storage_app`) makes, for each call, the Cassandra requests duetime's
  own makes when nothing is shared between calls, and nothing else: an enqueue writes the
  state and body rows (one batch), a pointer and its write count; a lease writes the lease
  pointer, then takes the row by a lightweight transaction, reading a payload meanwhile; an
  ack is one lightweight transaction. No search for what is due, no fairness, no broker.

A one-message path can go no faster than the storage floor on a machine unless its calls
share requests; the floor's rate against the no-op app's is the most any implementation
of those requests reaches there. The tables are made by create_tables(), in the keyspace of
DUETIME_KEYSPACE.
"""

from __future__ import annotations

import itertools
import os
import uuid
from typing import Any

from flask import Flask, Response, jsonify, request

BODIES = 1000  # body rows a lease reads its payload from, in turn
SHARDS = 16
_TABLES = [
    "CREATE TABLE IF NOT EXISTS {ks}.floor_state (topic text, id text, state text, "
    "version int, lease_token uuid, PRIMARY KEY ((topic, id)))",
    "CREATE TABLE IF NOT EXISTS {ks}.floor_body (topic text, id text, payload blob, "
    "PRIMARY KEY ((topic, id)))",
    "CREATE TABLE IF NOT EXISTS {ks}.floor_pointer (topic text, shard int, due_at bigint, "
    "id text, PRIMARY KEY ((topic, shard), due_at, id))",
    "CREATE TABLE IF NOT EXISTS {ks}.floor_count (topic text, shard int, n counter, "
    "PRIMARY KEY ((topic, shard)))"]


def _message(message_id: str, token: uuid.UUID, payload: Any) -> dict[str, Any]:
    return {"id": message_id, "payload": payload, "attempts": 1, "state": "leased",
            "lease": {"token": str(token), "expires_at": "2026-01-01T00:00:30.000Z"}}


def _answers(app: Flask, enqueue: Any, lease: Any, ack: Any) -> Flask:
    """Register duetime's one-message routes on app, each calling its function."""

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(status="ok")

    @app.post("/v1/topics/<topic>/messages")
    def enqueue_view(topic: str) -> tuple[Response, int]:
        body = request.get_json()
        message_id = enqueue(topic, body["payload"])
        return jsonify(id=message_id, state="scheduled",
                       deliver_at="2026-01-01T00:00:00.000Z"), 201

    @app.post("/v1/topics/<topic>/leases")
    def lease_view(topic: str) -> Response:
        request.get_json()
        return jsonify(messages=[lease(topic)])

    @app.post("/v1/topics/<topic>/messages/<message_id>/ack")
    def ack_view(topic: str, message_id: str) -> tuple[str, int]:
        ack(topic, message_id, uuid.UUID(request.get_json()["lease_token"]))
        return "", 204

    return app


_ids = itertools.count()
app = _answers(
    Flask(__name__),
    enqueue=lambda topic, payload: f"m{next(_ids)}",
    lease=lambda topic: _message(f"m{next(_ids)}", uuid.uuid4(), {"n": 1}),
    ack=lambda topic, message_id, token: None)


def create_tables(db: Any) -> None:
    """The storage floor's tables, and the body rows its leases read, in db's keyspace
    (an app.store.session.CassandraSession)."""
    for cql in _TABLES:
        db.execute_raw(cql)
    db.execute_many("INSERT INTO {ks}.floor_body (topic, id, payload) VALUES (?, ?, ?)",
                    [("bodies", f"b{i}", b'{"n": 1}') for i in range(BODIES)])


class _Storage:
    """The storage floor's calls; one Cassandra session a worker process, made on first use
    (after gunicorn's fork)."""

    def __init__(self) -> None:
        self._db: Any = None
        self._prefix = f"{os.getpid()}-{uuid.uuid4().hex[:6]}-"

    def db(self) -> Any:
        if self._db is None:
            from app.config import load_config
            from app.store.session import CassandraSession
            self._db = CassandraSession(load_config())
        return self._db

    def enqueue(self, topic: str, payload: Any) -> str:
        db, message_id = self.db(), f"{self._prefix}{next(_ids)}"
        shard = hash(message_id) % SHARDS
        futures = [
            db.execute_async("BEGIN UNLOGGED BATCH "
                             "INSERT INTO {ks}.floor_state (topic, id, state, version) "
                             "VALUES (?, ?, 'scheduled', 1); "
                             "INSERT INTO {ks}.floor_body (topic, id, payload) VALUES (?, ?, ?); "
                             "APPLY BATCH", (topic, message_id, topic, message_id, b'{"n": 1}')),
            db.execute_async("INSERT INTO {ks}.floor_pointer (topic, shard, due_at, id) "
                             "VALUES (?, ?, 0, ?)", (topic, shard, message_id)),
            db.execute_async("UPDATE {ks}.floor_count SET n = n + 1 WHERE topic = ? AND "
                             "shard = ?", (topic, shard))]
        db.results(futures)
        return message_id

    def lease(self, topic: str) -> dict[str, Any]:
        db, n = self.db(), next(_ids)
        message_id, token = f"{self._prefix}{n}", uuid.uuid4()
        reading = db.execute_async("SELECT payload FROM {ks}.floor_body WHERE topic = ? AND "
                                   "id = ?", ("bodies", f"b{n % BODIES}"))
        db.execute("INSERT INTO {ks}.floor_pointer (topic, shard, due_at, id) "
                   "VALUES (?, ?, 30000, ?)", (topic, n % SHARDS, message_id))
        taken = db.execute("INSERT INTO {ks}.floor_state (topic, id, state, version, "
                           "lease_token) VALUES (?, ?, 'leased', 2, ?) IF NOT EXISTS",
                           (topic, message_id, token))
        if not taken[0]["[applied]"]:
            raise RuntimeError(f"{message_id} was taken twice")
        payload = db.results([reading])[0][0]["payload"]
        return _message(message_id, token, payload.decode())

    def ack(self, topic: str, message_id: str, token: uuid.UUID) -> None:
        done = self.db().execute("UPDATE {ks}.floor_state SET state = 'acked', version = 3 "
                                 "WHERE topic = ? AND id = ? IF lease_token = ?",
                                 (topic, message_id, token))
        if not done[0]["[applied]"]:
            raise RuntimeError(f"the ack of {message_id} did not apply")


_storage = _Storage()
storage_app = _answers(Flask(f"{__name__}.storage"), _storage.enqueue, _storage.lease,
                       _storage.ack)
