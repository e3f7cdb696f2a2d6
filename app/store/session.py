"""The Cassandra session of one process: lazy connect, prepared statements, error translation.

A process makes its session on first use, never at import, so gunicorn workers each get their
own after fork. While Cassandra is unreachable every call raises StoreUnavailable (answered 503
with a retry hint); the next call after it is back reconnects.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

from cassandra import (
    ConsistencyLevel,
    OperationTimedOut,
    ReadTimeout,
    Unavailable,
    WriteTimeout,
)
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
    Session,
)
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.policies import (
    ConstantReconnectionPolicy,
    DCAwareRoundRobinPolicy,
    RoundRobinPolicy,
    TokenAwarePolicy,
)
from cassandra.query import BatchStatement, BatchType, PreparedStatement, dict_factory

from app.config import Config
from app.core.chunks import packed
from app.errors import StoreUnavailable
from app.ops import metrics

# a statement sent whose answer is not read yet (execute_async, start_batches)
Pending: TypeAlias = ResponseFuture
TRANSIENT_ERRORS = (NoHostAvailable, OperationTimedOut, Unavailable, ReadTimeout, WriteTimeout)
RECONNECT_BACKOFF_S = 1.0
COUNTER_BATCH = 32  # counter updates per batch: well under the batch size warning (5 KiB)
# partitions per counter batch: Cassandra warns of an unlogged batch across more
# (unlogged_batch_across_partitions_warn_threshold, 10 by default)
BATCH_PARTITIONS = 10


@contextmanager
def translate_errors() -> Iterator[None]:
    """Turn the driver's transient failures into StoreUnavailable (503, retry later)."""
    try:
        yield
    except TRANSIENT_ERRORS as exc:
        raise StoreUnavailable(f"Cassandra unavailable: {type(exc).__name__}") from exc


def _settled(future: ResponseFuture) -> tuple[bool, Any]:
    try:
        return True, list(future.result())
    except Exception as exc:  # reported per batch, as execute_many does
        return False, exc


def item_errors(chunks: Sequence[Sequence[int]], outcomes: Sequence[tuple[bool, Any]],
                count: int) -> list[Exception | None]:
    """Per item of `count`, the error of the batch that carried it (None where it succeeded),
    given the item indexes of each batch and run_batches' outcomes in the same order."""
    errors: list[Exception | None] = [None] * count
    for chunk, (ok, result) in zip(chunks, outcomes, strict=True):
        for index in chunk:
            errors[index] = None if ok else result
    return errors


class BatchRun:
    """Batches being run, at most `concurrency` in flight (CassandraSession.start_batches)."""

    def __init__(self, start: Callable[[Sequence[tuple[str, Sequence[Any]]]], ResponseFuture],
                 batches: Sequence[Sequence[tuple[str, Sequence[Any]]]],
                 concurrency: int) -> None:
        self._start = start
        self._waiting = deque(batches)
        self._in_flight: deque[ResponseFuture] = deque()
        while self._waiting and len(self._in_flight) < concurrency:
            self._in_flight.append(start(self._waiting.popleft()))

    def outcomes(self) -> list[tuple[bool, Any]]:
        """Wait for every batch, sending the rest as earlier ones end: (success, rows or
        exception) per batch, in order."""
        outcomes: list[tuple[bool, Any]] = []
        while self._in_flight:
            outcomes.append(_settled(self._in_flight.popleft()))
            if self._waiting:
                self._in_flight.append(self._start(self._waiting.popleft()))
        return outcomes


class CassandraSession:
    """One driver Cluster/Session per process, with a prepared-statement cache.

    Thread-safe: the driver's Session is, and connect() is guarded by a lock.
    """

    def __init__(self, config: Config, keyspace: str | None = None) -> None:
        self.config = config
        self.keyspace = keyspace if keyspace is not None else config.keyspace
        self._lock = threading.Lock()
        self._cluster: Cluster | None = None
        self._session: Session | None = None
        self._prepared: dict[str, PreparedStatement] = {}
        self._last_failure = -math.inf  # monotonic s; none yet (a host may be up < 1 s)

    @property
    def serial_level(self) -> int:
        """The driver's value of DUETIME_SERIAL_CONSISTENCY (reads of in-progress LWTs)."""
        return int(ConsistencyLevel.name_to_value[self.config.serial_consistency])

    def _build_cluster(self) -> Cluster:
        cfg = self.config
        balancing = (
            DCAwareRoundRobinPolicy(local_dc=cfg.local_dc) if cfg.local_dc else RoundRobinPolicy()
        )
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(balancing),
            consistency_level=ConsistencyLevel.name_to_value[cfg.consistency],
            serial_consistency_level=self.serial_level,
            request_timeout=cfg.request_timeout_s,
            row_factory=dict_factory,
        )
        auth = (
            PlainTextAuthProvider(cfg.cql_username, cfg.cql_password)
            if cfg.cql_username else None
        )
        return Cluster(
            contact_points=list(cfg.contact_points), port=cfg.cql_port,
            # the driver leaves Nagle on: a request bigger than one TCP segment (any batch)
            # then waits for the server's delayed ACK, 40 ms, before its tail is sent
            sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            execution_profiles={EXEC_PROFILE_DEFAULT: profile}, auth_provider=auth,
            reconnection_policy=ConstantReconnectionPolicy(RECONNECT_BACKOFF_S, None),
            # v5 frames every message in checksummed segments, built in pure Python by the
            # driver: about 8 % of an API worker's CPU under load (py-spy), for nothing v4 lacks
            protocol_version=4, connect_timeout=3, control_connection_timeout=3,
            # `schema apply` on a cluster: each DDL waits until every node has it (10 s, the
            # default, is short for busy nodes; the next statement could meet a node
            # without the table)
            max_schema_agreement_wait=120,
        )

    def session(self) -> Session:
        """The connected session; raises StoreUnavailable while Cassandra cannot be reached."""
        if self._session is not None:
            return self._session
        with self._lock:
            if self._session is not None:
                return self._session
            if time.monotonic() - self._last_failure < RECONNECT_BACKOFF_S:
                raise StoreUnavailable("Cassandra unavailable: reconnecting")
            cluster = self._build_cluster()
            try:
                session = cluster.connect()
            except TRANSIENT_ERRORS as exc:
                cluster.shutdown()
                self._last_failure = time.monotonic()
                raise StoreUnavailable(f"Cassandra unavailable: {type(exc).__name__}") from exc
            session.add_request_init_listener(metrics.on_cassandra_request)
            self._cluster, self._session = cluster, session
            return session

    def prepare(self, cql: str) -> PreparedStatement:
        """A prepared statement for cql; {ks} in cql is replaced by this session's keyspace."""
        stmt = self._prepared.get(cql)
        if stmt is None:
            with translate_errors():
                stmt = self.session().prepare(cql.replace("{ks}", self.keyspace))
            self._prepared[cql] = stmt
        return stmt

    def execute(
        self, cql: str, params: Sequence[Any] = (), consistency: int | None = None,
    ) -> list[dict[str, Any]]:
        """Run a prepared statement (at `consistency` if given) and return all rows as dicts."""
        statement = self.prepare(cql).bind(params)
        if consistency is not None:
            statement.consistency_level = consistency
        with translate_errors():
            return list(self.session().execute(statement))

    def execute_async(self, cql: str, params: Sequence[Any] = (),
                      fetch_size: int | None = None) -> ResponseFuture:
        """Start a prepared statement; collect with results() (or results_iter() to page)."""
        statement = self.prepare(cql).bind(params)
        if fetch_size is not None:
            statement.fetch_size = fetch_size
        with translate_errors():
            return self.session().execute_async(statement)

    @staticmethod
    def results_iter(future: ResponseFuture) -> Iterator[dict[str, Any]]:
        """Rows of a future from execute_async, later pages fetched as they are consumed."""
        with translate_errors():
            yield from future.result()

    @staticmethod
    def results(futures: Sequence[ResponseFuture]) -> list[list[dict[str, Any]]]:
        """Wait for futures from execute_async, in order."""
        with translate_errors():
            return [list(f.result()) for f in futures]

    def execute_many(
        self, cql: str, params_list: Sequence[Sequence[Any]], concurrency: int = 64,
    ) -> list[tuple[bool, Any]]:
        """Run one prepared statement for many parameter tuples, at most `concurrency` in flight.
        Returns (success, rows or exception) per tuple, in order; one failure stops nothing."""
        if not params_list:
            return []
        with translate_errors():
            outcomes = execute_concurrent_with_args(
                self.session(), self.prepare(cql), params_list, concurrency=concurrency,
                raise_on_first_error=False)
        return [(ok, list(result) if ok else result) for ok, result in outcomes]

    def execute_batches(self, cql: str, groups: Sequence[Sequence[Sequence[Any]]],
                        concurrency: int = 32) -> list[tuple[bool, Any]]:
        """One UNLOGGED batch of the statement per group of parameter tuples (callers group by
        partition: a single-partition batch is one mutation for Cassandra and one round trip
        for the client). Returns (success, rows or exception) per group, in order."""
        return self.run_batches([[(cql, params) for params in group] for group in groups],
                                concurrency)

    def run_batches(self, batches: Sequence[Sequence[tuple[str, Sequence[Any]]]],
                    concurrency: int = 32) -> list[tuple[bool, Any]]:
        """Run UNLOGGED batches of (cql, params) statements, at most `concurrency` in flight.
        A batch of conditional statements on one partition is one Paxos round whose rows say
        whether it applied. Returns (success, rows or exception) per batch, in order; one
        failure stops nothing."""
        return self.start_batches(batches, concurrency).outcomes()

    def start_batches(self, batches: Sequence[Sequence[tuple[str, Sequence[Any]]]],
                      concurrency: int = 32) -> BatchRun:
        """run_batches, returning once the first `concurrency` batches are sent, so the caller
        can send other requests while they run; BatchRun.outcomes() finishes it."""
        def start(batch: Sequence[tuple[str, Sequence[Any]]]) -> ResponseFuture:
            statement = BatchStatement(batch_type=BatchType.UNLOGGED)
            for cql, params in batch:
                statement.add(self.prepare(cql), params)
            with translate_errors():
                return self.session().execute_async(statement)

        return BatchRun(start, batches, concurrency)

    def counter_batches(self, updates: Sequence[tuple[str, Sequence[Any]]],
                        per_batch: int = COUNTER_BATCH) -> list[ResponseFuture]:
        """Send counter updates in the batches counter_groups makes. Returns the futures."""
        return [self.counter_batch(group) for group in self.counter_groups(updates, per_batch)]

    def counter_groups(self, updates: Sequence[tuple[str, Sequence[Any]]],
                       per_batch: int = COUNTER_BATCH) -> list[list[tuple[str, Sequence[Any]]]]:
        """The updates in groups of at most per_batch updates and BATCH_PARTITIONS partitions
        (by each bound statement's partition key), one batch each."""
        keyed = [(update, self.prepare(update[0]).bind(update[1]).routing_key)
                 for update in updates]
        return [[update for update, _ in group]
                for group in packed(keyed, lambda u: u[1], per_batch, BATCH_PARTITIONS)]

    def counter_batch(self, updates: Sequence[tuple[str, Sequence[Any]]]) -> ResponseFuture:
        """Send counter updates as one request: a COUNTER batch, or a lone update as itself."""
        if len(updates) == 1:
            statement: Any = self.prepare(updates[0][0]).bind(updates[0][1])
        else:
            statement = BatchStatement(batch_type=BatchType.COUNTER)
            for cql, params in updates:
                statement.add(self.prepare(cql), params)
        with translate_errors():
            return self.session().execute_async(statement)

    def iterate(self, cql: str, params: Sequence[Any], fetch_size: int) -> Iterator[dict[str, Any]]:
        """Rows of a prepared statement, fetched page by page as the caller consumes them."""
        statement = self.prepare(cql).bind(params)
        statement.fetch_size = fetch_size
        with translate_errors():
            yield from self.session().execute(statement)

    def execute_raw(self, cql: str, timeout: float | None = None) -> list[dict[str, Any]]:
        """Run unprepared CQL (DDL, migrations); {ks} is replaced by the keyspace."""
        with translate_errors():
            return list(self.session().execute(
                cql.replace("{ks}", self.keyspace), timeout=timeout or 60.0))

    def shutdown(self) -> None:
        """Close the connection pool; the next call reconnects."""
        with self._lock:
            if self._cluster is not None:
                self._cluster.shutdown()
            self._cluster = self._session = None
            self._prepared.clear()
