"""`duetime-admin spark import EXPORT --topic T --restore`: bring back the messages of an export
(spark.export_job) into a topic, empty or not, idempotently.

Each message keeps its id, state, deliver_at, priority, campaign, group, attempts, last error,
times and payload (spark.rows.restored). A scheduled message waits for its due time again; a
leased one becomes scheduled at its lease's expiry (at least once: its consumer of the old
topic may have handled it); one whose time has passed is due at once. Delivered, cancelled
and dead messages come back as they were, with no pointer. An id the topic already has is
left alone, so restoring into the same topic, or twice, adds nothing. Counters, campaign
rows, bounds and per-state counts are kept as an import keeps them (spark.import_job).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from app.campaigns import manage as campaigns
from app.config import Config
from app.store import dead_letters
from app.store.dead_letters import MS_PER_WEEK
from spark import import_job
from spark import session as sessions
from spark.export_job import EXPORT_COLUMNS, LATER_COLUMNS
from spark.failures import JobFailure, require_input
from spark.progress import Progress
from spark.rows import ImportSettings, Reject, restored
from spark.usage import INPUT

TIMES = ("deliver_at", "due_at", "lease_expires_at", "created_at", "updated_at")
RESTORED = T.StructType([
    T.StructField("line", T.LongType()), T.StructField("reason", T.StringType()),
    T.StructField("raw", T.StringType()), T.StructField("id", T.StringType()),
    T.StructField("home", T.IntegerType()), T.StructField("shard", T.IntegerType()),
    T.StructField("bucket", T.LongType()), T.StructField("due_at", T.LongType()),
    T.StructField("deliver_at", T.LongType()), T.StructField("priority", T.IntegerType()),
    T.StructField("campaign", T.StringType()), T.StructField("delivery_group", T.StringType()),
    T.StructField("content_hash", T.StringType()), T.StructField("payload", T.BinaryType()),
    T.StructField("encoding", T.StringType()),
    T.StructField("headers", T.MapType(T.StringType(), T.StringType())),
    T.StructField("created_at", T.LongType()), T.StructField("updated_at", T.LongType()),
    T.StructField("state", T.StringType()), T.StructField("attempts", T.IntegerType()),
    T.StructField("last_error", T.StringType()), T.StructField("ttl", T.IntegerType()),
    T.StructField("spread", T.IntegerType()), T.StructField("payload_ttl", T.IntegerType()),
    T.StructField("recipient", T.StringType()),
    T.StructField("labels", T.MapType(T.StringType(), T.StringType())),
    T.StructField("timezone", T.StringType()),
])
_FIELDS = [f.name for f in RESTORED.fields[3:]]


def read_export(spark: SparkSession, path: str) -> DataFrame:
    """An export's rows, times as epoch ms. JobFailure when the files are not an export."""
    require_input(spark, path)
    df = spark.read.parquet(path)
    for name in LATER_COLUMNS:
        if name not in df.columns:
            df = df.withColumn(name, F.lit(None).cast(
                "map<string,string>" if name == "labels" else "string"))
    missing = [c for c in EXPORT_COLUMNS if c not in df.columns]
    if missing:
        raise JobFailure(INPUT, f"{path} is not a duetime export "
                         f"(`duetime-admin spark export`): no column {', '.join(missing)}")
    return df.select(*[F.unix_millis(c).alias(c) if c in TIMES else F.col(c)
                       for c in EXPORT_COLUMNS])


def _transform(settings: ImportSettings,
               rows: Iterable[tuple[Any, int]]) -> Iterator[tuple[Any, ...]]:
    for row, line in rows:
        raw = row.asDict()
        try:
            out = restored(raw, settings)
            yield (line + 1, None, None, *(out[f] for f in _FIELDS))
        except Reject as reason:
            yield (line + 1, str(reason), repr({k: v for k, v in raw.items() if k != "payload"}),
                   *([None] * len(_FIELDS)))


def record_dead(config: Config, dead: DataFrame) -> None:
    """The dead-letter rows of restored dead messages (app.store.dead_letters), dead at
    their updated_at."""
    rows = dead.select("topic_uid", (F.col("updated_at") / MS_PER_WEEK).cast("long").alias("week"),
                       F.timestamp_millis("updated_at").alias("dead_at"), "id",
                       F.lit(dead_letters.ttl_s(config.retention_days)).alias("ttl"))
    import_job.save(rows, config, "dead_letters", ttl="ttl")


def run(args: argparse.Namespace) -> dict[str, Any]:
    # state rows are written at this time: every change the API makes from now on wins
    # over them, and every change before it is seen by only_new (an id the topic has);
    # a row deleted before it (a loss being mended) comes back
    writetime_us = time.time_ns() // 1000
    config, services, topic = sessions.open_topic(args.tenant, args.topic)
    spark = sessions.build(config, f"duetime-restore-{args.topic}")
    began = time.monotonic()
    with Progress(spark.sparkContext) as progress:
        progress.enter(f"reading the export {args.file}")
        settings = ImportSettings(topic, None, services.clock(), config.max_payload_bytes,
                                  config.horizon_days, config.retention_days, config.bucket_ms)
        parsed = spark.createDataFrame(read_export(spark, args.file).rdd.zipWithIndex()
                                       .mapPartitions(lambda rows: _transform(settings, rows)),
                                       RESTORED).persist()
        good = parsed.filter(F.col("reason").isNull()).drop("line", "reason", "raw")
        progress.enter("looking up ids the topic already has")
        new = import_job.only_new(spark, config, topic, good).persist()
        campaigns.refuse_import(services, topic, import_job.campaign_names(new))
        waiting = new.filter(F.col("state") == "scheduled")
        settled = new.filter(F.col("state") != "scheduled")
        groups = [(r["bucket"], r["shard"], r["count"])
                  for r in waiting.groupBy("bucket", "shard").count().collect()]
        progress.enter(f"reserving pointer slots for {len(groups)} (bucket, shard) groups")
        placed = import_job.with_parts(
            spark, waiting, import_job.reserve_slots(services, topic, groups),
            config.partition_cap).persist()
        import_job.load(progress, config, placed, settled, writetime_us)
        progress.enter("listing the dead messages")
        record_dead(config, settled.filter(F.col("state") == "dead"))
        warnings = import_job.count(services, topic, placed, groups, settled)
        progress.enter("placing again what came due while the restore wrote")
        import_job.place_late(services, topic, placed)
        by_state = {r["state"]: r["count"] for r in new.groupBy("state").count().collect()}
        rejected, rejects_replaced = import_job.write_rejects(
            spark, progress, parsed, parsed.limit(0).select("line", "reason", "raw"),
            args.rejects)
        rows = parsed.count()
    elapsed = time.monotonic() - began
    restored_count = sum(by_state.values())
    summary = {"rows": rows, "rejected": rejected, "restored": restored_count,
               "already_present": rows - rejected - restored_count, "by_state": by_state,
               "seconds": round(elapsed, 2), "rejects": args.rejects,
               "rejects_replaced": rejects_replaced, "warnings": warnings}
    spark.stop()
    services.close()
    return summary
