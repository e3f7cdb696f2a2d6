"""The `duetime` commands that talk to a running API (duetime_client.client), for people and
scripts:

  duetime topics [NAME] [--set FIELD=VALUE ...] [--delete]
  duetime enqueue TOPIC PAYLOAD_JSON [--id ID] [--delay-ms MS | --deliver-at TIME]
                  [--campaign C] [--priority N]
  duetime get TOPIC ID | cancel TOPIC ID | reschedule TOPIC ID (--delay-ms MS | --deliver-at T)
  duetime stats TOPIC [--window minute|hour]
  duetime campaigns TOPIC [NAME] [--pause | --resume | --rate N | --cancel | --shift-ms MS]
                    [--wait]  (follows a cancel or shift to its end with a progress bar)
  duetime dead TOPIC [--limit N] | retry TOPIC ID | lag TOPIC [--minutes N]
  duetime schedules TOPIC [NAME]
  duetime tail TOPIC       (consumes: leases, prints and acks each message as it comes due)

Tables for people by default, `--json` for scripts. The API is DUETIME_URL (default
http://127.0.0.1:8080) with the key DUETIME_API_KEY (default: the dev key `make up` wrote,
var/dev-key under the current directory).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from duetime_client.client import ApiError, ApiTimeout, ApiUnreachable, Client
from duetime_client.progress import ProgressBar

COMMANDS = ("topics", "enqueue", "get", "cancel", "reschedule", "stats", "campaigns",
            "schedules", "tail", "dead", "retry", "lag")
WAIT_POLL_S = 0.5
# the columns a table shows first, when its rows have them
FIRST_COLUMNS = ("name", "id", "from", "count", "p50_ms", "p99_ms", "campaign", "state",
                 "deliver_at", "last_error", "cron", "timezone",
                 "max_attempts", "lease_seconds", "paused", "max_per_second")
DEV_KEY = Path("var") / "dev-key"


def add_parsers(sub: Any) -> None:
    """The API commands, on the `duetime` parser's subparsers."""
    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="JSON out, for scripts")
        p.add_argument("--url", default=os.environ.get("DUETIME_URL", "http://127.0.0.1:8080"))
        p.add_argument("--key", default=os.environ.get("DUETIME_API_KEY"))
        return p

    p = command("topics", "list topics, show one, or create/update/delete it")
    p.add_argument("name", nargs="?")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a topic setting (JSON value), e.g. max_attempts=5")
    p.add_argument("--delete", action="store_true")
    p = command("enqueue", "put one message on a topic's timeline")
    p.add_argument("topic")
    p.add_argument("payload", help="the payload, as JSON")
    p.add_argument("--id")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay-ms", type=int)
    when.add_argument("--deliver-at")
    p.add_argument("--campaign")
    p.add_argument("--priority", type=int)
    for name, text in (("get", "show a message"), ("cancel", "cancel a message")):
        p = command(name, text)
        p.add_argument("topic")
        p.add_argument("id")
    p = command("reschedule", "move a scheduled message")
    p.add_argument("topic")
    p.add_argument("id")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay-ms", type=int)
    when.add_argument("--deliver-at")
    p = command("stats", "counts by state and the load ahead")
    p.add_argument("topic")
    p.add_argument("--window", choices=["minute", "hour"], default="minute")
    p = command("campaigns", "list campaigns, show one, or control it")
    p.add_argument("topic")
    p.add_argument("name", nargs="?")
    control = p.add_mutually_exclusive_group()
    control.add_argument("--pause", action="store_true")
    control.add_argument("--resume", action="store_true")
    control.add_argument("--rate", type=float, help="max_per_second (0: no limit)")
    control.add_argument("--cancel", action="store_true")
    control.add_argument("--shift-ms", type=int)
    p.add_argument("--wait", action="store_true",
                   help="with --cancel or --shift-ms: follow the operation to its end")
    p = command("dead", "a topic's dead messages, most recently dead first")
    p.add_argument("topic")
    p.add_argument("--limit", type=int, default=50)
    p = command("retry", "bring a dead message back (due now, attempts from 0)")
    p.add_argument("topic")
    p.add_argument("id")
    p = command("lag", "delivery lag per minute (count, p50, p99, max in ms)")
    p.add_argument("topic")
    p.add_argument("--minutes", type=int, default=15)
    p = command("schedules", "list a topic's schedules or show one")
    p.add_argument("topic")
    p.add_argument("name", nargs="?")
    p = command("tail", "consume a pull topic: print and ack each message as it comes due")
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")


def format_ms(epoch_ms: int) -> str:
    """Epoch ms → RFC 3339 UTC with millisecond precision, e.g. 2026-12-01T09:00:00.250Z."""
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def run(args: argparse.Namespace) -> int:
    """Run an API command: 0 done, 1 an error answer (its problem printed), 2 no key, 3 no
    answer from the API at the URL (none there, or none within the timeout)."""
    key = args.key or (DEV_KEY.read_text().strip() if DEV_KEY.exists() else "")
    if not key:
        print("no API key: set DUETIME_API_KEY or pass --key", file=sys.stderr)
        return 2
    client = Client(args.url, key, retries=2)
    try:
        answer = _HANDLERS[args.command](client, args)
    except ApiError as exc:
        print(json.dumps(exc.problem) if args.json else f"error {exc.status}: "
              f"{exc.problem.get('detail') or exc.problem.get('title')}", file=sys.stderr)
        return 1
    except ApiUnreachable:
        print(f"cannot reach the API at {args.url} (is it running? `make up` starts one)",
              file=sys.stderr)
        return 3
    except ApiTimeout as exc:
        print(f"no answer from the API at {args.url}: {exc}", file=sys.stderr)
        return 3
    if answer is not None:
        print(json.dumps(answer, indent=2) if args.json else _human(args.command, answer))
    return 0


def _topics(client: Client, args: argparse.Namespace) -> Any:
    if args.name is None:
        return client.list_topics()
    if args.delete:
        client.delete_topic(args.name)
        return {"deleted": args.name}
    if args.set:
        settings = {}
        for item in args.set:
            field, _, value = item.partition("=")
            try:
                settings[field] = json.loads(value)
            except json.JSONDecodeError:
                settings[field] = value
        return client.put_topic(args.name, **settings)
    return client.get_topic(args.name)


def _when(args: argparse.Namespace) -> dict[str, Any]:
    if args.delay_ms is not None:
        return {"delay_ms": args.delay_ms}
    return {"deliver_at": args.deliver_at} if args.deliver_at is not None else {}


def _enqueue(client: Client, args: argparse.Namespace) -> Any:
    fields = {**_when(args), **{k: v for k, v in (("id", args.id), ("campaign", args.campaign),
                                                   ("priority", args.priority)) if v is not None}}
    return client.enqueue(args.topic, json.loads(args.payload), **fields)


def _cancel(client: Client, args: argparse.Namespace) -> Any:
    client.cancel(args.topic, args.id)
    return {"cancelled": args.id}


def _campaigns(client: Client, args: argparse.Namespace) -> Any:
    if args.name is None:
        return client.campaigns(args.topic)
    if args.pause or args.resume:
        return client.control_campaign(args.topic, args.name, paused=bool(args.pause))
    if args.rate is not None:
        return client.control_campaign(args.topic, args.name,
                                       max_per_second=args.rate or None)
    if args.cancel or args.shift_ms is not None:
        size = sum(client.campaign(args.topic, args.name)["counts"].values())
        started = (client.cancel_campaign(args.topic, args.name) if args.cancel
                   else client.shift_campaign(args.topic, args.name, args.shift_ms))
        return _follow(client, args.topic, started["operation"], size) if args.wait else started
    return client.campaign(args.topic, args.name)


def _follow(client: Client, topic: str, operation: dict[str, Any], size: int) -> Any:
    """Poll the operation until it ends, with a progress bar of the campaign's messages
    processed (on stderr); its last state."""
    progress = ProgressBar()
    while operation["state"] == "running":
        progress.show(f"{operation['kind']} {operation['campaign']}", operation["processed"],
                      max(size, operation["processed"]))
        time.sleep(WAIT_POLL_S)
        operation = client.operation(topic, operation["id"])
    progress.finish(f"{operation['kind']} {operation['campaign']} {operation['state']}: "
                    f"{operation['changed']:,} of {operation['processed']:,} changed")
    return {"operation": operation}


def _tail(client: Client, args: argparse.Namespace) -> None:
    done = 0
    while not args.count or done < args.count:
        want = min(100, args.count - done) if args.count else 100
        for m in client.lease(args.topic, want, 20_000):
            line = json.dumps(m) if args.json else (
                f"{format_ms(int(time.time() * 1000))}  {m['id']}  due {m['deliver_at']}  "
                f"{json.dumps(m.get('payload'))}")
            print(line, flush=True)
            client.ack(args.topic, m)
            done += 1
    return None


_HANDLERS: dict[str, Callable[[Client, argparse.Namespace], Any]] = {
    "topics": _topics,
    "enqueue": _enqueue,
    "get": lambda c, a: c.get(a.topic, a.id),
    "cancel": _cancel,
    "reschedule": lambda c, a: c.reschedule(a.topic, a.id, **_when(a)),
    "stats": lambda c, a: c.stats(a.topic, a.window),
    "campaigns": _campaigns,
    "schedules": lambda c, a: c.schedule(a.topic, a.name) if a.name else c.schedules(a.topic),
    "tail": _tail,
    "dead": lambda c, a: c.dead_letters(a.topic, a.limit),
    "retry": lambda c, a: c.retry(a.topic, a.id),
    "lag": lambda c, a: c.lag(a.topic, a.minutes),
}


def _human(command: str, answer: Any) -> str:
    """A table for lists of objects, `field  value` lines for one object."""
    if isinstance(answer, list):
        if not answer:
            return "(none)"
        scalars = [k for k, v in answer[0].items() if not isinstance(v, dict | list)]
        columns = sorted(scalars, key=lambda k: (
            FIRST_COLUMNS.index(k) if k in FIRST_COLUMNS else len(FIRST_COLUMNS), k))[:6]
        rows = [[_cell(row.get(c)) for c in columns] for row in answer]
        widths = [max(len(c), *(len(r[n]) for r in rows)) for n, c in enumerate(columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
        return "\n".join(lines)
    width = max((len(k) for k in answer), default=0)
    return "\n".join(f"{k.ljust(width)}  {_cell(v)}" for k, v in answer.items())


def _cell(value: Any) -> str:
    return json.dumps(value) if isinstance(value, dict | list) else str(value)
