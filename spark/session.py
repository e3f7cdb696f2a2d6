"""The SparkSession of duetime's jobs: the spark-cassandra-connector, its connection settings
from app.config, and the write tuning for bulk imports."""

from __future__ import annotations

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession

from app.config import Config, load_config
from app.models import Topic
from app.services import Services
from spark.failures import JobFailure, check_master
from spark.usage import NO_TOPIC

CASSANDRA_FORMAT = "org.apache.spark.sql.cassandra"


def open_topic(tenant: str, name: str) -> tuple[Config, Services, Topic]:
    """What every job starts from: the configuration, the services, and the topic (JobFailure
    when the tenant has no such topic)."""
    config = load_config()
    services = Services(config)
    topic = services.topics.get(tenant, name)
    if topic is None:
        services.close()
        raise JobFailure(NO_TOPIC, f"no topic {name!r} for tenant {tenant!r}")
    return config, services, topic


def connector_conf(config: Config) -> dict[str, str]:
    """Connection and write settings. Writes: many concurrent unlogged batches, each holding
    rows of one Cassandra partition (the jobs sort rows by partition key first)."""
    conf = {
        "spark.sql.extensions": "com.datastax.spark.connector.CassandraSparkExtensions",
        "spark.cassandra.connection.host": ",".join(config.contact_points),
        "spark.cassandra.connection.port": str(config.cql_port),
        "spark.cassandra.output.consistency.level": config.consistency,
        "spark.cassandra.input.consistency.level": config.consistency,
        "spark.cassandra.output.concurrent.writes": "32",
        "spark.cassandra.output.batch.grouping.key": "partition",
        "spark.cassandra.output.batch.size.rows": "auto",
        "spark.cassandra.output.ignoreNulls": "true",  # a null would write a tombstone
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "16",
    }
    if config.local_dc:
        conf["spark.cassandra.connection.localDC"] = config.local_dc
    if config.cql_username:
        conf["spark.cassandra.auth.username"] = config.cql_username
        conf["spark.cassandra.auth.password"] = config.cql_password or ""
    return conf


def build(config: Config, app_name: str, **extra: str) -> SparkSession:
    """The session (the master comes from spark-submit, and is checked first: JobFailure when
    it cannot be reached), with `extra` settings."""
    SparkContext._ensure_initialized()  # the JVM of spark-submit, which knows the master
    assert SparkContext._jvm is not None
    check_master(str(SparkContext._jvm.System.getProperty("spark.master", "local[*]")))
    builder = SparkSession.builder.appName(app_name)
    for key, value in {**connector_conf(config), **extra}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def table(spark: SparkSession, config: Config, name: str, **options: str) -> DataFrame:
    """A DataFrame over one table of duetime's keyspace (read options as given, e.g.
    directJoinSetting="on" so a join on the full primary key becomes key lookups)."""
    return spark.read.format(CASSANDRA_FORMAT).options(
        keyspace=config.keyspace, table=name, **options).load()
