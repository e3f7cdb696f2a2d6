"""The `duetime` commands that talk to a running API (duetime_client.client), for people and
scripts:

  duetime topics [NAME] [--set FIELD=VALUE ...] [--lease-seconds S] [--max-attempts N]
                 [--shards N] [--pull | --webhook-url URL [--timeout-seconds S]]
                 [--backoff-seconds S] [--max-backoff-seconds S] [--delete]
  duetime topics NAME --rotate-secret [--overlap-seconds S]
  duetime enqueue TOPIC PAYLOAD_JSON [--id ID] [--delay-ms MS | --deliver-at TIME]
                  [--campaign C] [--priority N]
  duetime get TOPIC ID | cancel TOPIC ID | reschedule TOPIC ID (--delay-ms MS | --deliver-at T)
  duetime stats TOPIC [--window minute|hour]
  duetime campaigns TOPIC [NAME] [--pause | --resume | --rate N | --cancel | --shift-ms MS]
                    [--wait]  (follows a cancel or shift to its end with a progress bar)
  duetime dead TOPIC [--limit N] | retry TOPIC ID | lag TOPIC [--minutes N]
  duetime messages TOPIC [--state S] [--campaign C] [--recipient R] [--label KEY:VALUE ...]
                   [--due-from T] [--due-to T] [--limit N]  (finds messages; a table)
  duetime operations cancel|shift|pause|resume TOPIC [--state S] [--campaign C]
                     [--recipient R] [--label KEY:VALUE ...] [--due-from T] [--due-to T]
                     [--shift-ms MS] [--wait]  (acts on the messages the filters match;
                     --wait follows it to its end with a progress bar)
  duetime operations show TOPIC ID [--wait]
  duetime schedules TOPIC [NAME] [--cron CRON --payload JSON [--timezone Z] [--priority N]
                    [--campaign C] [--start-at T] [--end-at T] [--misfire M] | --delete]
  duetime tail TOPIC       (consumes: leases, prints and acks each message as it comes due)

Tables for people by default, `--json` for scripts. The API is DUETIME_URL (default
http://127.0.0.1:8080) with the key DUETIME_API_KEY; without one, an API on this machine
gets the dev key `make up` wrote (var/dev-key under the current directory).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from duetime_client.client import ApiError, ApiTimeout, ApiUnreachable, Client
from duetime_client.output import format_ms, human, problem_text, table
from duetime_client.progress import ProgressBar

COMMANDS = ("topics", "enqueue", "get", "cancel", "reschedule", "stats", "campaigns",
            "schedules", "tail", "dead", "retry", "lag", "messages", "operations")
WAIT_POLL_S = 0.5
DEV_KEY = Path("var") / "dev-key"
# topics' plain setting flags: (flag, type, the setting's path in the topic)
TOPIC_FLAGS: tuple[tuple[str, type, tuple[str, ...]], ...] = (
    ("--lease-seconds", int, ("lease_seconds",)),
    ("--max-attempts", int, ("max_attempts",)),
    ("--shards", int, ("shards",)),
    ("--webhook-url", str, ("delivery", "url")),
    ("--timeout-seconds", float, ("delivery", "timeout_seconds")),
    ("--backoff-seconds", float, ("retry", "backoff_seconds")),
    ("--max-backoff-seconds", float, ("retry", "max_backoff_seconds")),
)
SCHEDULE_FLAGS = ("timezone", "priority", "campaign", "start_at", "end_at", "misfire")


class UsageError(Exception):
    """The command line asks for something it cannot mean: one line, exit 2."""


def add_parsers(sub: Any) -> None:
    """The API commands, on the `duetime` parser's subparsers."""
    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="JSON out, for scripts")
        p.add_argument("--url", default=os.environ.get("DUETIME_URL", "http://127.0.0.1:8080"),
                       help="the API (DUETIME_URL)")
        p.add_argument("--key", default=os.environ.get("DUETIME_API_KEY"),
                       help="the API key (DUETIME_API_KEY)")
        return p

    p = command("topics", "list topics, show one, or create/update/delete it")
    p.add_argument("name", nargs="?")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a topic setting (JSON value), e.g. max_attempts=5")
    for flag, kind, _ in TOPIC_FLAGS:
        p.add_argument(flag, type=kind)
    p.add_argument("--pull", action="store_true", help="deliver by leases (the default)")
    p.add_argument("--delete", action="store_true")
    p.add_argument("--rotate-secret", action="store_true",
                   help="a new webhook signing secret (the old one signs beside it a while)")
    p.add_argument("--overlap-seconds", type=int,
                   help="with --rotate-secret: how long the old secret still signs")
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
    p = command("messages", "find a topic's messages by state, campaign, recipient, labels "
                "and due time (every filter given must hold)")
    p.add_argument("topic")
    _filter_flags(p)
    p.add_argument("--limit", type=int, default=100, help="show at most this many (100)")
    p = command("operations", "cancel, shift, pause or resume the messages the filters match "
                "(every filter given must hold), or show an operation")
    p.add_argument("action", choices=["cancel", "shift", "pause", "resume", "show"])
    p.add_argument("topic")
    p.add_argument("id", nargs="?", help="show: the operation's id")
    _filter_flags(p)
    p.add_argument("--shift-ms", type=int, help="shift: move each message by this many ms")
    p.add_argument("--wait", action="store_true",
                   help="follow the operation to its end with a progress bar")
    p = command("retry", "bring a dead message back (due now, attempts from 0)")
    p.add_argument("topic")
    p.add_argument("id")
    p = command("lag", "delivery lag per minute (count, p50, p99, max in ms)")
    p.add_argument("topic")
    p.add_argument("--minutes", type=int, default=15)
    p = command("schedules", "list a topic's schedules, show one, or create/replace/delete it")
    p.add_argument("topic")
    p.add_argument("name", nargs="?")
    p.add_argument("--cron", help="5 fields, or 6 with seconds first")
    p.add_argument("--payload", help="the payload of each fire, as JSON")
    p.add_argument("--timezone")
    p.add_argument("--priority", type=int)
    p.add_argument("--campaign")
    p.add_argument("--start-at")
    p.add_argument("--end-at")
    p.add_argument("--misfire", choices=["fire_once", "skip"])
    p.add_argument("--delete", action="store_true")
    p = command("tail", "consume a pull topic: print and ack each message as it comes due")
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")


def _filter_flags(p: argparse.ArgumentParser) -> None:
    """The search's filters as flags (`messages`, `operations`)."""
    p.add_argument("--state", choices=["scheduled", "paused", "leased", "delivered",
                                       "cancelled", "dead"])
    p.add_argument("--campaign")
    p.add_argument("--recipient")
    p.add_argument("--label", action="append", metavar="KEY:VALUE",
                   help="a label the messages carry (repeat it: each is required)")
    p.add_argument("--due-from", help="deliver_at at or after this (RFC 3339 or epoch ms)")
    p.add_argument("--due-to", help="deliver_at before this (RFC 3339 or epoch ms)")


def is_local(url: str) -> bool:
    """Whether url's host is this machine: localhost, 127.0.0.0/8 or ::1."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(args: argparse.Namespace) -> str:
    """--key or DUETIME_API_KEY; else, for an API on this machine only, the dev key file."""
    if args.key:
        return str(args.key)
    if is_local(args.url) and DEV_KEY.exists():
        return DEV_KEY.read_text().strip()
    return ""


def run(args: argparse.Namespace) -> int:
    """Run an API command: 0 done, 1 an error answer (its problem printed), 2 a usage error
    or no key, 3 no answer from the API at the URL (none there, or none within the
    timeout)."""
    check_usage(args)
    key = api_key(args)
    if not key:
        print("no API key: set DUETIME_API_KEY or pass --key (var/dev-key is used only for "
              "an API on this machine)", file=sys.stderr)
        return 2
    with Client(args.url, key, retries=2) as client:
        try:
            answer = _HANDLERS[args.command](client, args)
        except ApiError as exc:
            print(json.dumps(exc.problem) if args.json else problem_text(exc.status, exc.problem),
                  file=sys.stderr)
            return 1
        except ApiUnreachable:
            print(f"cannot reach the API at {args.url} (is it running? `make up` starts one)",
                  file=sys.stderr)
            return 3
        except ApiTimeout as exc:
            print(f"no answer from the API at {args.url}: {exc}", file=sys.stderr)
            return 3
    if answer is not None:
        print(json.dumps(answer, indent=2) if args.json else human(args.command, answer))
    return 0


def check_usage(args: argparse.Namespace) -> None:
    """UsageError for an action flag without the name it acts on, or a flag that goes with
    another one given alone."""
    named = {"topics": ("name", [*(f for f, _, _ in TOPIC_FLAGS), "--set", "--pull",
                                 "--delete", "--rotate-secret", "--overlap-seconds"]),
             "campaigns": ("name", ["--pause", "--resume", "--rate", "--cancel", "--shift-ms",
                                    "--wait"]),
             "schedules": ("name", ["--cron", "--payload", *(
                 "--" + f.replace("_", "-") for f in SCHEDULE_FLAGS), "--delete"])}
    if args.command == "operations":
        _check_operation_usage(args)
    if args.command not in named:
        return
    target, flags = named[args.command]
    given = [f for f in flags if getattr(args, f[2:].replace("-", "_")) not in (None, False, [])]
    if given and getattr(args, target) is None:
        raise UsageError(f"{given[0]} needs a {args.command[:-1]} NAME")
    if args.command == "campaigns" and args.wait and args.shift_ms is None and not args.cancel:
        raise UsageError("--wait goes with --cancel or --shift-ms")
    if args.command == "topics":
        if args.overlap_seconds is not None and not args.rotate_secret:
            raise UsageError("--overlap-seconds goes with --rotate-secret")
        if args.pull and args.webhook_url is not None:
            raise UsageError("--pull and --webhook-url exclude each other")
    if args.command == "schedules" and args.delete and len(given) > 1:
        raise UsageError("--delete takes no other schedule flag")


def _check_operation_usage(args: argparse.Namespace) -> None:
    if (args.action == "show") != (args.id is not None):
        raise UsageError("an operation ID goes with show, and only with it")
    if (args.action == "shift") != (args.shift_ms is not None):
        raise UsageError("--shift-ms goes with shift, and only with it")


def json_argument(name: str, text: str) -> Any:
    """text parsed as JSON, or a UsageError naming the argument."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{name} is not JSON ({exc.msg} at character {exc.pos}): "
                         f"{text[:60]}") from None


def _topics(client: Client, args: argparse.Namespace) -> Any:
    if args.name is None:
        return client.list_topics()
    if args.delete:
        client.delete_topic(args.name)
        return {"deleted": args.name}
    if args.rotate_secret:
        return client.rotate_signing_secret(args.name, args.overlap_seconds)
    settings = _topic_settings(args)
    return client.put_topic(args.name, **settings) if settings else client.get_topic(args.name)


def _topic_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of --set FIELD=VALUE and the plain flags."""
    settings: dict[str, Any] = {}
    for item in args.set:
        field, _, value = item.partition("=")
        try:
            settings[field] = json.loads(value)
        except json.JSONDecodeError:
            settings[field] = value
    for flag, _, path in TOPIC_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            inner = settings
            for part in path[:-1]:
                inner = inner.setdefault(part, {})
            inner[path[-1]] = value
    if args.webhook_url is not None:
        settings["delivery"]["mode"] = "webhook"
    if args.pull:
        settings.setdefault("delivery", {})["mode"] = "pull"
    return settings


def _when(args: argparse.Namespace) -> dict[str, Any]:
    if args.delay_ms is not None:
        return {"delay_ms": args.delay_ms}
    return {"deliver_at": args.deliver_at} if args.deliver_at is not None else {}


def _enqueue(client: Client, args: argparse.Namespace) -> Any:
    payload = json_argument("PAYLOAD", args.payload)
    fields = {**_when(args), **{k: v for k, v in (("id", args.id), ("campaign", args.campaign),
                                                   ("priority", args.priority)) if v is not None}}
    return client.enqueue(args.topic, payload, **fields)


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


def _follow(client: Client, topic: str, operation: dict[str, Any], size: int | None) -> Any:
    """Poll the operation until it ends, with a progress bar of the messages processed out
    of `size` (None: unknown) on stderr; its last state."""
    progress = ProgressBar()
    what = f"{operation['kind']} " + (
        operation["campaign"] or _filter_text(operation.get("filter")))
    while operation["state"] == "running":
        progress.show(what, operation["processed"],
                      None if size is None else max(size, operation["processed"]))
        time.sleep(WAIT_POLL_S)
        operation = client.operation(topic, operation["id"])
    progress.finish(f"{what} {operation['state']}: "
                    f"{operation['changed']:,} of {operation['processed']:,} changed")
    return {"operation": operation}


def _filter_text(flt: dict[str, Any] | None) -> str:
    """A filter as `key=value` words (`every message` when empty)."""
    words = [f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in (flt or {}).items()]
    return " ".join(words) or "every message"


def _operations(client: Client, args: argparse.Namespace) -> Any:
    """Start an operation on the filter's messages (or show one); with --wait, the matching
    messages are counted first (a search, ids only) for the progress bar's total, but for
    a pause or resume of a campaign alone (its flag)."""
    if args.action == "show":
        found = client.operation(args.topic, args.id)
        return _follow(client, args.topic, found, None) if args.wait else found
    filters = {"state": args.state, "campaign": args.campaign, "recipient": args.recipient,
               "label": args.label, "due_from": args.due_from, "due_to": args.due_to}
    size = None
    given = [k for k, v in filters.items() if v]
    by_flag = args.action in ("pause", "resume") and given == ["campaign"]  # at once
    if args.wait and not by_flag:
        size = sum(1 for _ in client.iter_messages(args.topic, 1000, **filters))
    started = client.start_operation(args.topic, args.action, args.shift_ms, **filters)
    return _follow(client, args.topic, started["operation"], size) if args.wait else started


def _schedules(client: Client, args: argparse.Namespace) -> Any:
    if args.name is None:
        return client.schedules(args.topic)
    if args.delete:
        client.delete_schedule(args.topic, args.name)
        return {"deleted": args.name}
    fields = {f: getattr(args, f) for f in SCHEDULE_FLAGS if getattr(args, f) is not None}
    if args.cron is None and args.payload is None and not fields:
        return client.schedule(args.topic, args.name)
    if args.cron is None or args.payload is None:
        raise UsageError("a schedule needs both --cron and --payload")
    return client.put_schedule(args.topic, args.name, args.cron,
                               json_argument("--payload", args.payload), **fields)


MESSAGE_COLUMNS = ["id", "state", "deliver_at", "recipient", "campaign", "labels"]


def _messages(client: Client, args: argparse.Namespace) -> Any:
    """Up to --limit matching messages (pages of at most 1,000): for people a table, labels
    as key:value (`-` for what a message lacks); for scripts the messages as the API shows
    them."""
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    found = []
    for message in client.iter_messages(
            args.topic, min(args.limit, 1000), state=args.state, campaign=args.campaign,
            recipient=args.recipient, label=args.label, due_from=args.due_from,
            due_to=args.due_to):
        found.append(message)
        if len(found) == args.limit:
            break
    if args.json:
        return found
    rows = [{**m, "labels": " ".join(f"{k}:{v}" for k, v in (m.get("labels") or {}).items())
             or None} for m in found]
    print(table(rows, MESSAGE_COLUMNS))
    return None


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
    "schedules": _schedules,
    "tail": _tail,
    "dead": lambda c, a: c.dead_letters(a.topic, a.limit),
    "retry": lambda c, a: c.retry(a.topic, a.id),
    "lag": lambda c, a: c.lag(a.topic, a.minutes),
    "messages": _messages,
    "operations": _operations,
}
