"""Which addresses webhooks may reach: pure checks, and the API refusing a topic whose URL is
a literal address that is not public (the releaser checks names when it resolves them:
tests/test_http_client.py)."""

from __future__ import annotations

import asyncio

import pytest
from flask.testing import FlaskClient

from app.delivery.webhook_targets import Network, parse_allow, refusal, url_refusal
from workers.http_client import AsyncHttpClient
from workers.webhook import post_outcome

NONE: tuple[Network, ...] = ()


@pytest.mark.parametrize("ip", [
    "127.0.0.1", "127.8.9.10", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "fd00::1",
    "169.254.169.254", "fe80::1", "100.64.0.1", "0.0.0.0", "::", "224.0.0.1",
    "::ffff:10.0.0.1", "::ffff:127.0.0.1"])
def test_non_public_addresses_are_refused_by_default(ip: str) -> None:
    assert refusal(ip, NONE) is not None


@pytest.mark.parametrize("ip", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_may_be_posted_to(ip: str) -> None:
    assert refusal(ip, NONE) is None


def test_an_allow_list_opens_only_its_networks() -> None:
    allow = parse_allow("127.0.0.0/8, ::1, 10.20.0.0/16")
    assert refusal("127.0.0.1", allow) is None and refusal("::1", allow) is None
    assert refusal("10.20.3.4", allow) is None
    assert refusal("10.21.3.4", allow) is not None
    assert refusal("169.254.169.254", allow) is not None
    with pytest.raises(ValueError, match="not a network"):
        parse_allow("127.0.0.0/8,loopback")


def test_urls_are_judged_by_their_literal_address_or_localhost() -> None:
    assert url_refusal("http://10.0.0.5:8080/hook", NONE) is not None
    assert url_refusal("http://[::1]/hook", NONE) is not None
    assert url_refusal("http://localhost/hook", NONE) is not None
    assert url_refusal("http://api.localhost/hook", NONE) is not None
    assert url_refusal("https://hooks.example.com/x", NONE) is None  # checked when resolved
    assert url_refusal("http://localhost/hook", parse_allow("127.0.0.0/8")) is None


def test_a_topic_whose_webhook_is_a_private_address_is_refused(
        client: FlaskClient, auth: dict[str, str]) -> None:
    for url in ("http://10.0.0.5/hook", "http://169.254.169.254/latest/meta-data"):
        answer = client.put("/v1/topics/inward", headers=auth,
                            json={"delivery": {"mode": "webhook", "url": url}})
        assert answer.status_code == 400, answer.get_json()
        assert answer.mimetype == "application/problem+json"
        assert "url" in answer.get_json()["errors"]["delivery"]
    allowed = client.put("/v1/topics/inward", headers=auth,  # the tests allow loopback
                         json={"delivery": {"mode": "webhook", "url": "http://127.0.0.1:9/h"}})
    assert allowed.status_code == 201


# every spelling of a non-public address the resolver reads as one, and IPv6 addresses
# that lead to one (6to4, Teredo, NAT64, IPv4-mapped, IPv4-compatible)
DISGUISED = ["http://2852039166/", "http://0xa9fea9fe/", "http://169.254.169.254/",
             "http://0251.0376.0251.0376/", "http://169.254.43518/", "http://10.1/",
             "http://0x7f.1:8080/h", "http://[2002:a9fe:a9fe::]/", "http://[2002:0a00:0001::1]/",
             "http://[64:ff9b::a9fe:a9fe]/", "http://[64:ff9b:1::a00:1]/",
             "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "http://[::ffff:a9fe:a9fe]/",
             "http://[::a9fe:a9fe]/"]


@pytest.mark.parametrize("url", DISGUISED)
def test_disguised_private_addresses_are_refused(url: str) -> None:
    assert url_refusal(url, NONE) is not None


def test_an_embedded_address_is_judged_with_the_allow_list_and_public_ones_go() -> None:
    assert url_refusal("http://[2002:808:808::]/", NONE) is None  # 6to4 of 8.8.8.8
    assert url_refusal("http://134744072/", NONE) is None  # 8.8.8.8
    assert url_refusal("http://2130706433/", parse_allow("127.0.0.0/8")) is None
    assert url_refusal("http://[2002:7f00:1::]/", parse_allow("127.0.0.0/8")) is None
    assert url_refusal("http://[2002:a9fe:a9fe::]/", parse_allow("127.0.0.0/8")) is not None
    assert url_refusal("http://0x7f.example.com/", NONE) is None  # a name: checked resolved
    assert refusal("2002:a9fe:a9fe::", NONE) == (
        "2002:a9fe:a9fe:: leads to 169.254.169.254: 169.254.169.254 is a private address")


# URLs fields.Url takes that a POST could not carry as written: each died at its first POST
UNSENDABLE = ["http://127.0.0.1:99999/x", "http://example.com:0/", "http://user:pw@example.com/",
              "http://user@example.com/", "http://example.com/#frag"]


@pytest.mark.parametrize("url", DISGUISED + UNSENDABLE)
def test_a_topic_whose_webhook_is_disguised_or_unsendable_is_refused(
        client: FlaskClient, auth: dict[str, str], url: str) -> None:
    answer = client.put("/v1/topics/disguised", headers=auth,
                        json={"delivery": {"mode": "webhook", "url": url}})
    assert answer.status_code == 400, answer.get_json()
    assert answer.mimetype == "application/problem+json"
    assert "url" in answer.get_json()["errors"]["delivery"]
    assert client.get("/v1/topics/disguised", headers=auth).status_code == 404


@pytest.mark.parametrize("host, inner", [("2002:a9fe:a9fe::", "169.254.169.254"),
                                         ("2002:7f00:1::", "127.0.0.1")])
def test_a_post_to_an_address_leading_to_a_refused_one_never_starts(host: str,
                                                                    inner: str) -> None:
    outcome = asyncio.run(post_outcome(AsyncHttpClient(parse_allow("::1")),
                                       f"http://[{host}]:9/x", {}, b"x", 2.0))
    assert outcome is not None and "webhook target refused" in outcome, outcome
    assert f"leads to {inner}" in outcome

