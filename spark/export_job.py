"""`duetime-admin spark export`: a topic's messages, in every state, to Parquet, for a backup that
lives beyond the cluster or a move to another topic (`duetime-admin spark import --restore`).

One row a message (EXPORT_COLUMNS): its id, state, times, priority, campaign, group,
attempts, last error, payload (bytes, encoding, headers), recipient, labels and timezone.
A leased message is written as leased with its lease's expiry; restoring it makes it
scheduled again at that time (the lease itself, held by a consumer of the old topic, does
not travel).

A message's home is any of 2^20 partitions, so the job reads the whole message_states table,
token range by token range in parallel, and keeps the topic's rows: its cost follows the
table's size, not the topic's. Payloads are read by key (a direct join). What changes while
the job runs may or may not be in the export; a message is never in it twice.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.config import Config
from app.models import Topic
from spark import failures, usage
from spark import session as sessions
from spark.progress import Progress

EXPORT_COLUMNS = ("id", "state", "deliver_at", "due_at", "lease_expires_at", "priority",
                  "campaign", "group", "attempts", "last_error", "created_at", "updated_at",
                  "payload", "encoding", "headers", "content_hash", "recipient", "labels",
                  "timezone")
# columns an export made before they existed lacks: a restore reads them as null
LATER_COLUMNS = ("recipient", "labels", "timezone")


def topic_messages(spark: SparkSession, config: Config, topic: Topic) -> DataFrame:
    """Every message of the topic with its payload, in EXPORT_COLUMNS."""
    states = sessions.table(spark, config, "message_states").filter(
        F.col("topic_uid") == F.lit(str(topic.uid)))
    bodies = sessions.table(spark, config, "message_bodies", directJoinSetting="on").select(
        "topic_uid", "home", "id", "content_hash", "payload", "encoding", "headers")
    joined = states.join(bodies, ["topic_uid", "home", "id", "content_hash"], "left")
    return joined.select(
        "id", "state", "deliver_at", "due_at", "lease_expires_at", "priority", "campaign",
        F.col("delivery_group").alias("group"), "attempts", "last_error", "created_at",
        "updated_at", "payload", "encoding", "headers", "content_hash", "recipient",
        "labels", "timezone")


def run(args: argparse.Namespace) -> dict[str, Any]:
    config, services, topic = sessions.open_topic(args.tenant, args.topic)
    # the payload lookups of a task run this many at once (the connector's 512 overran its
    # one connection per node while the scan's own reads were in flight)
    spark = sessions.build(config, f"duetime-export-{args.topic}",
                           **{"spark.cassandra.concurrent.reads": "64"})
    began = time.monotonic()
    with Progress(spark.sparkContext) as progress:
        progress.enter(f"reading the messages of {args.topic}")
        messages = topic_messages(spark, config, topic).persist()
        by_state = {r["state"]: r["count"] for r in messages.groupBy("state").count().collect()}
        progress.enter(f"writing {sum(by_state.values())} messages to {args.out}")
        messages.write.mode("overwrite").option("compression", "zstd").parquet(args.out)
        missing = messages.filter(F.col("payload").isNull()).count()
    elapsed = time.monotonic() - began
    spark.stop()
    services.close()
    return {"messages": sum(by_state.values()), "by_state": by_state,
            "without_payload": missing, "out": args.out, "seconds": round(elapsed, 2)}


def main(argv: list[str]) -> int:
    args = usage.export_parser().parse_args(argv)
    return failures.end(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
