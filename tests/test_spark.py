"""Spark in local mode against the real node: bulk import with rejects and exact counts, a
re-run that adds nothing, imported messages delivered by a releaser, and a report whose
numbers equal the API's /stats and per-message reads."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.config import Config
from app.core.ids import import_id
from app.core.timeparse import parse_instant
from app.services import Services
from tests.campaign_helpers import running_operations, wait_operation
from tests.conftest import ROOT
from tests.consumers import TopicClient, now_ms
from tests.import_files import write_csv
from tests.receiver import Receiver, receiving
from tests.releasing import assert_on_time_and_signed, wait_state, webhook_topic
from tests.scale import scaled
from tests.waiting import wait_until

ROWS = scaled(20_000, 100_000)


# a stage's progress bar (spark.progress): tasks done / total, rows, time left
STAGE_BAR = re.compile(r": stage (\d+) tasks \[[#.]+\] +\d+% ([\d,]+)/([\d,]+), ([\d,]+) rows, "
                       r"(about \d+ (?:s|min) left|time left unknown yet|ended)$")


def stage_bars(output: str) -> dict[int, list[tuple[int, int, int, str]]]:
    """Per Spark stage, its progress bars in order: (tasks done, tasks, rows, time left)."""
    bars: dict[int, list[tuple[int, int, int, str]]] = {}
    for line in output.splitlines():
        if found := STAGE_BAR.search(line):
            stage, done, total, rows, left = found.groups()
            bars.setdefault(int(stage), []).append(
                (int(done.replace(",", "")), int(total.replace(",", "")),
                 int(rows.replace(",", "")), left))
    return bars


def spark_run(config: Config, *args: str) -> tuple[dict[str, Any], str]:
    """Run `duetime-admin spark ...` on the test keyspace: its JSON summary (last stdout
    line) and its output. Each stage's progress bar only grows."""
    env = {**os.environ, "DUETIME_KEYSPACE": config.keyspace}
    done = subprocess.run([sys.executable, "-m", "app.cli", "spark", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "finished in" in done.stdout  # progress was shown (spark-submit merges stderr)
    for stage, bars in stage_bars(done.stdout).items():
        assert len({total for _, total, _, _ in bars}) == 1, (stage, bars)
        assert [b[0] for b in bars] == sorted(b[0] for b in bars), (stage, bars)
        assert [b[2] for b in bars] == sorted(b[2] for b in bars), (stage, bars)
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return summary, done.stdout


def spark_job(config: Config, *args: str) -> dict[str, Any]:
    """spark_run's summary."""
    return spark_run(config, *args)[0]


def tenant_of(services: Services, auth: dict[str, str]) -> str:
    tenant = services.keys.tenant_of(auth["Authorization"].split()[1])
    assert tenant is not None
    return tenant


def stats(client: FlaskClient, topic: TopicClient) -> dict[str, int]:
    answer = client.get(topic.url("/stats"), headers=topic.headers)
    assert answer.status_code == 200
    counts: dict[str, int] = answer.get_json()["counts"]
    return counts


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("import") / "sends.csv"
    expected = write_csv(path, ROWS, now_ms() + 3_600_000, 3_600_000, bad_every=997)
    return path, expected


@pytest.mark.long_form
def test_import_counts_rejects_and_a_rerun_adds_nothing(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        big_file: tuple[Path, Any], tmp_path: Path) -> None:
    path, expected = big_file
    topic = TopicClient(client, auth)
    tenant = tenant_of(services, auth)
    rejects = tmp_path / "rejects"
    first, output = spark_run(config, "import", str(path), "--topic", topic.name, "--tenant",
                              tenant, "--campaign", "bulk", "--rejects", str(rejects))
    assert first["rows"] == ROWS
    assert first["rejected"] == expected.invalid + expected.duplicates
    assert first["imported"] == expected.good
    bars = stage_bars(output)  # one bar per stage, none going back
    assert len(bars) >= 2 and any(rows for b in bars.values() for _, _, rows, _ in b), output
    assert any(left.endswith(" left") for b in bars.values() for *_, left in b), output
    rejected = list(csv.DictReader(next(rejects.glob("*.csv")).open(encoding="utf-8")))
    assert len(rejected) == first["rejected"] and first["rejects_replaced"] is False
    lines = path.read_text(encoding="utf-8").splitlines()  # the header is line 1
    assert all(lines[int(r["line"]) - 1] == r["raw"] for r in rejected), rejected[:3]
    reasons = {r["reason"].split(":")[0] for r in rejected}
    assert {"recipient", "priority", "deliver_at"} <= reasons
    assert sum(r["reason"].startswith("duplicate of line") for r in rejected) == \
        expected.duplicates
    assert stats(client, topic)["scheduled"] == expected.good
    # an imported message reads like an API one
    spec = json.dumps({"deliver_at": int(next(csv.DictReader(path.open()))["deliver_at"])})
    body = topic.get(import_id("bulk", "user0", spec)).get_json()
    assert body["state"] == "scheduled" and body["campaign"] == "bulk"

    rows = list(csv.DictReader(path.open(encoding="utf-8")))  # first and last rows are valid
    view = client.get(topic.url("/campaigns/bulk"), headers=auth).get_json()
    assert view["counts"]["scheduled"] == expected.good
    assert parse_instant(view["first_deliver_at"]) == int(rows[0]["deliver_at"])
    assert parse_instant(view["last_deliver_at"]) == int(rows[-1]["deliver_at"])

    again = spark_job(config, "import", str(path), "--topic", topic.name, "--tenant", tenant,
                      "--campaign", "bulk", "--rejects", str(rejects))
    assert again["imported"] == 0 and again["rejects_replaced"] is True
    assert again["already_present"] == expected.good
    assert stats(client, topic)["scheduled"] == expected.good
    view = client.get(topic.url("/campaigns/bulk"), headers=auth).get_json()
    assert view["counts"]["scheduled"] == expected.good  # the re-run counted nothing


def test_an_import_into_a_cancelled_campaign_is_refused_whole(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        tmp_path: Path) -> None:
    topic = TopicClient(client, auth)
    topic.enqueue(campaign="stopped", deliver_at=now_ms() + 3_600_000)
    assert client.delete(topic.url("/campaigns/stopped"), headers=auth).status_code == 202
    # the suite's releaser runs the cancel: counts are compared once it has
    assert wait_until(lambda: stats(client, topic).get("cancelled") == 1, 30)
    before = stats(client, topic)
    path = tmp_path / "late.csv"
    write_csv(path, 50, now_ms() + 3_600_000, 60_000)
    env = {**os.environ, "DUETIME_KEYSPACE": config.keyspace}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "spark", "import", str(path), "--topic", topic.name,
         "--tenant", tenant_of(services, auth), "--campaign", "stopped"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "import refused: Campaign 'stopped' is cancelled" in done.stdout + done.stderr
    assert stats(client, topic) == before  # nothing was written


def test_imported_messages_are_released_and_the_report_matches_the_api(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        tmp_path: Path) -> None:
    def script(message_id: str, before: int) -> int:
        return 500 if message_id.endswith(("3", "7")) and before == 0 else 200

    with receiving(Receiver(script)) as target:
        topic, secret = webhook_topic(client, auth, target.url,
                                      retry={"backoff_seconds": 0.2, "max_backoff_seconds": 1})
        path = tmp_path / "soon.csv"
        # due from 25 s on: Spark's start-up and the import happen before the first is due
        expected = write_csv(path, 300, now_ms() + 25_000, 3_000, labelled=True)
        summary = spark_job(config, "import", str(path), "--topic", topic.name, "--tenant",
                            tenant_of(services, auth), "--campaign", "soon")
        assert summary["imported"] == expected.good == 300
        assert target.wait_distinct(300, 60), target.distinct()
        assert_on_time_and_signed(target.arrivals, secret, topic.name)
        ids = sorted({a.message_id for a in target.arrivals})
        for message_id in ids[-5:]:
            wait_state(topic, message_id, "delivered", 10)
        time.sleep(1.5)  # let the last outcomes be recorded
    report = spark_job(config, "report", "--topic", topic.name, "--tenant",
                       tenant_of(services, auth), "--out", str(tmp_path / "report"))
    api_counts = {s: n for s, n in stats(client, topic).items() if n}
    assert report["states"] == api_counts == {"delivered": 300}
    reads = [topic.get(i).get_json() for i in ids]
    per_attempts: dict[str, int] = {}
    for body in reads:
        per_attempts[str(body["attempts"])] = per_attempts.get(str(body["attempts"]), 0) + 1
    assert {str(k): v for k, v in report["attempts"].items()} == per_attempts
    assert per_attempts.get("2", 0) > 0  # the first POSTs that got 500 were retried
    lag = report["lag_per_campaign"][0]
    assert lag["campaign"] == "soon" and lag["delivered"] == 300
    assert 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"]
    assert report["funnel"] == {"soon": {"entered": 300, "delivered": 300, "dead": 0,
                                         "cancelled": 0}}
    # the audience: labels, zones (a row's own, else the topic's UTC) and recipients
    assert {(r["key"], r["value"], r["state"]): r["count"] for r in report["labels"]} == {
        ("tier", "gold", "delivered"): 150, ("tier", "free", "delivered"): 150}
    assert {(r["zone"], r["count"]) for r in report["zones"]} == {("UTC", 150),
                                                                   ("Asia/Tokyo", 150)}
    assert report["recipients"] == [{"state": "delivered", "messages": 300, "recipients": 300}]
    shown = {(b["recipient"], b["labels"]["tier"], b["timezone"]) for b in reads}
    assert ("user1", "free", "Asia/Tokyo") in shown and ("user0", "gold", None) in shown
    page = (tmp_path / "report" / "index.html").read_text()
    assert "states.png" in page and (tmp_path / "report" / "lag.png").stat().st_size > 1000
    assert "funnel.png" in page and (tmp_path / "report" / "funnel.png").stat().st_size > 1000


def test_messages_due_while_the_import_wrote_are_placed_again_and_delivered(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        tmp_path: Path) -> None:
    """An import of sends due a minute ago places them at its start, and its writes land
    seconds later, behind the walk's positions: it places each again, due now, after its
    rows and counts are written (spark.import_job.place_late), and every one is delivered."""
    with receiving(Receiver()) as target:
        topic, secret = webhook_topic(client, auth, target.url)
        path = tmp_path / "overdue.csv"
        expected = write_csv(path, 200, now_ms() - 60_000, 1_000)
        summary = spark_job(config, "import", str(path), "--topic", topic.name, "--tenant",
                            tenant_of(services, auth))
        assert summary["imported"] == expected.good == 200
        assert summary["placed_again"] == 200
        assert target.wait_distinct(200, 30), len(target.distinct())
        assert_on_time_and_signed(target.arrivals, secret, topic.name)


def test_the_report_counts_what_a_frequency_cap_deferred_and_dropped(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        tmp_path: Path) -> None:
    """A cap of 1 a day: of one recipient's three due messages one is handed out; on a
    `drop` topic the other two are cancelled, on a `defer` topic moved to the next day. The
    report's frequency_capped says so, as /stats does."""
    capped = {}
    for on_cap in ("drop", "defer"):
        topic = TopicClient(client, auth, frequency_cap={"max": 1, "per": "day",
                                                         "on_cap": on_cap})
        topic.batch([{"id": f"m{n}", "recipient": "ann"} for n in range(3)])
        deadline = time.monotonic() + 20
        while (sum(stats_capped(client, topic).values()) < 2
               and time.monotonic() < deadline):
            topic.lease(10, wait_ms=500)
        capped[on_cap] = spark_job(config, "report", "--topic", topic.name, "--tenant",
                                   tenant_of(services, auth), "--out",
                                   str(tmp_path / on_cap))["frequency_capped"]
        assert capped[on_cap] == stats_capped(client, topic)
    assert capped == {"drop": {"deferred": 0, "dropped": 2},
                      "defer": {"deferred": 2, "dropped": 0}}


def stats_capped(client: FlaskClient, topic: TopicClient) -> dict[str, int]:
    answer = client.get(topic.url("/stats"), headers=topic.headers).get_json()
    return dict(answer["frequency_capped"])


def test_an_import_rejects_or_replaces_messages_it_finds_with_other_content(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        tmp_path: Path) -> None:
    topic = TopicClient(client, auth)
    tenant = tenant_of(services, auth)
    at = now_ms() + 3_600_000
    moved = at + 600_000
    # the rows' recipient column is the message's recipient: "same" is the same message
    for name in ("same", "other", "taken"):
        assert topic.enqueue(id=name, deliver_at=at, payload={"v": 1},
                             recipient="u").status_code == 201
    assert topic.enqueue(id="taken-now", payload={"v": 1}, recipient="u").status_code == 201
    [leased] = topic.lease(1)
    assert leased["id"] == "taken-now"
    # one paused (a filtered pause): replaced as the API replaces it, and still paused
    assert topic.enqueue(id="held", deliver_at=at, payload={"v": 1},
                         recipient="p").status_code == 201
    with running_operations(services):
        pause = client.post(topic.url("/operations"), headers=auth,
                            json={"kind": "pause", "filter": {"recipient": "p"}})
        assert wait_operation(topic, pause.get_json()["operation"]["id"], 30)["changed"] == 1
    path = tmp_path / "again.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["id", "recipient", "payload", "deliver_at"])
        out.writerow(["same", "u", json.dumps({"v": 1}), str(at)])
        out.writerow(["other", "u", json.dumps({"v": 2}), str(moved)])
        out.writerow(["taken-now", "u", json.dumps({"v": 2}), str(moved)])
        out.writerow(["fresh", "u", json.dumps({"v": 2}), str(moved)])
        out.writerow(["held", "p", json.dumps({"v": 2}), str(moved)])

    def run(mode: str, folder: str) -> tuple[dict[str, Any], dict[str, str]]:
        summary = spark_job(config, "import", str(path), "--topic", topic.name, "--tenant",
                            tenant, "--if-exists", mode, "--rejects", str(tmp_path / folder))
        found = list(csv.DictReader(next((tmp_path / folder).glob("*.csv")).open(
            encoding="utf-8")))
        lines = path.read_text(encoding="utf-8").splitlines()
        assert [r["raw"] for r in found] == [lines[int(r["line"]) - 1] for r in found], found
        return summary, {r["line"]: r["reason"] for r in found}

    rejected, why = run("reject", "r1")  # the default, as the API's
    assert (rejected["imported"], rejected["replaced"], rejected["rejected"],
            rejected["already_present"]) == (1, 0, 3, 1), rejected
    assert set(why) == {"3", "4", "6"} and all("other content" in r for r in why.values()), why
    assert topic.get("other").get_json()["payload"] == {"v": 1}

    replaced, why = run("replace", "r2")
    assert (replaced["imported"], replaced["replaced"], replaced["rejected"],
            replaced["already_present"]) == (0, 2, 1, 2), replaced
    assert list(why) == ["4"] and "id is leased" in why["4"], why
    other = topic.get("other").get_json()
    assert other["payload"] == {"v": 2} and parse_instant(other["deliver_at"]) == moved
    assert topic.get("taken-now").get_json()["payload"] == {"v": 1}
    held = topic.get("held").get_json()
    assert (held["state"], held["payload"]) == ("paused", {"v": 2})
    assert stats(client, topic)["scheduled"] == 4  # same, other, taken, fresh: nothing twice
