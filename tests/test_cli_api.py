"""The `duetime` commands that call the API (duetime_client.commands), against a served API:
tables by default, JSON with --json, exit codes, and `tail` consuming what comes due."""

from __future__ import annotations

import json

import pytest
from duetime_client.cli import main
from duetime_client.client import Client

from app.services import Services
from tests.campaign_helpers import running_operations
from tests.conftest import new_tenant_key


@pytest.fixture()
def duetime(served: str, services: Services,
            capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run `duetime ARGS` on a fresh tenant's key: (exit code, stdout, stderr)."""
    _, headers = new_tenant_key(services)
    key = headers["Authorization"].split()[1]

    def run(*args: str) -> tuple[int, str, str]:
        code = main([*args, "--url", served, "--key", key])
        out, err = capsys.readouterr()
        return code, out, err

    run.client = Client(served, key)  # type: ignore[attr-defined]
    return run


def test_topics_messages_and_errors(duetime) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = duetime("topics", "alerts", "--set", "max_attempts=4", "--json")
    assert code == 0 and json.loads(out)["max_attempts"] == 4
    code, out, _ = duetime("topics")
    assert code == 0 and out.splitlines()[0].split()[0] == "name" and "alerts" in out
    code, out, _ = duetime("enqueue", "alerts", '{"n": 1}', "--id", "a-1", "--delay-ms",
                           "600000", "--campaign", "c1", "--json")
    assert code == 0 and json.loads(out)["id"] == "a-1"
    code, out, _ = duetime("get", "alerts", "a-1")
    assert code == 0 and any(line.split()[:2] == ["state", "scheduled"]
                             for line in out.splitlines())
    code, out, _ = duetime("campaigns", "alerts", "c1", "--pause", "--json")
    assert code == 0 and json.loads(out)["paused"] is True
    code, out, _ = duetime("stats", "alerts", "--json")
    assert code == 0 and json.loads(out)["counts"]["scheduled"] == 1
    assert duetime("cancel", "alerts", "a-1")[0] == 0
    code, _, err = duetime("get", "alerts", "missing")
    assert code == 1 and err.startswith("error 404")
    code, _, err = duetime("reschedule", "alerts", "a-1", "--delay-ms", "5")
    assert code == 1 and "409" in err  # cancelled: cannot move


def test_tail_consumes_what_comes_due(duetime) -> None:  # type: ignore[no-untyped-def]
    assert duetime("topics", "feed", "--set", "lease_seconds=30")[0] == 0
    for n in range(3):
        assert duetime("enqueue", "feed", json.dumps({"n": n}), "--id", f"f{n}")[0] == 0
    code, out, _ = duetime("tail", "feed", "--count", "3", "--json")
    assert code == 0
    tailed = [json.loads(line) for line in out.splitlines()]
    assert sorted(m["id"] for m in tailed) == ["f0", "f1", "f2"]
    for n in range(3):
        code, out, _ = duetime("get", "feed", f"f{n}", "--json")
        assert json.loads(out)["state"] == "delivered"


def test_no_api_is_a_clear_error(services: Services,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["topics", "--url", "http://127.0.0.1:9", "--key", "k"])
    assert code == 3 and "cannot reach the API" in capsys.readouterr().err


def test_a_campaign_cancel_followed_to_its_end_with_a_progress_bar(
        duetime, services: Services) -> None:  # type: ignore[no-untyped-def]
    assert duetime("topics", "promo", "--set", "lease_seconds=30")[0] == 0
    for n in range(30):
        assert duetime("enqueue", "promo", "{}", "--id", f"p{n}", "--delay-ms", "600000",
                       "--campaign", "spring")[0] == 0
    with running_operations(services):
        code, out, err = duetime("campaigns", "promo", "spring", "--cancel", "--wait", "--json")
    assert code == 0, err
    op = json.loads(out)["operation"]
    assert (op["state"], op["kind"], op["processed"], op["changed"]) == (
        "succeeded", "cancel", 30, 30)
    last = err.strip().splitlines()[-1]
    assert last.startswith("cancel spring succeeded: 30 of 30 changed"), err
    code, out, _ = duetime("stats", "promo", "--json")
    assert json.loads(out)["counts"]["cancelled"] == 30


def test_dead_messages_listed_and_retried_and_lag_shown(
        duetime) -> None:  # type: ignore[no-untyped-def]
    assert duetime("topics", "jobs", "--set", "max_attempts=1")[0] == 0
    assert duetime("enqueue", "jobs", '{"job": 1}', "--id", "j1")[0] == 0
    code, out, _ = duetime("tail", "jobs", "--count", "1", "--json")  # acks j1
    assert code == 0 and json.loads(out)["id"] == "j1"
    code, out, _ = duetime("dead", "jobs", "--json")
    assert code == 0 and json.loads(out) == []
    code, _, err = duetime("retry", "jobs", "j1")
    assert code == 1 and "409" in err  # delivered, not dead
    assert duetime("enqueue", "jobs", '{"job": 2}', "--id", "j2")[0] == 0
    [leased] = duetime.client.lease("jobs", 1, 3000)
    duetime.client.nack("jobs", leased, error="disk full")
    code, out, _ = duetime("dead", "jobs")
    assert code == 0 and out.splitlines()[1].split()[0] == "j2" and "disk full" in out
    code, out, _ = duetime("retry", "jobs", "j2", "--json")
    assert code == 0 and json.loads(out)["state"] == "scheduled"
    assert json.loads(duetime("dead", "jobs", "--json")[1]) == []
    code, out, _ = duetime("lag", "jobs", "--minutes", "3", "--json")
    assert code == 0 and len(json.loads(out)) == 3
    code, out, _ = duetime("lag", "jobs", "--minutes", "3")
    assert code == 0 and out.splitlines()[0].split()[:4] == ["from", "count", "p50_ms", "p99_ms"]


def test_messages_found_by_label_and_state_as_a_table(duetime) -> None:  # type: ignore[no-untyped-def]
    client = duetime.client
    client.put_topic("sends")
    client.enqueue_batch("sends", [
        {"id": f"s{n}", "payload": {"n": n}, "delay_ms": 600_000, "labels": {"wave": str(n % 2)},
         **({"recipient": f"r{n}"} if n else {})} for n in range(5)])
    client.cancel("sends", "s2")
    code, out, _ = duetime("messages", "sends", "--label", "wave:0", "--state", "scheduled")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["id", "state", "deliver_at", "recipient",
                                              "campaign", "labels"]
    rows = sorted(line.split() for line in lines[1:])
    assert [r[0] for r in rows] == ["s0", "s4"]  # s2 is cancelled, s1 and s3 wave 1
    assert rows[0][3:] == ["-", "-", "wave:0"] and rows[1][3] == "r4"
    code, out, _ = duetime("messages", "sends", "--recipient", "r3", "--json")
    assert code == 0 and [m["id"] for m in json.loads(out)] == ["s3"]
    # the client pages through everything, each once
    assert sorted(m["id"] for m in client.iter_messages("sends", page_size=2)) == [
        f"s{n}" for n in range(5)]
    code, _, err = duetime("messages", "sends", "--label", "no-colon")
    assert code == 1 and "label" in err
    assert duetime("messages", "sends", "--limit", "2", "--json")[0] == 0


def test_a_filtered_cancel_followed_to_its_end_with_a_progress_bar(
        duetime, services: Services) -> None:  # type: ignore[no-untyped-def]
    client = duetime.client
    client.put_topic("drops")
    client.enqueue_batch("drops", [
        {"id": f"d{n}", "payload": {}, "delay_ms": 600_000, "labels": {"wave": str(n % 3)}}
        for n in range(30)])
    client.cancel("drops", "d0")
    with running_operations(services):
        code, out, err = duetime("operations", "cancel", "drops", "--label", "wave:0",
                                 "--state", "scheduled", "--wait", "--json")
    assert code == 0, err
    op = json.loads(out)["operation"]
    assert (op["state"], op["kind"], op["processed"], op["changed"]) == (
        "succeeded", "cancel", 9, 9)
    assert op["filter"] == {"label": ["wave:0"], "state": "scheduled"}
    lines = err.strip().splitlines()
    assert lines[0].startswith("cancel label=wave:0 state=scheduled [") and "/9" in lines[0]
    assert lines[-1].startswith("cancel label=wave:0 state=scheduled succeeded: 9 of 9 "
                                "changed"), err
    assert len(list(client.iter_messages("drops", state="cancelled"))) == 10
    code, out, _ = duetime("operations", "show", "drops", op["id"], "--json")
    assert code == 0 and json.loads(out)["id"] == op["id"]
    code, _, err = duetime("operations", "shift", "drops", "--label", "wave:1")
    assert code == 2 and "--shift-ms" in err
    with running_operations(services):
        code, out, err = duetime("operations", "pause", "drops", "--label", "wave:1",
                                 "--wait", "--json")
    assert code == 0, err
    op = json.loads(out)["operation"]
    assert (op["state"], op["kind"], op["changed"]) == ("succeeded", "pause", 10), op
    assert {m["id"] for m in client.iter_messages("drops", state="paused")} == {
        f"d{n}" for n in range(1, 30, 3)}
