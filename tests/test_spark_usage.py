"""`duetime-admin spark` as a data engineer meets it, with real Spark (local mode) against the real
node: a failure prints one line saying what is wrong and exits with its documented code
(spark.usage.EXIT_CODES), the input's format comes from --format or the file's name, and
--help lists a job's own flags and the codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from app.config import Config
from app.services import Services
from spark import usage
from spark.submit import DEFAULT_JARS_DIR
from tests.conftest import ROOT
from tests.consumers import TopicClient, now_ms
from tests.test_spark import stats, tenant_of

# what Spark's JVM logs by itself around a job (log4j's layout): not the job's output
SPARK_LOG = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN) ")


def run_spark(config: Config, *args: str, timeout_s: float = 600, **settings: str
              ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DUETIME_KEYSPACE": config.keyspace, **settings}
    return subprocess.run([sys.executable, "-m", "app.cli", "spark", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What the job itself printed: every line but the JVM's log lines and progress."""
    return [line for line in (done.stdout + done.stderr).splitlines()
            if line.strip() and not SPARK_LOG.match(line) and not line.startswith("[")]


def assert_fails_with(done: subprocess.CompletedProcess[str], code: int, line: str) -> None:
    output = done.stdout + done.stderr
    assert "Traceback" not in output and "Py4J" not in output, output[-3000:]
    assert said(done) == [line], output
    assert done.returncode == code, (done.returncode, output[-3000:])


def test_help_lists_the_jobs_flags_and_exit_codes() -> None:
    for job in ("import", "export", "report"):
        done = subprocess.run([sys.executable, "-m", "app.cli", "spark", job, "--help"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "--topic" in done.stdout and "exit codes:" in done.stdout
        for code in usage.EXIT_CODES:
            assert re.search(rf"^  {code}  \S", done.stdout, re.M), (code, done.stdout)
    done = subprocess.run([sys.executable, "-m", "app.cli", "spark", "import", "-h"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert "--format {csv,json,parquet}" in done.stdout and "--if-exists" in done.stdout


def test_a_missing_input_says_so_in_one_line(config: Config, services: Services,
                                             client: FlaskClient, auth: dict[str, str],
                                             tmp_path: Path) -> None:
    topic = TopicClient(client, auth)
    missing = tmp_path / "nowhere.csv"
    done = run_spark(config, "import", str(missing), "--topic", topic.name, "--tenant",
                     tenant_of(services, auth))
    assert_fails_with(done, usage.INPUT, f"no input: nothing at {missing}")


def test_an_unknown_topic_says_so_in_one_line(config: Config, services: Services,
                                              auth: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "sends.csv"
    path.write_text("recipient\nu1\n", encoding="utf-8")
    tenant = tenant_of(services, auth)
    done = run_spark(config, "import", str(path), "--topic", "no-such-topic", "--tenant", tenant)
    assert_fails_with(done, usage.NO_TOPIC, f"no topic 'no-such-topic' for tenant {tenant!r}")


def test_an_unreachable_cassandra_says_so_in_one_line(config: Config, tmp_path: Path) -> None:
    path = tmp_path / "sends.csv"
    path.write_text("recipient\nu1\n", encoding="utf-8")
    done = run_spark(config, "import", str(path), "--topic", "any", DUETIME_CQL_PORT="1")
    [line] = said(done)
    assert line.endswith("(Cassandra cannot be reached: see DUETIME_CONTACT_POINTS and "
                         "DUETIME_CQL_PORT)"), line
    assert_fails_with(done, usage.CASSANDRA, line)


def test_an_unreachable_master_says_so_at_once(config: Config, services: Services,
                                               client: FlaskClient, auth: dict[str, str],
                                               tmp_path: Path) -> None:
    topic = TopicClient(client, auth)
    path = tmp_path / "sends.csv"
    path.write_text("recipient\nu1\n", encoding="utf-8")
    began = time.monotonic()
    done = run_spark(config, "import", str(path), "--topic", topic.name, "--tenant",
                     tenant_of(services, auth), "--master", "spark://127.0.0.1:1")
    assert time.monotonic() - began < 30  # Spark alone retries for over a minute
    assert_fails_with(done, usage.MASTER, "the Spark master spark://127.0.0.1:1 cannot be "
                      "reached (127.0.0.1:1: Connection refused)")
    assert stats(client, topic).get("scheduled", 0) == 0


@pytest.mark.skipif(any(DEFAULT_JARS_DIR.glob("hadoop-aws-*.jar")),
                    reason="`make spark-s3a` has put hadoop-aws on the classpath")
def test_an_s3a_url_without_hadoop_aws_says_how_to_get_it(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    done = run_spark(config, "import", "s3a://duetime-test/sends.csv", "--topic", topic.name,
                     "--tenant", tenant_of(services, auth))
    assert_fails_with(done, usage.INPUT, "s3a:// URLs need hadoop-aws on the classpath: "
                      "`make spark-s3a` fetches it (hadoop-aws 3.3.4 and its AWS SDK bundle, "
                      "~280 MB) into var/spark/jars")


def _json_lines(path: Path, due_ms: int, n: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            out.write(json.dumps({"recipient": f"u{i}", "deliver_at": due_ms + i,
                                  "priority": 1, "payload": json.dumps({"n": i})}) + "\n")


def test_the_format_comes_from_the_flag_or_the_files_name(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        tmp_path: Path) -> None:
    topic = TopicClient(client, auth)
    tenant = tenant_of(services, auth)
    due = now_ms() + 3_600_000
    unnamed = tmp_path / "sends.txt"
    _json_lines(unnamed, due, 30)
    done = run_spark(config, "import", str(unnamed), "--topic", topic.name, "--tenant", tenant)
    assert_fails_with(done, usage.USAGE, f"cannot tell the format of {unnamed} from its name: "
                      "give --format (csv | json | parquet)")
    done = run_spark(config, "import", str(unnamed), "--topic", topic.name, "--tenant", tenant,
                     "--format", "json")
    assert done.returncode == 0, done.stdout[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["imported"] == 30
    named = tmp_path / "more.jsonl"
    _json_lines(named, due + 1_000, 20)
    done = run_spark(config, "import", str(named), "--topic", topic.name, "--tenant", tenant)
    assert done.returncode == 0, done.stdout[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["imported"] == 20
    done = run_spark(config, "import", str(named), "--topic", topic.name, "--tenant", tenant,
                     "--format", "parquet")
    assert done.returncode == usage.INPUT and "is not a Parquet file" in said(done)[0], \
        said(done)
    assert stats(client, topic)["scheduled"] == 50


RFC_3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_the_report_labels_times_in_rfc_3339_and_counts_overdue_apart(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        tmp_path: Path) -> None:
    """Three messages due now, with no consumer to lease them, are overdue when the report
    runs: counted apart, and not in the upcoming load, which has the five due later."""
    topic = TopicClient(client, auth)
    soon = now_ms() + 3_600_000
    for _ in range(3):
        assert topic.enqueue().status_code == 201
    for i in range(5):
        assert topic.enqueue(deliver_at=soon + (i % 2) * 3_600_000 + i).status_code == 201
    out = tmp_path / "report"
    done = run_spark(config, "report", "--topic", topic.name, "--tenant",
                     tenant_of(services, auth), "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert RFC_3339.match(report["as_of"]), report["as_of"]
    assert report["overdue"]["messages"] == 3, report["overdue"]
    assert RFC_3339.match(report["overdue"]["oldest_due_at"])
    assert report["overdue"]["oldest_due_at"] <= report["as_of"]
    hours = report["upcoming_per_hour"]
    assert sum(hours.values()) == 5, hours
    assert all(RFC_3339.match(h) and h.endswith(":00:00Z") for h in hours), hours
    assert min(hours) <= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(soon / 1000)) < \
        max(hours)
    [per_hour] = (out / "upcoming_per_hour" / "csv").glob("*.csv")
    header, first, *_ = per_hour.read_text(encoding="utf-8").splitlines()
    assert header == "starts_at,count" and RFC_3339.match(first.split(",")[0]), first
    page = (out / "index.html").read_text(encoding="utf-8")
    assert f"due before {report['as_of']}" in page and "overdue messages not included" in page


def test_an_input_its_file_system_cannot_reach_says_so_in_one_line(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    done = run_spark(config, "import", "hdfs://127.0.0.1:1/sends.csv", "--topic", topic.name,
                     "--tenant", tenant_of(services, auth))
    [line] = said(done)
    assert line.startswith("the input cannot be read: ") and "Connection refused" in line, line
    assert_fails_with(done, usage.INPUT, line)
