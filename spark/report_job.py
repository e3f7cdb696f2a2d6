"""`duetime-admin spark report`: what is coming and how delivery went, read from the live tables.

For one topic (optionally one campaign): messages per state, scheduled messages overdue (due
before the report's time, `as_of`) and upcoming (due from then on) per minute and per hour,
delivery lag percentiles per campaign (lag = when the message was marked delivered minus
its deliver_at, in ms), the attempts distribution, and the campaign funnel (per campaign and
minute: messages that entered, and that ended delivered, dead or cancelled), and the
audience: messages per label (key, value) and state, per time zone (the message's own, else
the topic's) and state, and distinct recipients per state; the summary adds the messages a
frequency cap deferred and dropped (the counters /stats shows). Each metric is
written as Parquet and CSV under OUT/<metric>/, plus OUT/index.html with PNG charts. Prints a
JSON summary last. Times are UTC: Parquet timestamps, RFC 3339 text in the CSV, the summary
and the page (a per-minute or per-hour row is labelled by the time it starts, `starts_at`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from app.config import Config
from app.core.frequency_cap import capped_counts
from app.core.timeline import MS_PER_HOUR, MS_PER_MINUTE
from app.messages.zones import DEFAULT_ZONE
from spark import charts, failures, usage
from spark import session as sessions
from spark.progress import Progress


def messages_of(spark: Any, config: Config, topic_uid: str, campaign: str | None,
                default_zone: str = DEFAULT_ZONE) -> DataFrame:
    """The topic's state rows (`zone`: the message's own timezone, else default_zone, the
    topic's). Their partition key is (topic_uid, id), so this is a scan of
    the table filtered by topic: the price of analytics on the live table."""
    df = sessions.table(spark, config, "message_states").filter(F.col("topic_uid") == topic_uid)
    if campaign:
        df = df.filter(F.col("campaign") == campaign)
    ms = F.unix_millis
    return df.select("id", "state", "attempts", "campaign", ms("due_at").alias("due_at_ms"),
                     ms("deliver_at").alias("deliver_at_ms"),
                     ms("created_at").alias("created_at_ms"),
                     ms("updated_at").alias("updated_at_ms"), "recipient", "labels",
                     F.coalesce("timezone", F.lit(default_zone)).alias("zone"))


def state_counts(df: DataFrame) -> DataFrame:
    return df.groupBy("state").count().orderBy("state")


def upcoming(df: DataFrame, now_ms: int, slot_ms: int) -> DataFrame:
    """Scheduled messages due from now_ms on, per time slot (slot = epoch ms // slot_ms);
    those due before are overdue()."""
    return (df.filter((F.col("state") == "scheduled") & (F.col("due_at_ms") >= now_ms))
            .groupBy((F.col("due_at_ms") / slot_ms).cast("long").alias("slot"))
            .count().orderBy("slot"))


def overdue(df: DataFrame, now_ms: int) -> DataFrame:
    """Scheduled messages due before now_ms (upcoming() leaves them out): how many, and the
    due time of the oldest (UTC timestamp, null when none)."""
    return (df.filter((F.col("state") == "scheduled") & (F.col("due_at_ms") < now_ms))
            .agg(F.count("*").alias("messages"),
                 F.timestamp_millis(F.min("due_at_ms")).alias("oldest_due_at")))


def lag_per_campaign(df: DataFrame) -> DataFrame:
    lag = F.col("updated_at_ms") - F.col("deliver_at_ms")
    return (df.filter(F.col("state") == "delivered")
            .withColumn("campaign", F.coalesce("campaign", F.lit("(none)")))
            .groupBy("campaign").agg(
                F.count("*").alias("delivered"),
                F.percentile_approx(lag, 0.5, 10_000).alias("p50_ms"),
                F.percentile_approx(lag, 0.9, 10_000).alias("p90_ms"),
                F.percentile_approx(lag, 0.99, 10_000).alias("p99_ms"),
                F.max(lag).alias("max_ms"))
            .orderBy("campaign"))


FINAL_STATES = ("delivered", "dead", "cancelled")


def funnel(df: DataFrame, slot_ms: int) -> DataFrame:
    """Per campaign and time slot (epoch ms // slot_ms): messages that entered (created) and
    that ended in each final state then (their last update: a final state is never left)."""
    named = df.withColumn("campaign", F.coalesce("campaign", F.lit("(none)")))
    entered = named.groupBy("campaign", (F.col("created_at_ms") / slot_ms).cast("long")
                            .alias("slot")).agg(F.count("*").alias("entered"))
    ended = (named.filter(F.col("state").isin(*FINAL_STATES))
             .groupBy("campaign", (F.col("updated_at_ms") / slot_ms).cast("long").alias("slot"))
             .pivot("state", list(FINAL_STATES)).count())
    return (entered.join(ended, ["campaign", "slot"], "full").na.fill(0)
            .select("campaign", "slot", "entered", *FINAL_STATES)
            .orderBy("campaign", "slot"))


def per_label(df: DataFrame) -> DataFrame:
    """Messages per label (key, value) and state; a message counts once for each label."""
    return (df.select(F.explode("labels").alias("key", "value"), "state")
            .groupBy("key", "value", "state").count().orderBy("key", "value", "state"))


def per_zone(df: DataFrame) -> DataFrame:
    """Messages per time zone (their own, else the topic's) and state."""
    return df.groupBy("zone", "state").count().orderBy("zone", "state")


def recipients(df: DataFrame) -> DataFrame:
    """Per state: messages with a recipient, and how many distinct recipients they have."""
    return (df.filter(F.col("recipient").isNotNull()).groupBy("state")
            .agg(F.count("*").alias("messages"),
                 F.countDistinct("recipient").alias("recipients"))
            .orderBy("state"))


def attempts(df: DataFrame) -> DataFrame:
    return df.groupBy("attempts").count().orderBy("attempts")


RFC_3339 = "yyyy-MM-dd'T'HH:mm:ssXXX"  # with the session's time zone UTC: ...T09:00:00Z


def write(df: DataFrame, out: Path, name: str, slot_ms: int | None = None
          ) -> list[dict[str, Any]]:
    """Parquet and CSV under out/name/; the (small) result as dicts, times as RFC 3339 text.
    With slot_ms, the slot column (epoch ms // slot_ms) becomes starts_at, the slot's start."""
    if slot_ms is not None:
        df = df.select(*[F.timestamp_millis(F.col("slot") * slot_ms).alias("starts_at")
                         if c == "slot" else F.col(c) for c in df.columns])
    df = df.cache()
    df.coalesce(1).write.mode("overwrite").parquet(str(out / name / "parquet"))
    df.coalesce(1).write.mode("overwrite").option("header", True).option(
        "timestampFormat", RFC_3339).csv(str(out / name / "csv"))
    times = {f.name for f in df.schema.fields if isinstance(f.dataType, T.TimestampType)}
    return [r.asDict() for r in df.select(*[F.date_format(c, RFC_3339).alias(c) if c in times
                                            else F.col(c) for c in df.columns]).collect()]


def rfc_3339(ms: int) -> str:
    """Epoch ms as RFC 3339 UTC text, to the second."""
    return dt.datetime.fromtimestamp(ms // 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(args: argparse.Namespace) -> dict[str, Any]:
    config, services, topic = sessions.open_topic(args.tenant, args.topic)
    out = Path(args.out or f"reports/{args.topic}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    spark = sessions.build(config, f"duetime-report-{args.topic}",
                           **{"spark.sql.session.timeZone": "UTC"})
    now = services.clock()
    with Progress(spark.sparkContext) as progress:
        progress.enter(f"reading the messages of {args.topic}")
        df = messages_of(spark, config, str(topic.uid), args.campaign,
                         topic.settings.timezone or DEFAULT_ZONE).cache()
        progress.enter("computing the report")
        results = {
            "states": write(state_counts(df), out, "states"),
            "overdue": write(overdue(df, now), out, "overdue"),
            "upcoming_per_minute": write(upcoming(df, now, MS_PER_MINUTE), out,
                                         "upcoming_per_minute", MS_PER_MINUTE),
            "upcoming_per_hour": write(upcoming(df, now, MS_PER_HOUR), out, "upcoming_per_hour",
                                       MS_PER_HOUR),
            "lag_per_campaign": write(lag_per_campaign(df), out, "lag_per_campaign"),
            "attempts": write(attempts(df), out, "attempts"),
            "funnel": write(funnel(df, MS_PER_MINUTE), out, "funnel", MS_PER_MINUTE),
            "labels": write(per_label(df), out, "labels"),
            "zones": write(per_zone(df), out, "zones"),
            "recipients": write(recipients(df), out, "recipients"),
        }
        progress.enter(f"drawing {out / 'index.html'}")
        draw(out, args, results, rfc_3339(now))
    spark.stop()
    # deferrals leave no mark a row keeps: their counters, as /stats and a campaign's view
    counts = (services.campaigns.counts(topic.uid, [args.campaign])[args.campaign]
              if args.campaign else services.counts.states(topic.uid))
    services.close()
    return {"out": str(out), "as_of": rfc_3339(now), "overdue": results["overdue"][0],
            "states": {r["state"]: r["count"] for r in results["states"]},
            "lag_per_campaign": results["lag_per_campaign"],
            "attempts": {r["attempts"]: r["count"] for r in results["attempts"]},
            "upcoming_per_hour": {r["starts_at"]: r["count"]
                                  for r in results["upcoming_per_hour"]},
            "funnel": funnel_totals(results["funnel"]),
            "labels": results["labels"], "zones": results["zones"],
            "recipients": results["recipients"], "frequency_capped": capped_counts(counts)}


def funnel_totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per campaign, the funnel summed over time."""
    totals: dict[str, dict[str, int]] = {}
    for r in rows:
        mine = totals.setdefault(r["campaign"], dict.fromkeys(("entered", *FINAL_STATES), 0))
        for key in mine:
            mine[key] += r[key]
    return totals


def draw(out: Path, args: argparse.Namespace, results: dict[str, list[dict[str, Any]]],
         as_of: str) -> None:
    states, lag, tries = results["states"], results["lag_per_campaign"], results["attempts"]
    images = {
        "states": charts.bar_chart(out / "states.png", "Messages per state",
                                   [r["state"] for r in states], [r["count"] for r in states],
                                   "messages"),
        "minute": charts.load_chart(out / "upcoming_minute.png", "Upcoming load per minute",
                                    [(r["starts_at"], r["count"])
                                     for r in results["upcoming_per_minute"]], MS_PER_MINUTE),
        "hour": charts.load_chart(out / "upcoming_hour.png", "Upcoming load per hour",
                                  [(r["starts_at"], r["count"])
                                   for r in results["upcoming_per_hour"]], MS_PER_HOUR),
        "lag": charts.lag_chart(out / "lag.png", lag) if lag else None,
        "attempts": charts.bar_chart(out / "attempts.png", "Attempts per message",
                                     [str(r["attempts"]) for r in tries],
                                     [r["count"] for r in tries], "messages"),
        "funnel": charts.funnel_chart(out / "funnel.png", results["funnel"], MS_PER_MINUTE),
    }
    title = f"duetime report: topic {args.topic}" + (
        f", campaign {args.campaign}" if args.campaign else "")
    charts.page(out / "index.html", title, [
        ("Messages per state", images["states"], states),
        (f"Overdue: scheduled, due before {as_of}", None, results["overdue"]),
        (f"Upcoming load per minute, from {as_of} (UTC; overdue messages not included)",
         images["minute"], results["upcoming_per_minute"][:120]),
        (f"Upcoming load per hour, from {as_of} (UTC; overdue messages not included)",
         images["hour"], results["upcoming_per_hour"]),
        ("Delivery lag per campaign (ms)", images["lag"], lag),
        ("Attempts distribution", images["attempts"], tries),
        ("Campaign funnel (per minute, UTC)", images["funnel"], results["funnel"][:200]),
        ("Messages per label and state", None, results["labels"][:200]),
        ("Messages per time zone and state", None, results["zones"][:200]),
        ("Recipients per state", None, results["recipients"]),
    ])


def main(argv: list[str]) -> int:
    args = usage.report_parser().parse_args(argv)
    return failures.end(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
