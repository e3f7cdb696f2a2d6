"""Which addresses webhooks may reach: pure checks, and the API refusing a topic whose URL is
a literal address that is not public (the releaser checks names when it resolves them:
tests/test_http_client.py)."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from app.delivery.webhook_targets import Network, parse_allow, refusal, url_refusal

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
