"""What an import does with a row whose id the topic already has (`--if-exists`, as the API's
`if_exists`): reject (default) imports nothing and lists it in the rejects file when its
content differs; keep imports nothing; replace rewrites a scheduled message through the API's
own conditional write (app.messages.enqueue, one version or the other, never a mix). A row with the
same content as the message is already present in every mode."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.messages.by_id import MOVABLE
from app.messages.enqueue import NewMessage, enqueue
from app.models import Payload, Topic
from app.services import Services
from spark.usage import IF_EXISTS

MODES = IF_EXISTS
REPLACE_CHUNK = 200
REPLACERS = 8


def differing(present: DataFrame) -> DataFrame:
    """Rows of ids the topic has, whose content differs from the message's."""
    return present.filter(F.col("present_hash") != F.col("content_hash"))


def refused(present: DataFrame, mode: str) -> DataFrame:
    """Rows the mode refuses, as rejects (line, reason, raw): other content under reject;
    under replace, a message no longer waiting (leased or finished), as the API's replace."""
    other = differing(present)
    if mode == "reject":
        reason = F.lit("id exists with other content (if_exists reject)")
    elif mode == "replace":
        other = other.filter(~F.col("present_state").isin(*MOVABLE))
        reason = F.concat(F.lit("id is "), F.col("present_state"),
                          F.lit("; only a scheduled or paused message is replaced"))
    else:
        return other.limit(0).select(F.col("line"), F.lit("").alias("reason"),
                                     F.lit(None).cast("string").alias("raw"))
    return other.select("line", reason.alias("reason"), F.lit(None).cast("string").alias("raw"))


def to_replace(present: DataFrame, mode: str) -> DataFrame:
    """Rows replace rewrites: other content, message still waiting (scheduled or paused: a
    paused one stays paused)."""
    if mode != "replace":
        return present.limit(0)
    return differing(present).filter(F.col("present_state").isin(*MOVABLE))


def _new_message(r: Any) -> NewMessage:
    return NewMessage(id=r["id"], deliver_at_ms=r["deliver_at"], priority=r["priority"],
                      campaign=r["campaign"],
                      payload=Payload(bytes(r["payload"]), r["encoding"], {}),
                      content_hash=r["content_hash"], if_exists="replace",
                      requested_ms=r["requested_at"])


def replace(spark: SparkSession, services: Services, topic: Topic, rows: DataFrame
            ) -> tuple[int, DataFrame]:
    """Replace each row's message (on the driver, REPLACE_CHUNK per call of the API's
    enqueue, REPLACERS at a time): (how many were replaced, rejects for those refused, e.g.
    leased since the lookup)."""
    def one(chunk: list[Any]) -> list[tuple[int, str | None]]:
        results = enqueue(services, topic, [_new_message(r) for r in chunk])
        return [(r["line"], None if res.status == 200 or res.error is None
                 else f"replace refused ({res.status}): {res.error.detail}")
                for r, res in zip(chunk, results, strict=True)]

    chunks: list[list[Any]] = [[]]
    for r in rows.toLocalIterator():
        if len(chunks[-1]) == REPLACE_CHUNK:
            chunks.append([])
        chunks[-1].append(r)
    with ThreadPoolExecutor(REPLACERS) as pool:
        outcomes = [o for done in pool.map(one, [c for c in chunks if c]) for o in done]
    failed = [(line, reason, None) for line, reason in outcomes if reason is not None]
    rejects = spark.createDataFrame(failed, "line long, reason string, raw string")
    return len(outcomes) - len(failed), rejects
