"""Search of a topic's messages (GET /v1/topics/{topic}/messages) on the real node, through
its storage-attached indexes: every filter alone and together, paging with no message shown
twice and none skipped while messages change state, the 400s, and tenants kept apart. Also
recipient, labels and timezone on a message and a topic's default timezone."""

from __future__ import annotations

import itertools
import re
import uuid
from typing import Any

from flask.testing import FlaskClient

from app.messages.search import TOKEN_PATTERN
from app.messages.zones import effective_zone
from app.models import MessageFilter, MessageState, TopicSettings
from app.services import Services
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient, now_ms

HOUR_MS = 3_600_000
RECIPIENTS = ("ann", "bob", "cy")
TIERS = ("gold", "free")


def search(topic: TopicClient, **query: Any) -> Any:
    return topic.client.get(topic.url("/messages"), query_string=query, headers=topic.headers)


def every_page(topic: TopicClient, **query: Any) -> list[str]:
    """Ids of all pages of a search, in order; asserts each page answered 200."""
    ids: list[str] = []
    token = None
    while True:
        answer = search(topic, **query, **({"page_token": token} if token else {}))
        assert answer.status_code == 200, answer.get_json()
        body = answer.get_json()
        ids += [m["id"] for m in body["messages"]]
        token = body["next_page_token"]
        if token is None:
            return ids


def seeded(client: FlaskClient, auth: dict[str, str]) -> tuple[TopicClient, list[dict[str, Any]]]:
    """A topic with 24 messages: recipient, tier label, campaign and due hour cycling, so
    every combination of filters has an answer to check."""
    topic = TopicClient(client, auth)
    base = now_ms() + 10 * HOUR_MS
    messages = []
    for n in range(24):
        messages.append({
            "id": f"m{n:02d}", "recipient": RECIPIENTS[n % 3],
            "labels": {"tier": TIERS[n % 2], "n": str(n)},
            "campaign": "spring" if n % 4 < 2 else "fall",
            "deliver_at": base + (n % 6) * HOUR_MS, "payload": {"n": n}})
    assert all(r["status"] == 201 for r in topic.batch([dict(m) for m in messages]))
    for m in messages:
        m["state"] = "scheduled"
    for n in (0, 5, 10):  # some cancelled, so the state filter has two answers
        assert topic.client.delete(topic.url(f"/messages/m{n:02d}"),
                                   headers=auth).status_code == 204
        messages[n]["state"] = "cancelled"
    return topic, messages


def expected(messages: list[dict[str, Any]], query: dict[str, Any]) -> set[str]:
    def keeps(m: dict[str, Any]) -> bool:
        label = query.get("label")
        return (("state" not in query or m["state"] == query["state"])
                and ("campaign" not in query or m["campaign"] == query["campaign"])
                and ("recipient" not in query or m["recipient"] == query["recipient"])
                and (label is None or m["labels"]["tier"] == label.split(":", 1)[1])
                and ("due_from" not in query or m["deliver_at"] >= query["due_from"])
                and ("due_to" not in query or m["deliver_at"] < query["due_to"]))
    return {m["id"] for m in messages if keeps(m)}


def test_every_filter_alone_and_in_every_combination(client: FlaskClient,
                                                     services: Services) -> None:
    _, auth = new_tenant_key(services, "search")
    topic, messages = seeded(client, auth)
    first = min(m["deliver_at"] for m in messages)
    values = {"state": "scheduled", "campaign": "spring", "recipient": "bob",
              "label": "tier:gold", "due_from": first + HOUR_MS, "due_to": first + 4 * HOUR_MS}
    for size in range(len(values) + 1):
        for names in itertools.combinations(values, size):
            query = {name: values[name] for name in names}
            found = every_page(topic, **query, limit=7)
            assert len(found) == len(set(found)), query
            assert set(found) == expected(messages, query), query


def test_a_message_shows_what_it_carries_and_search_finds_it(client: FlaskClient,
                                                             services: Services) -> None:
    _, auth = new_tenant_key(services, "search")
    topic = TopicClient(client, auth)
    made = topic.enqueue(id="x1", recipient="user-7", labels={"tier": "gold", "v": "a:b"},
                         timezone="Asia/Tokyo", delay_ms=60_000)
    assert made.status_code == 201, made.get_json()
    shown = topic.get("x1").get_json()
    assert (shown["recipient"], shown["labels"], shown["timezone"]) == (
        "user-7", {"tier": "gold", "v": "a:b"}, "Asia/Tokyo")
    body = search(topic, label="v:a:b").get_json()  # a value with a colon
    assert [m["id"] for m in body["messages"]] == ["x1"] and body["next_page_token"] is None
    assert "payload" not in body["messages"][0] and body["messages"][0]["labels"]["tier"] == "gold"
    # a move keeps them; a replace changes them as a whole (a dropped key is gone)
    moved = client.patch(topic.url("/messages/x1"), headers=auth, json={"delay_ms": 120_000})
    assert moved.get_json()["labels"] == {"tier": "gold", "v": "a:b"}
    again = topic.enqueue(id="x1", if_exists="replace", recipient="user-8",
                          labels={"tier": "free"}, delay_ms=60_000)
    assert again.status_code == 200, again.get_json()
    shown = topic.get("x1").get_json()
    assert (shown["recipient"], shown["labels"], shown["timezone"]) == (
        "user-8", {"tier": "free"}, None)
    assert search(topic, label="tier:gold").get_json()["messages"] == []
    assert [m["id"] for m in search(topic, recipient="user-8").get_json()["messages"]] == ["x1"]


def test_a_leased_message_shows_its_recipient_and_labels(client: FlaskClient,
                                                         services: Services) -> None:
    _, auth = new_tenant_key(services, "search")
    topic = TopicClient(client, auth)
    topic.enqueue(recipient="r-1", labels={"k": "v"})
    topic.enqueue()
    got = topic.lease(10, wait_ms=10_000)
    while len(got) < 2:
        got += topic.lease(10, wait_ms=5_000)
    shown = sorted((m["recipient"] or "-", m["labels"]) for m in got)
    assert shown == [("-", {}), ("r-1", {"k": "v"})]


def test_paging_shows_none_twice_and_skips_none_while_states_change(
        client: FlaskClient, services: Services) -> None:
    """60 labelled messages read 8 at a time; between pages messages ahead and behind the
    search are cancelled. Filtered by label: every message once. Filtered by state
    scheduled: every message scheduled throughout, once; none cancelled before the search
    reached it."""
    _, auth = new_tenant_key(services, "search")
    topic = TopicClient(client, auth)
    ids = [f"p{n:02d}" for n in range(60)]
    assert all(r["status"] == 201 for r in topic.batch(
        [{"id": i, "labels": {"wave": "1"}, "delay_ms": 3_600_000} for i in ids]))
    cancelled: set[str] = set()
    seen: dict[str, list[str]] = {"label": [], "state": []}
    tokens: dict[str, str | None] = {"label": None, "state": None}
    queries = {"label": {"label": "wave:1"}, "state": {"state": "scheduled", "label": "wave:1"}}
    victims = iter(ids[::-1])  # from the end of the id list: some read already, some not
    done: set[str] = set()
    while len(done) < 2:
        for kind in ("label", "state"):
            if kind in done:
                continue
            token = tokens[kind]
            page = search(topic, **queries[kind], limit=8,
                          **({"page_token": token} if token else {})).get_json()
            seen[kind] += [m["id"] for m in page["messages"]]
            tokens[kind] = page["next_page_token"]
            if tokens[kind] is None:
                done.add(kind)
        for victim in itertools.islice(victims, 3):
            assert client.delete(topic.url(f"/messages/{victim}"), headers=auth).status_code == 204
            cancelled.add(victim)
    assert sorted(seen["label"]) == ids  # none twice, none skipped
    state_seen = seen["state"]
    assert len(state_seen) == len(set(state_seen))
    never_cancelled = set(ids) - cancelled
    assert never_cancelled <= set(state_seen)


def test_bad_searches_answer_400_naming_the_field(client: FlaskClient,
                                                  services: Services) -> None:
    _, auth = new_tenant_key(services, "search")
    topic = TopicClient(client, auth)
    bad = [({"label": "novalue"}, "label"), ({"label": "Bad Key:v"}, "label"),
           ({"label": "k:" + "v" * 65}, "label"),
           ({"label": [f"k{n}:v" for n in range(11)]}, "label"),
           ({"limit": 0}, "limit"),
           ({"limit": 1001}, "limit"), ({"limit": "ten"}, "limit"),
           ({"state": "asleep"}, "state"), ({"recipient": "a b"}, "recipient"),
           ({"due_from": "yesterday"}, "due_from"),
           ({"page_token": "%%%"}, "page_token"), ({"page_token": "WzEsMiwzXQ"}, "page_token"),
           ({"page_token": "1~2~a b"}, "page_token"), ({"page_token": "1~2~" + "x" * 129},
                                                       "page_token")]
    for query, field in bad:
        answer = search(topic, **query)
        assert answer.status_code == 400, (query, answer.get_json())
        assert answer.content_type == "application/problem+json"
        assert field in answer.get_json()["errors"], (query, answer.get_json())


def test_a_page_token_is_a_place_any_search_can_go_on_from(client: FlaskClient,
                                                            services: Services) -> None:
    """A token is where the page stopped, in plain text: any string of its pattern is
    taken (past the ring's ends: nothing after), and with other filters the search goes on
    from that place."""
    _, auth = new_tenant_key(services, "search")
    topic = TopicClient(client, auth)
    topic.batch([{"labels": {"k": "v"}} for _ in range(3)])
    first = search(topic, label="k:v", limit=1).get_json()
    token = first["next_page_token"]
    assert re.fullmatch(TOKEN_PATTERN, token)
    rest = search(topic, label="k:v", page_token=token).get_json()["messages"]
    assert len(rest) == 2 and first["messages"][0]["id"] not in {m["id"] for m in rest}
    assert search(topic, page_token=token).get_json()["messages"] == rest  # other filters
    assert search(topic, label="k:w", page_token=token).get_json()["messages"] == []
    for made_up in ("9" * 19 + "~" + "9" * 10 + "~zz", "-" + "9" * 19 + "~0~a"):
        answer = search(topic, page_token=made_up)
        assert answer.status_code == 200, answer.get_json()
    elsewhere = TopicClient(client, auth)
    assert search(elsewhere, label="k:v", page_token=token).status_code == 200


def test_a_search_that_can_match_nothing_is_answered_empty(client: FlaskClient,
                                                            services: Services) -> None:
    """A label key given twice requires both values (none when they differ); a due_to at
    or before due_from matches nothing. Both are answered, not refused."""
    _, auth = new_tenant_key(services, "search")
    topic = TopicClient(client, auth)
    topic.batch([{"labels": {"k": "1"}, "delay_ms": 60_000}])
    assert len(search(topic, label=["k:1", "k:1"]).get_json()["messages"]) == 1
    for query in ({"label": ["k:1", "k:2"]},
                  {"due_from": "2030-01-02T00:00:00Z", "due_to": "2030-01-01T00:00:00Z"},
                  {"due_from": "2020-01-01T00:00:00Z", "due_to": "2020-01-01T00:00:00Z"}):
        answer = search(topic, **query)
        assert answer.status_code == 200, answer.get_json()
        assert answer.get_json() == {"messages": [], "next_page_token": None}


def test_labels_are_checked_at_enqueue(client: FlaskClient, services: Services) -> None:
    _, auth = new_tenant_key(services, "search")
    topic = TopicClient(client, auth)
    for labels in ({f"k{n}": "v" for n in range(11)}, {"Bad": "v"}, {"k": "v" * 65},
                   {"k": 1}, ["k", "v"]):
        answer = topic.enqueue(labels=labels)
        assert answer.status_code == 400 and "labels" in answer.get_json()["errors"], labels
    assert topic.enqueue(recipient="no spaces").status_code == 400
    results = topic.batch([{"labels": {"Bad": "v"}}, {"labels": {"ok": "v"}}])
    assert [r["status"] for r in results] == [400, 201]


def test_a_tenant_finds_only_its_own_messages(client: FlaskClient, services: Services) -> None:
    _, mine = new_tenant_key(services, "search")
    _, theirs = new_tenant_key(services, "search")
    topic = TopicClient(client, mine)
    topic.enqueue(recipient="shared", labels={"k": "v"})
    same_name = TopicClient(client, theirs, name=topic.name)
    same_name.enqueue(recipient="shared", labels={"k": "v"})
    mine_found = search(topic, recipient="shared").get_json()["messages"]
    theirs_found = search(same_name, recipient="shared").get_json()["messages"]
    assert len(mine_found) == len(theirs_found) == 1
    assert mine_found[0]["id"] != theirs_found[0]["id"]
    unknown = client.get("/v1/topics/nosuchtopic/messages", headers=theirs)
    assert unknown.status_code == 404


def test_a_topic_has_a_default_timezone(client: FlaskClient, services: Services) -> None:
    _, auth = new_tenant_key(services, "search")
    topic = TopicClient(client, auth)
    assert client.get(topic.url(), headers=auth).get_json()["timezone"] == "UTC"
    changed = client.put(topic.url(), headers=auth, json={"timezone": "America/New_York"})
    assert changed.status_code == 200 and changed.get_json()["timezone"] == "America/New_York"
    assert client.put(topic.url(), headers=auth, json={"lease_seconds": 40}).get_json()[
        "timezone"] == "America/New_York"  # kept when not given
    bad = client.put(topic.url(), headers=auth, json={"timezone": "Mars/Olympus"})
    assert bad.status_code == 400 and "timezone" in bad.get_json()["errors"]


def test_a_message_zone_is_its_own_else_its_topic_else_utc() -> None:
    assert effective_zone(TopicSettings(), None) == "UTC"
    assert effective_zone(TopicSettings(timezone="Europe/Paris"), None) == "Europe/Paris"
    assert effective_zone(TopicSettings(timezone="Europe/Paris"), "Asia/Tokyo") == "Asia/Tokyo"


def test_a_filter_matches_a_row_as_the_indexes_do() -> None:
    """MessageFilter.matches, which rechecks what the indexes found (and which filtered
    operations use): every field ANDed, the due range half-open."""
    row = MessageState(uuid.uuid4(), "m1", "scheduled", 1, 100, 100, 100, "spring", 0, 0, "h",
                       None, None, None, None, 0, 0, recipient="ann",
                       labels={"tier": "gold", "n": "1"})
    assert MessageFilter().matches(row)
    assert MessageFilter(state="scheduled", campaign="spring", recipient="ann",
                         labels=(("tier", "gold"), ("n", "1")), due_from_ms=100,
                         due_to_ms=101).matches(row)
    for other in (MessageFilter(state="leased"), MessageFilter(campaign="fall"),
                  MessageFilter(recipient="bob"), MessageFilter(labels=(("tier", "free"),)),
                  MessageFilter(labels=(("tier", "gold"), ("x", "1"))),
                  MessageFilter(due_from_ms=101), MessageFilter(due_to_ms=100)):
        assert not other.matches(row), other
