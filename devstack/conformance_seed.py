"""Test data for `make conformance` (devstack/conformance.sh): a topic `seed` holding one
resource of each kind that the operations acting on an existing message, campaign,
schedule or operation need, each with a lease or state that lets the call succeed once;
and a topic `scratch` for the calls that change or remove a whole topic.
Prints `export NAME=value` lines (lease tokens, the operation's id) that
devstack/schemathesis.toml reads. Args: the API's base URL and an API key."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from typing import Any

BASE, KEY = sys.argv[1], sys.argv[2]
LATER_MS = 30 * 86_400_000
DUE_NOW = ("held-ack", "held-extend", "held-nack", "dead")
SCHEDULES = 20  # devstack/schemathesis.toml names each


def call(method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        BASE + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text else None


def main() -> None:
    call("PUT", "/v1/topics/seed", {"max_attempts": 1, "lease_seconds": 3600})
    call("PUT", "/v1/topics/scratch", {})
    later = [{"id": i, "delay_ms": LATER_MS, "payload": {}} for i in ("get", "patch", "delete")]
    campaigns = [{"id": f"c-{c}", "campaign": f"camp-{c}", "delay_ms": LATER_MS, "payload": {}}
                 for c in ("get", "patch", "delete")]
    now = [{"id": i, "payload": {"n": n}} for n, i in enumerate(DUE_NOW)]
    call("POST", "/v1/topics/seed/messages:batch", {"messages": later + campaigns + now})
    for n in range(SCHEDULES):
        call("PUT", f"/v1/topics/seed/schedules/nightly-{n}",
             {"cron": "0 3 * * *", "payload": {}, "timezone": "UTC"})
    op = call("POST", "/v1/topics/seed/operations",
              {"kind": "cancel", "filter": {"label": ["seed:none"]}})["operation"]
    tokens: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while len(tokens) < len(DUE_NOW) and time.monotonic() < deadline:
        got = call("POST", "/v1/topics/seed/leases", {"max": 10, "wait_ms": 2000})
        tokens.update((m["id"], m["lease"]["token"]) for m in got["messages"])
    if len(tokens) < len(DUE_NOW):
        sys.exit(f"conformance seed: only {sorted(tokens)} of {DUE_NOW} were leased")
    call("POST", "/v1/topics/seed/messages/dead/nack", {"lease_token": tokens["dead"]})
    for name in ("ack", "extend", "nack"):
        print(f"export SEED_{name.upper()}_TOKEN='{tokens['held-' + name]}'")
    print(f"export SEED_OPERATION='{op['id']}'")


if __name__ == "__main__":
    main()
