"""The dashboard at `/`, driven in headless Chromium (Debian's chromium and chromium-driver,
installed by `make test`) against the served API on the real node: what it shows is checked
against the API, and its actions (retry a dead message, pause a campaign) are checked by
the API's answers afterwards; its Find messages panel is checked against the search and
GET of a message. A screenshot goes to var/test-output/dashboard.png."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.select import Select

from app.models import STATES
from app.services import Services
from tests.conftest import ROOT, new_tenant_key
from tests.consumers import now_ms

SCREENSHOT = ROOT / "var" / "test-output" / "dashboard.png"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    assert chromium and driver_path, "make test installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1300"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def eventually(check: Callable[[], Any], within_s: float = 15.0) -> Any:
    """check()'s first truthy answer (exceptions of a page still changing count as no)."""
    deadline = time.monotonic() + within_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (StaleElementReferenceException, NoSuchElementException, LookupError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"not so within {within_s} s (last: {last!r})")


class Api:
    """The served API with one tenant's key."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        self.base, self.headers = base, headers

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = requests.request(method, self.base + path, headers=self.headers, timeout=30,
                                  **kwargs)
        assert answer.status_code < 300, (method, path, answer.status_code, answer.text)
        return answer.json() if answer.content else None


def _seed(api: Api) -> None:
    """Two topics: `orders` with load ahead, a campaign, a dead message and delivered ones;
    `empty` with nothing."""
    api.call("PUT", "/v1/topics/orders", json={"max_attempts": 1})
    api.call("PUT", "/v1/topics/empty", json={})
    soon = now_ms() + 10 * 60_000
    api.call("POST", "/v1/topics/orders/messages:batch", json={"messages": [
        {"payload": {"n": i}, "deliver_at": soon + i * 60_000, "campaign": "black-friday"}
        for i in range(12)]})
    api.call("POST", "/v1/topics/orders/messages:batch", json={"messages": [
        {"id": f"now-{i}", "payload": {"n": i}} for i in range(5)]})
    leased = api.call("POST", "/v1/topics/orders/leases", json={"max": 5, "wait_ms": 3000})
    assert len(leased["messages"]) == 5, leased
    for m in leased["messages"][:4]:
        api.call("POST", f"/v1/topics/orders/messages/{m['id']}/ack",
                 json={"lease_token": m["lease"]["token"]})
    doomed = leased["messages"][4]
    api.call("POST", f"/v1/topics/orders/messages/{doomed['id']}/nack",
             json={"lease_token": doomed["lease"]["token"], "error": "<b>card declined</b>"})


def _row(browser: WebDriver, table: str, attr: str, value: str) -> WebElement:
    rows = browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-{attr}='{value}']")
    if not rows:
        raise LookupError(value)
    return rows[0]


def _counts(row: WebElement) -> dict[str, int]:
    return {state: int(row.find_element(By.CSS_SELECTOR, f".count-{state}").text)
            for state in STATES}


def test_a_wrong_key_is_refused_and_nothing_is_shown(browser: WebDriver, served: str) -> None:
    browser.get(served + "/")
    browser.find_element(By.ID, "api-key").send_keys("dt_not-a-key")
    browser.find_element(By.CSS_SELECTOR, "#sign-in button").click()
    eventually(lambda: "not valid" in browser.find_element(By.ID, "sign-in-error").text)
    assert not browser.find_element(By.ID, "board").is_displayed()


def test_the_dashboard_shows_what_the_api_says_and_its_actions_apply(
        browser: WebDriver, served: str, services: Services) -> None:
    _, headers = new_tenant_key(services, "dash")
    api = Api(served, headers)
    _seed(api)
    # another tenant's topic must not appear
    Api(served, new_tenant_key(services, "other")[1]).call("PUT", "/v1/topics/secret", json={})
    # the API worker writes lag figures every 5 s: wait until they are readable
    eventually(lambda: sum(m["count"] for m in api.call(
        "GET", "/v1/topics/orders/lag")["minutes"]) == 5, within_s=20)

    browser.get(served + "/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(served + "/")
    browser.find_element(By.ID, "api-key").send_keys(headers["Authorization"].split()[1])
    browser.find_element(By.CSS_SELECTOR, "#sign-in button").click()

    # the page redraws its tables every 5 s and after each action: every element is
    # found again right before it is read or clicked, inside eventually()
    eventually(lambda: _row(browser, "topics", "topic", "orders"))
    shown_topics = eventually(lambda: {r.get_attribute("data-topic") for r in
                                       browser.find_elements(By.CSS_SELECTOR, "#topics tbody tr")})
    assert shown_topics == {"orders", "empty"}
    stats = api.call("GET", "/v1/topics/orders/stats")
    assert stats["counts"]["dead"] == 1 and stats["counts"]["delivered"] == 4
    eventually(lambda: _counts(_row(browser, "topics", "topic", "orders")) == stats["counts"])

    click(browser, "#topics tbody tr[data-topic='orders'] button.topic-link")
    upcoming = api.call("GET", "/v1/topics/orders/stats?window=minute")["upcoming"]
    assert sum(w["count"] for w in upcoming[1:]) == 12  # the current minute has the 5 due now

    def chart_shows_the_api() -> bool:
        """The chart against the API read now: both windows start at the current minute,
        so a minute that turns between two reads (its 5 leave the window) is no mismatch
        once the page has redrawn (every 5 s)."""
        now = api.call("GET", "/v1/topics/orders/stats?window=minute")["upcoming"]
        bars = [int(b.get_attribute("data-value")) for b in browser.find_elements(
            By.CSS_SELECTOR, "#upcoming-chart rect.bar")]
        return (_attr(browser, "#upcoming-chart", "data-total")
                == str(sum(w["count"] for w in now)) and bars == [w["count"] for w in now])

    eventually(chart_shows_the_api)
    lag = api.call("GET", "/v1/topics/orders/lag")["minutes"]
    assert sum(m["count"] for m in lag) == 5
    eventually(lambda: _attr(browser, "#lag-chart", "data-count") == "5")
    assert browser.find_elements(By.CSS_SELECTOR, "#lag-chart polyline.p50")
    assert browser.find_elements(By.CSS_SELECTOR, "#lag-chart polyline.p99")

    [dead] = api.call("GET", "/v1/topics/orders/dead-letters")["messages"]
    dead_row = f"#dead tbody tr[data-id='{dead['id']}']"
    eventually(lambda: _text(browser, dead_row + " .error-text") == "<b>card declined</b>")
    campaign_row = "#campaigns tbody tr[data-campaign='black-friday']"
    eventually(lambda: _text(browser, campaign_row + " .state") == "running")
    eventually(lambda: _text(browser, campaign_row + " .count-scheduled") == "12")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOT))
    print(f"dashboard screenshot: {SCREENSHOT}")

    click(browser, dead_row + " button.retry")
    eventually(lambda: not browser.find_elements(By.CSS_SELECTOR, dead_row))
    assert api.call("GET", f"/v1/topics/orders/messages/{dead['id']}")["state"] == "scheduled"

    click(browser, campaign_row + " button.pause")
    eventually(lambda: _text(browser, campaign_row + " .state") == "paused")
    assert api.call("GET", "/v1/topics/orders/campaigns/black-friday")["paused"] is True


def _sign_in(browser: WebDriver, served: str, headers: dict[str, str]) -> None:
    browser.get(served + "/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(served + "/")
    browser.find_element(By.ID, "api-key").send_keys(headers["Authorization"].split()[1])
    browser.find_element(By.CSS_SELECTOR, "#sign-in button").click()


def _find(browser: WebDriver, message_id: str = "", recipient: str = "", label: str = "",
          state: str = "") -> None:
    """Fill the Find messages form (every input, empty ones cleared) and submit it."""
    for field, value in (("find-id", message_id), ("find-recipient", recipient),
                         ("find-label", label)):
        box = browser.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    Select(browser.find_element(By.ID, "find-state")).select_by_value(state)
    browser.find_element(By.CSS_SELECTOR, "#find button[type=submit]").click()


def _found(browser: WebDriver) -> dict[str, list[str]]:
    """The result table: id -> its cells' text."""
    return {row.get_attribute("data-id"): [td.text for td in row.find_elements(By.TAG_NAME, "td")]
            for row in browser.find_elements(By.CSS_SELECTOR, "#found tbody tr")}


def _detail(browser: WebDriver) -> dict[str, str]:
    return {dd.get_attribute("data-field"): dd.text for dd in browser.find_elements(
        By.CSS_SELECTOR, "#message-detail dd")}


def test_find_messages_by_id_recipient_label_and_state_and_open_one(
        browser: WebDriver, served: str, services: Services) -> None:
    _, headers = new_tenant_key(services, "find")
    api = Api(served, headers)
    api.call("PUT", "/v1/topics/finds", json={"max_attempts": 1})
    later = now_ms() + 3_600_000
    api.call("POST", "/v1/topics/finds/messages:batch", json={"messages": [
        {"id": "ann-1", "deliver_at": later, "recipient": "ann", "campaign": "spring",
         "labels": {"tier": "gold", "note": "<i>hi</i>"}, "payload": {}},
        {"id": "ann-2", "deliver_at": later, "recipient": "ann", "labels": {"tier": "silver"},
         "payload": {}},
        {"id": "bob-1", "deliver_at": later, "recipient": "bob", "labels": {"tier": "gold"},
         "payload": {}},
        {"id": "gone-1", "deliver_at": later, "payload": {}},
        {"id": "dies-1", "payload": {}}]
        + [{"id": f"bulk-{n:02}", "deliver_at": later, "labels": {"bulk": "yes"}, "payload": {}}
           for n in range(60)]})
    api.call("DELETE", "/v1/topics/finds/messages/gone-1")
    [leased] = api.call("POST", "/v1/topics/finds/leases",
                        json={"max": 1, "wait_ms": 3000})["messages"]
    assert leased["id"] == "dies-1"
    api.call("POST", "/v1/topics/finds/messages/dies-1/nack",
             json={"lease_token": leased["lease"]["token"], "error": "<b>boom</b>"})

    _sign_in(browser, served, headers)
    click(browser, "#topics tbody tr[data-topic='finds'] button.topic-link")
    eventually(lambda: browser.find_element(By.ID, "find").is_displayed())

    # by label: the cells as the API gives them, `-` for nulls and no labels, markup as text
    _find(browser, label="tier:gold")
    rows = eventually(lambda: len(_found(browser)) == 2 and _found(browser))
    ann = api.call("GET", "/v1/topics/finds/messages/ann-1")
    assert rows["ann-1"] == ["ann-1", "scheduled", ann["deliver_at"], "ann",
                             "note:<i>hi</i>, tier:gold", "spring"]
    assert rows["bob-1"][3:] == ["bob", "tier:gold", "-"]
    assert not browser.find_element(By.ID, "find-more").is_displayed()

    _find(browser, recipient="ann")
    eventually(lambda: set(_found(browser)) == {"ann-1", "ann-2"})
    _find(browser, state="dead")
    eventually(lambda: set(_found(browser)) == {"dies-1"})
    _find(browser, state="cancelled", label="tier:gold")
    eventually(lambda: browser.find_element(By.ID, "find-status").text == "None found")
    assert _found(browser) == {}
    _find(browser, state="cancelled")
    eventually(lambda: set(_found(browser)) == {"gone-1"})

    # a row opens the message as GET answers it
    _find(browser, state="dead")
    click(browser, "#found tbody tr[data-id='dies-1']")
    shown = eventually(lambda: _detail(browser).get("state") == "dead" and _detail(browser))
    dead = api.call("GET", "/v1/topics/finds/messages/dies-1")
    assert shown == {"state": "dead", "attempts": "1", "created_at": dead["created_at"],
                     "deliver_at": dead["deliver_at"], "updated_at": dead["updated_at"],
                     "recipient": "-", "campaign": "-", "labels": "-",
                     "last_error": "<b>boom</b>", "cancel_reason": "-"}
    assert browser.find_element(By.ID, "detail-id").text == "dies-1"
    assert "not a log of its changes" in browser.find_element(By.ID, "message-detail").text

    # by id, and an unknown id
    _find(browser, message_id="ann-2")
    eventually(lambda: _detail(browser).get("labels") == "tier:silver")
    assert set(_found(browser)) == {"ann-2"} and _detail(browser)["recipient"] == "ann"
    _find(browser, message_id="nope")
    eventually(lambda: browser.find_element(By.ID, "find-status").text
               == "No message nope on this topic.")
    assert _found(browser) == {}
    assert not browser.find_element(By.ID, "message-detail").is_displayed()

    # on another topic (the panel cleared on the switch): a message the send window moved
    # shows requested_deliver_at beside deliver_at
    api.call("PUT", "/v1/topics/windowed", json={"send_window": {
        "days": ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"], "start": "09:00",
        "end": "09:01"}})
    noon = (now_ms() // 86_400_000 + 1) * 86_400_000 + 12 * 3_600_000  # tomorrow 12:00 UTC
    api.call("POST", "/v1/topics/windowed/messages",
             json={"id": "moved-1", "deliver_at": noon, "payload": {}})
    moved = api.call("GET", "/v1/topics/windowed/messages/moved-1")
    assert moved["requested_deliver_at"] != moved["deliver_at"]
    click(browser, "#topics tbody tr[data-topic='windowed'] button.topic-link")
    eventually(lambda: browser.find_element(By.ID, "topic-name").text == "windowed")
    assert _found(browser) == {} and browser.find_element(By.ID, "find-status").text == ""
    _find(browser, message_id="moved-1")
    eventually(lambda: _detail(browser).get("requested_deliver_at")
               == moved["requested_deliver_at"])
    assert _detail(browser)["deliver_at"] == moved["deliver_at"]
    click(browser, "#topics tbody tr[data-topic='finds'] button.topic-link")
    eventually(lambda: browser.find_element(By.ID, "topic-name").text == "finds")

    # a bad label: the 400's detail and what it says of the label
    _find(browser, label="novalue")
    problem = requests.get(served + "/v1/topics/finds/messages", params={"label": "novalue"},
                           headers=headers, timeout=30)
    assert problem.status_code == 400
    [said] = problem.json()["errors"]["label"]
    eventually(lambda: browser.find_element(By.ID, "find-status").text
               == f"Failed: {problem.json()['detail']} label: {said}")

    # 60 matches, 50 a page: More follows next_page_token to the end, none twice
    _find(browser, label="bulk:yes")
    eventually(lambda: _found(browser) and browser.find_element(By.ID, "find-more").is_displayed())
    while browser.find_element(By.ID, "find-more").is_displayed():
        # rows and the button are set in one go once a page with matches is in
        more_than = len(_found(browser))
        click(browser, "#find-more")
        eventually(lambda n=more_than: len(_found(browser)) > n)
    ids = [r.get_attribute("data-id") for r in browser.find_elements(
        By.CSS_SELECTOR, "#found tbody tr")]
    assert sorted(ids) == [f"bulk-{n:02}" for n in range(60)]
    assert browser.find_element(By.ID, "find-status").text == "60 shown"


def click(browser: WebDriver, selector: str) -> None:
    def once() -> bool:
        browser.find_element(By.CSS_SELECTOR, selector).click()
        return True
    eventually(once)


def _attr(browser: WebDriver, selector: str, name: str) -> str | None:
    return browser.find_element(By.CSS_SELECTOR, selector).get_attribute(name)


def _text(browser: WebDriver, selector: str) -> str:
    return browser.find_element(By.CSS_SELECTOR, selector).text
