"""How a Spark job of duetime ends: its JSON summary on stdout and exit 0, or one line on
stderr saying what is wrong and the exit code of spark.usage.EXIT_CODES, never a Python or
Java stack trace for a failure a person can fix (a missing file, a topic, a master, a node).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark import SparkContext
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from app.errors import StoreUnavailable
from spark.usage import CASSANDRA, INPUT, MASTER

MASTER_CONNECT_S = 5.0
S3A_HELP = ("s3a:// URLs need hadoop-aws on the classpath: `make spark-s3a` fetches it "
            "(hadoop-aws 3.3.4 and its AWS SDK bundle, ~280 MB) into var/spark/jars")


class JobFailure(Exception):
    """A failure with its exit code and the one line that says what is wrong."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code, self.line = code, line


def _first_line(text: str) -> str:
    return next((t.strip() for t in text.splitlines() if t.strip()), text).removeprefix(
        "[PATH_NOT_FOUND] ")


def classify(exc: BaseException) -> JobFailure | None:
    """The failure an exception of Spark, Py4J or the store means, or None (a bug: its stack
    trace is shown)."""
    if isinstance(exc, JobFailure):
        return exc
    if isinstance(exc, StoreUnavailable):
        return JobFailure(CASSANDRA, f"{exc.detail} (Cassandra cannot be reached: see "
                          "DUETIME_CONTACT_POINTS and DUETIME_CQL_PORT)")
    if isinstance(exc, AnalysisException) and exc.getErrorClass() == "PATH_NOT_FOUND":
        return JobFailure(INPUT, f"no input: {_first_line(str(exc))}")
    text = str(exc.java_exception) if isinstance(exc, Py4JJavaError) else str(exc)
    if isinstance(exc, Py4JJavaError):
        text += "\n" + "\n".join(_causes(exc))
    if "S3AFileSystem" in text and "ClassNotFound" in text:
        return JobFailure(INPUT, S3A_HELP)
    for marker in ("No FileSystem for scheme", "is not a Parquet file"):
        if marker in text:
            return JobFailure(INPUT, "the input cannot be read: " + _first_line(
                text[text.index(marker):]))
    if "Failed to open native connection to Cassandra" in text:
        return JobFailure(CASSANDRA, "Cassandra cannot be reached from Spark: " + _first_line(
            text[text.index("Failed to open"):]))
    return None


def _causes(exc: Py4JJavaError) -> list[str]:
    """The messages of the Java exception's causes (the reason is often the innermost)."""
    out: list[str] = []
    try:
        cause = exc.java_exception.getCause()
        while cause is not None and len(out) < 10:
            out.append(str(cause.toString()))
            cause = cause.getCause()
    except Py4JError:  # the JVM has gone: the exception's own text is all there is
        pass
    return out


def check_master(master: str, timeout_s: float = MASTER_CONNECT_S) -> None:
    """Raise JobFailure(MASTER) unless a TCP connection to the master (spark://host:port, any
    of a comma-separated list, or k8s://URL) opens within timeout_s: Spark itself would retry
    for a minute, then fail with a page of Java stack traces. Other masters are not checked."""
    if master.startswith("spark://"):
        places = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1]) if ":" in h else 7077)
                  for h in master.removeprefix("spark://").split(",")]
    elif master.startswith("k8s://"):
        url = urlsplit(master.removeprefix("k8s://"))
        places = [(url.hostname or "", url.port or (443 if url.scheme == "https" else 80))]
    else:
        return
    errors = []
    for host, port in places:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    raise JobFailure(MASTER, f"the Spark master {master} cannot be reached ({'; '.join(errors)})")


def require_input(spark: SparkSession, path: str) -> None:
    """JobFailure(INPUT) unless path (a file or folder, any Hadoop URL) exists: asked of its
    file system first, since a reader that cannot find it logs a Java stack trace."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    try:
        fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        found = fs.exists(hadoop_path)
    except Py4JJavaError as exc:  # the file system's own failure: a store, a credential
        raise classify(exc) or JobFailure(INPUT, "the input cannot be read: " + _first_line(
            str(exc.java_exception))) from None
    if not found:
        raise JobFailure(INPUT, f"no input: nothing at {path}")


def end(run: Callable[[], dict[str, Any]]) -> int:
    """Run a job: print its summary and return 0, or print the failure's line and return its
    code (stopping Spark, so the process ends)."""
    try:
        summary = run()
    except Exception as exc:
        failure = classify(exc)
        if failure is None:
            raise
        active = SparkContext._active_spark_context
        if active is not None:
            with contextlib.suppress(Py4JError):
                active.stop()
        print(failure.line, file=sys.stderr, flush=True)
        return failure.code
    print(json.dumps(summary, default=str), flush=True)
    return 0
