"""`duetime-admin spark import`: bulk scheduling from a file, written as the API would write it.

extract (CSV, JSON lines or Parquet) → transform (spark.rows, the API's own checks and app's
bucket/shard/id code) → load (the connector). Steps:
1. validate every row; bad rows go to the rejects file with their reason, good rows go on;
2. drop rows whose id repeats an earlier line, and ids the topic already has (a direct join
   on the message_states key): a re-run or a retried task adds nothing; a row whose id the
   topic has with other content is rejected, kept or replaced (`--if-exists`, spark.if_exists);
3. reserve pointer slots per (bucket, shard) with the API's LWT (TimelineStore.reserve_slots),
   so no partition ever holds more than DUETIME_PARTITION_CAP pointers;
4. write payloads, then pointers, then state rows (the API's order: a state row never exists
   without its pointer), then the campaign index, activity markers and counters.
State rows are plain writes with write time IMPORT_WRITETIME_US, below any LWT ballot: a
re-run can never overwrite (resurrect) a message the service has since moved.
The command that runs it: spark.import_command.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from app.campaigns import manage as campaigns
from app.config import Config
from app.core.timeline import LANE_STRIDE, LANES, MS_PER_MINUTE
from app.delivery.wakeups import due_kind
from app.errors import StoreUnavailable
from app.models import Pointer, Topic
from app.services import Services
from spark import if_exists
from spark import session as sessions
from spark.failures import JobFailure, require_input
from spark.progress import Progress
from spark.rows import ImportSettings, Reject, to_message
from spark.usage import INPUT

IMPORT_WRITETIME_US = 1
RESERVERS = 16
LATE_CHUNK = 1000  # pointers placed again per write from the driver

PARSED = T.StructType([
    T.StructField("line", T.LongType()), T.StructField("reason", T.StringType()),
    T.StructField("raw", T.StringType()), T.StructField("id", T.StringType()),
    T.StructField("shard", T.IntegerType()), T.StructField("bucket", T.LongType()),
    T.StructField("due_at", T.LongType()), T.StructField("deliver_at", T.LongType()),
    T.StructField("priority", T.IntegerType()), T.StructField("campaign", T.StringType()),
    T.StructField("content_hash", T.StringType()), T.StructField("payload", T.BinaryType()),
    T.StructField("encoding", T.StringType()), T.StructField("created_at", T.LongType()),
    T.StructField("ttl", T.IntegerType()), T.StructField("payload_ttl", T.IntegerType()),
    T.StructField("spread", T.IntegerType()), T.StructField("home", T.IntegerType()),
    T.StructField("recipient", T.StringType()),
    T.StructField("labels", T.MapType(T.StringType(), T.StringType())),
    T.StructField("timezone", T.StringType()),
    T.StructField("requested_at", T.LongType()),
])


def read_file(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    """The rows of a file or folder in fmt (spark.usage.FORMATS): CSV with a header row and
    RFC 4180 quoting, JSON lines, or Parquet; every column as text. JobFailure when there is
    no such file, or JSON lines are not JSON."""
    require_input(spark, path)
    if fmt == "parquet":
        df = spark.read.parquet(path)
    elif fmt == "json":
        df = spark.read.json(path, primitivesAsString=True)
        if df.columns == ["_corrupt_record"]:
            raise JobFailure(INPUT, f"{path} is not JSON lines (one object a line): "
                             "give --format")
    else:
        # RFC 4180 quoting: a quote inside a quoted field is doubled (a JSON payload column)
        df = (spark.read.option("header", True).option("mode", "PERMISSIVE")
              .option("escape", '"').csv(path))
    return df.select([F.col(c).cast("string").alias(c) for c in df.columns])


# a row's line in its file: CSV's first data row is line 2 (the header is line 1); JSON
# lines and Parquet (whose "line" is the row number) start at 1
FIRST_LINE = {"csv": 2, "json": 1, "parquet": 1}


def as_input(fmt: str, columns: list[str], values: Any) -> str:
    """A row as its input had it: a CSV line (fields in the header's order, RFC 4180 quoting)
    for CSV, else a JSON object (Parquet's and JSON lines' values as text)."""
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow(["" if v is None else v for v in values])
        return out.getvalue()
    return json.dumps(dict(zip(columns, values, strict=True)), default=str)


def _transform(settings: ImportSettings, fmt: str, columns: list[str], rows: Any) -> Any:
    first = FIRST_LINE[fmt]
    for values, index in rows:
        raw = dict(zip(columns, values, strict=True))
        line, text = index + first, as_input(fmt, columns, values)
        try:
            out = to_message(raw, settings)
            yield (line, None, text, out["id"], out["shard"], out["bucket"], out["due_at"],
                   out["deliver_at"], out["priority"], out["campaign"], out["content_hash"],
                   out["payload"], out["encoding"], out["created_at"], out["ttl"],
                   out["payload_ttl"], out["spread"], out["home"], out["recipient"],
                   out["labels"], out["timezone"], out["requested_at"])
        except Reject as reason:
            yield (line, str(reason), text) + (None,) * (len(PARSED.fields) - 3)


def validate(spark: SparkSession, raw: DataFrame, settings: ImportSettings, fmt: str
             ) -> DataFrame:
    """Every row checked: (line, reason, raw, the message's columns); reason is None for a
    good row, raw is the row as in the input (as_input)."""
    columns = raw.columns
    parsed = raw.rdd.map(tuple).zipWithIndex().mapPartitions(
        lambda rows: _transform(settings, fmt, columns, rows))
    return spark.createDataFrame(parsed, PARSED)


def write_rejects(spark: SparkSession, progress: Progress, parsed: DataFrame,
                  refused: DataFrame, folder: str) -> tuple[int, bool]:
    """The rejects CSV (line, reason, raw) in folder, in line order: rows that failed the
    checks and the refused (duplicates, --if-exists), with their input row from parsed.
    Replaces what an earlier run wrote there, and says so. Returns (rejects, replaced)."""
    rejects = parsed.filter(F.col("reason").isNotNull()).select("line", "reason", "raw") \
        .unionByName(refused.drop("raw").join(parsed.select("line", "raw"), "line", "left")) \
        .orderBy("line").persist()
    replaced = exists(spark, folder)
    progress.enter(f"writing rejects to {folder}"
                   + (" (replacing those of an earlier run)" if replaced else ""))
    # RFC 4180, as the input: a quote inside a field is doubled (Spark's default is \")
    rejects.coalesce(1).write.mode("overwrite").option("header", True).option(
        "escape", '"').csv(folder)
    return rejects.count(), replaced


def exists(spark: SparkSession, path: str) -> bool:
    """Whether a file or folder is at path (any Hadoop URL)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return bool(hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
                .exists(hadoop_path))


def split_duplicates(good: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(first line of each id, later lines of an id already seen, as rejects)."""
    first = Window.partitionBy("id").orderBy("line")
    ranked = good.withColumn("first_line", F.first("line").over(first))
    dups = ranked.filter(F.col("line") != F.col("first_line")).select(
        "line", F.concat(F.lit("duplicate of line "), F.col("first_line")).alias("reason"),
        F.lit(None).cast("string").alias("raw"))
    return ranked.filter(F.col("line") == F.col("first_line")).drop("first_line"), dups


def lookup(spark: SparkSession, config: Config, topic: Topic, good: DataFrame
           ) -> tuple[DataFrame, DataFrame]:
    """(rows whose id the topic does not have yet, rows whose id it has, with that message's
    present_state and present_hash), by a direct join: key lookups, no table scan."""
    keyed = good.withColumn("topic_uid", F.lit(str(topic.uid)))
    # a plain projection of the table: anything computed on its side defeats the direct join
    present = sessions.table(spark, config, "message_states", directJoinSetting="on").select(
        "topic_uid", "home", "id", F.col("state").alias("present_state"),
        F.col("content_hash").alias("present_hash"))
    joined = keyed.join(present, ["topic_uid", "home", "id"], "left")
    new = joined.filter(F.col("present_state").isNull()).drop("present_state", "present_hash")
    return new, joined.filter(F.col("present_state").isNotNull())


def only_new(spark: SparkSession, config: Config, topic: Topic, good: DataFrame) -> DataFrame:
    """Rows whose id the topic does not have yet."""
    return lookup(spark, config, topic, good)[0]


def reserve_slots(services: Services, topic: Topic, groups: list[tuple[int, int, int]]
                  ) -> list[tuple[int, int, int]]:
    """(bucket, shard, first slot) for each (bucket, shard, count), by the API's LWT."""
    def one(group: tuple[int, int, int]) -> tuple[int, int, int]:
        bucket, shard, count = group
        return bucket, shard, services.timeline.reserve_slots(topic.uid, bucket, shard, count)

    with ThreadPoolExecutor(RESERVERS) as pool:
        return list(pool.map(one, groups))


def with_parts(spark: SparkSession, new: DataFrame, firsts: list[tuple[int, int, int]],
               partition_cap: int) -> DataFrame:
    slots = spark.createDataFrame(firsts, "bucket long, shard int, first_slot int")
    order = Window.partitionBy("bucket", "shard").orderBy("id")
    group = F.coalesce(F.col("delivery_group"), F.col("campaign"))
    return (new.join(F.broadcast(slots), ["bucket", "shard"])
            .withColumn("slot", F.col("first_slot") + F.row_number().over(order) - 1)
            .withColumn("part", lane(group) * LANE_STRIDE
                        + (F.col("slot") / partition_cap).cast("int")))


def lane(group: Any) -> Any:
    """app.core.timeline.lane_of of a message's group (its `group`, else its campaign): Spark's
    crc32 is the same CRC-32 as app.core.timeline.stable_hash."""
    return (F.when(group.isNull(), F.lit(0))
            .otherwise(F.lit(1) + F.crc32(group) % (LANES - 1)).cast("int"))


def as_new(rows: DataFrame) -> DataFrame:
    """Rows of a file as new messages: scheduled, no attempt yet, no error, no group."""
    return (rows.withColumn("state", F.lit("scheduled"))
            .withColumn("attempts", F.lit(0))
            .withColumn("last_error", F.lit(None).cast("string"))
            .withColumn("delivery_group", F.lit(None).cast("string"))
            .withColumn("updated_at", F.col("created_at"))
            .withColumn("headers", F.lit(None).cast("map<string,string>")))


def save(df: DataFrame, config: Config, table: str, **options: str) -> None:
    (df.write.format(sessions.CASSANDRA_FORMAT).mode("append")
     .options(keyspace=config.keyspace, table=table, **options).save())


def _every(placed: DataFrame, settled: DataFrame | None) -> DataFrame:
    """The rows of a run: placed (with pointers), and settled ones when a restore has them."""
    return placed if settled is None else placed.unionByName(settled, allowMissingColumns=True)


def load(progress: Progress, config: Config, placed: DataFrame,
         settled: DataFrame | None = None, writetime_us: int = IMPORT_WRITETIME_US) -> None:
    """Write messages as the API would: placed are scheduled rows with their pointer's
    columns (bucket, shard, part); settled are rows in an end state (delivered, cancelled,
    dead: a restore), which get their payload and state row, and no pointer. Payloads first,
    then lanes and pointers, then state rows (at writetime_us, below any LWT made after it),
    then the campaign index."""
    ms = F.timestamp_millis
    every = _every(placed, settled)
    progress.enter("writing payloads")
    save(every.select("topic_uid", "home", "id", "content_hash", "payload", "encoding", "headers",
                      F.col("payload_ttl").alias("ttl")), config, "message_bodies", ttl="ttl")
    progress.enter("recording lanes")
    lanes = placed.filter(F.col("part") >= LANE_STRIDE).groupBy(
        "topic_uid", "bucket", "shard", "part").agg(F.max("ttl").alias("ttl"))
    save(lanes, config, "bucket_lanes", ttl="ttl")  # before their pointers: readers' way in
    progress.enter("writing timeline pointers")
    pointers = placed.select("topic_uid", "bucket", "shard", "part", ms("due_at").alias("due_at"),
                             "id", F.lit(1).alias("version"), "priority", "ttl")
    save(pointers.repartition("bucket", "shard", "part").sortWithinPartitions(
        "bucket", "shard", "part"), config, "timeline", ttl="ttl")
    progress.enter("writing message states")
    states = every.select(
        "topic_uid", "home", "id", "state", F.lit(1).alias("version"),
        ms("due_at").alias("due_at"), ms("deliver_at").alias("deliver_at"), "priority",
        "campaign", "delivery_group", "shard", "attempts", "last_error", "content_hash",
        ms("created_at").alias("created_at"), ms("updated_at").alias("updated_at"), "ttl",
        "recipient", "labels", "timezone", F.lit(writetime_us).cast("long").alias("wt"),
        # the deliver_at a row asked for when the send window moved it (an import's rows;
        # a restore's carry none)
        (ms("requested_at") if "requested_at" in every.columns
         else F.lit(None).cast("timestamp")).alias("requested_at"))
    save(states, config, "message_states", ttl="ttl", writetime="wt")
    progress.enter("writing the campaign index")
    campaigns = every.filter(F.col("campaign").isNotNull()).select(
        "topic_uid", "campaign", "spread", "id", "ttl")
    save(campaigns, config, "campaign_messages", ttl="ttl")


def place_late(services: Services, topic: Topic, placed: DataFrame) -> int:
    """The pointers this run wrote that came due while it wrote: the walk may have passed
    them, so each is placed again, due now, from the driver, LATE_CHUNK at a time
    (PointerPlacer.again_if_late), after the rows and counts are written. Returns how many;
    raises StoreUnavailable for one that could not be."""
    before = services.placer.cluster_now() - services.config.safety_lag_ms // 2
    late = placed.filter(F.col("due_at") < before).select(
        "id", "shard", "priority", "part", "due_at").toLocalIterator()
    placed_again = 0
    while chunk := [Pointer(r["due_at"], r["id"], 1, r["priority"], r["shard"],
                            r["part"] // LANE_STRIDE) for r in itertools.islice(late, LATE_CHUNK)]:
        stuck = services.placer.again_if_late(topic.uid, chunk, topic.pushed)
        if stuck:
            raise StoreUnavailable(f"{len(stuck)} pointers written late could not be placed "
                                   "again")
        placed_again += len(chunk)
    return placed_again


def campaign_names(new: DataFrame) -> list[str]:
    """The campaigns the rows to import carry (a handful: collected on the driver)."""
    return sorted(r["campaign"] for r in new.select("campaign").distinct().collect()
                  if r["campaign"] is not None)


def count(services: Services, topic: Topic, placed: DataFrame,
          groups: list[tuple[int, int, int]], settled: DataFrame | None = None) -> list[str]:
    """Counters and activity markers the API keeps, and the campaigns' rows, bounds and
    counters, for the rows this run added (placed: scheduled, with pointers; settled: in an
    end state); returns warnings (app.campaigns.manage.record_import)."""
    every = _every(placed, settled)
    per_minute = {r["minute"]: r["n"] for r in placed.groupBy(
        (F.col("due_at") / MS_PER_MINUTE).cast("long").alias("minute")).count()
        .withColumnRenamed("count", "n").collect()}
    services.counts.add_states(topic.uid, {
        r["state"]: r["count"] for r in every.groupBy("state").count().collect()})
    services.counts.add_upcoming_per_minute(topic.uid, per_minute)
    services.timeline.mark_active(topic.uid, sorted({b for b, _, _ in groups}),
                                  services.config.bucket_ms, services.clock())
    uncounted = services.timeline.count_writes(topic.uid, {(b, s): n for b, s, n in groups})
    if uncounted:  # the walk would not read them behind its positions: the job fails, a rerun
        raise next(iter(uncounted.values()))  # of it counts them again
    if topic.pushed:  # and their walk of what is due soon (sent at services.close())
        services.waker.wake(due_kind(topic.uid))
    carrying = every.filter(F.col("campaign").isNotNull())
    added = {r["campaign"]: (r["n"], r["first"], r["last"]) for r in carrying.groupBy(
        "campaign").agg(F.count("*").alias("n"), F.min("deliver_at").alias("first"),
                        F.max("deliver_at").alias("last")).collect()}
    states: dict[str, dict[str, int]] = {}
    for r in carrying.groupBy("campaign", "state").count().collect():
        states.setdefault(r["campaign"], {})[r["state"]] = r["count"]
    return campaigns.record_import(services, topic, added, states)


def run(args: argparse.Namespace) -> dict[str, Any]:
    config, services, topic = sessions.open_topic(args.tenant, args.topic)
    spark = sessions.build(config, f"duetime-import-{args.topic}")
    began = time.monotonic()
    with Progress(spark.sparkContext) as progress:
        progress.enter(f"validating {args.file}")
        settings = ImportSettings(topic, args.campaign, services.clock(), config.max_payload_bytes,
                                  config.horizon_days, config.retention_days, config.bucket_ms)
        parsed = validate(spark, read_file(spark, args.file, args.format), settings,
                          args.format).persist()
        good, dups = split_duplicates(parsed.filter(F.col("reason").isNull()).drop("raw"))
        progress.enter("looking up ids the topic already has")
        new, present = lookup(spark, config, topic, good)
        new, present = new.persist(), present.persist()
        campaigns.refuse_import(services, topic, campaign_names(new))
        groups = [(r["bucket"], r["shard"], r["count"])
                  for r in new.groupBy("bucket", "shard").count().collect()]
        progress.enter(f"reserving pointer slots for {len(groups)} (bucket, shard) groups")
        placed = with_parts(spark, as_new(new), reserve_slots(services, topic, groups),
                            config.partition_cap).persist()
        load(progress, config, placed)
        warnings = count(services, topic, placed, groups)
        progress.enter("placing again what came due while the import wrote")
        placed_again = place_late(services, topic, placed)
        replaced, unreplaced = 0, if_exists.refused(present, args.if_exists)
        if args.if_exists == "replace":
            progress.enter("replacing scheduled messages whose content changed")
            replaced, late = if_exists.replace(
                spark, services, topic, if_exists.to_replace(present, args.if_exists))
            unreplaced = unreplaced.unionByName(late)
        rejected, rejects_replaced = write_rejects(spark, progress, parsed,
                                                   dups.unionByName(unreplaced), args.rejects)
        totals = Counter({"rows": parsed.count(), "rejected": rejected,
                          "imported": sum(n for _, _, n in groups), "replaced": replaced})
    elapsed = time.monotonic() - began
    summary = {**totals, "already_present": totals["rows"] - totals["rejected"]
               - totals["imported"] - totals["replaced"], "seconds": round(elapsed, 2),
               "rows_per_s": round(totals["rows"] / elapsed, 1), "rejects": args.rejects,
               "rejects_replaced": rejects_replaced,
               "placed_again": placed_again,
               "warnings": warnings}
    spark.stop()
    services.close()
    return summary
