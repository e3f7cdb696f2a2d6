"""The cron grammar (app.schedules.cron.PATTERN, the `pattern` of a schedule's `cron` in
openapi.yaml): any string the pattern admits is taken by the schedule route on the node (a
property over strings hypothesis draws from the pattern), strings it refuses are 400 naming
`cron`, and the standard (Vixie) meanings: 0 and 7 are Sunday, ranges wrap around, names in
any case, a day matching either restricted day field fires. A schedule with no fire within
start_at and end_at (end_at at or before start_at) is taken and never fires."""

from __future__ import annotations

import itertools
import re
import secrets

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.timeparse import format_ms, parse_instant
from app.schedules.cron import PATTERN, Cron, CronError, parse


def _fires(expression: str, after: str, n: int = 4, tz: str = "UTC") -> list[str]:
    return [format_ms(t) for t in
            itertools.islice(Cron(expression, tz).fires(parse_instant(after)), n)]


def test_the_documented_pattern_is_the_servers(client: FlaskClient) -> None:
    spec = client.get("/openapi.json").get_json()
    put = spec["components"]["schemas"]["SchedulePut"]["properties"]["cron"]
    assert put["pattern"] == PATTERN


@pytest.mark.parametrize("expression", [
    "", " ", "*/0 * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *",
    "* * * 13 *", "* * * * 8", "0 9 * * FUNDAY", "* * *", "* * * * * * *", "0 9 * * MON\n",
    " 0 9 * * *", "0 9 * * * ", "0 9 * * 1-", "0 9 ? * *", "0 9 L * *", "0 9 * * 1#2",
    "0 9 * * */100", "0,,5 9 * * *", "@daily"])
def test_what_the_pattern_refuses_is_refused(expression: str) -> None:
    assert not re.fullmatch(PATTERN, expression)
    with pytest.raises(CronError):
        Cron(expression, "UTC")


@pytest.mark.parametrize(("expression", "field", "values"), [
    ("0 9 * * 7", "weekday", [0]), ("0 9 * * 0", "weekday", [0]),
    ("0 9 * * 5-7", "weekday", [0, 5, 6]), ("0 9 * * 0-7", "weekday", list(range(7))),
    ("0 9 * * 7-1", "weekday", [0, 1]), ("0 9 * * FRI-MON", "weekday", [0, 1, 5, 6]),
    ("0 9 * * sat-sun", "weekday", [0, 6]), ("0 9 * * 6-1/2", "weekday", [1, 6]),
    ("0 22-2 * * *", "hour", [0, 1, 2, 22, 23]), ("0 22-2/2 * * *", "hour", [0, 2, 22]),
    ("0 0 25-5 * *", "day", [1, 2, 3, 4, 5, 25, 26, 27, 28, 29, 30, 31]),
    ("0 0 1 Nov-FEB *", "month", [1, 2, 11, 12]), ("5/15 * * * *", "minute", [5, 20, 35, 50]),
    ("*/20,7 * * * *", "minute", [0, 7, 20, 40]), ("0 05 * * *", "hour", [5]),
    ("*/2 0 0 1 1 *", "second", list(range(0, 60, 2)))])
def test_standard_meanings(expression: str, field: str, values: list[int]) -> None:
    assert parse(expression)[field] == values


def test_sunday_is_0_and_7_and_numbers_are_standard_weekdays() -> None:
    # 2026-01-04 is a Sunday, 2026-01-05 a Monday
    assert _fires("0 9 * * 7", "2026-01-01T00:00:00Z", 1) == ["2026-01-04T09:00:00.000Z"]
    assert _fires("0 9 * * 0", "2026-01-01T00:00:00Z", 1) == ["2026-01-04T09:00:00.000Z"]
    assert _fires("0 9 * * 1", "2026-01-01T00:00:00Z", 1) == ["2026-01-05T09:00:00.000Z"]


def test_a_wrapping_hour_range_fires_across_midnight() -> None:
    assert _fires("0 23-1 * * *", "2026-01-01T12:00:00Z", 4) == [
        "2026-01-01T23:00:00.000Z", "2026-01-02T00:00:00.000Z", "2026-01-02T01:00:00.000Z",
        "2026-01-02T23:00:00.000Z"]


def test_both_day_fields_restricted_fire_on_either() -> None:
    # the 13th or any Friday (2026-01-02 and 09 are Fridays, the 13th a Tuesday)
    assert _fires("0 9 13 * FRI", "2026-01-01T00:00:00Z", 4) == [
        "2026-01-02T09:00:00.000Z", "2026-01-09T09:00:00.000Z", "2026-01-13T09:00:00.000Z",
        "2026-01-16T09:00:00.000Z"]
    # a day field starting with * keeps both required: odd days that are Fridays
    assert _fires("0 9 */2 * FRI", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-09T09:00:00.000Z", "2026-01-23T09:00:00.000Z"]


def test_a_day_no_month_has_never_fires_and_says_so_at_once() -> None:
    assert Cron("0 0 31 2,4 *", "UTC").next_after(0) is None
    assert _fires("0 0 29 2 *", "2026-01-01T00:00:00Z", 1) == ["2028-02-29T00:00:00.000Z"]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(expression=st.from_regex(PATTERN, fullmatch=True))
def test_every_string_the_pattern_admits_is_taken(client: FlaskClient, auth: dict[str, str],
                                                  topic_name: str, expression: str) -> None:
    answer = client.put(f"/v1/topics/{topic_name}/schedules/s{secrets.token_hex(3)}",
                        headers=auth, json={"cron": expression, "payload": 1})
    assert answer.status_code == 201, (expression, answer.get_json())
    assert len(answer.get_json()["next_fire_times"]) <= 5


def test_a_refused_cron_is_a_400_naming_cron(client: FlaskClient, auth: dict[str, str],
                                            topic_name: str) -> None:
    answer = client.put(f"/v1/topics/{topic_name}/schedules/bad", headers=auth,
                        json={"cron": "*/0 * * * *", "payload": 1})
    assert answer.status_code == 400 and "cron" in answer.get_json()["errors"]


@pytest.mark.parametrize("end_at", ["2027-01-01T00:00:00Z", "2027-01-02T00:00:00Z",
                                    "2020-01-01T00:00:00Z"])
def test_no_fire_between_start_and_end_is_taken_and_never_fires(
        client: FlaskClient, auth: dict[str, str], topic_name: str, end_at: str) -> None:
    url = f"/v1/topics/{topic_name}/schedules/never"
    answer = client.put(url, headers=auth, json={
        "cron": "0 9 * * *", "payload": 1, "start_at": "2027-01-02T00:00:00Z",
        "end_at": end_at})
    assert answer.status_code in (200, 201), answer.get_json()
    assert answer.get_json()["next_fire_times"] == []
    answer = client.put(f"/v1/topics/{topic_name}/schedules/tokyo", headers=auth, json={
        "cron": "* * * * *", "payload": 1, "timezone": "Asia/Tokyo",
        "start_at": "9999-12-31T14:59:59Z"})
    assert answer.status_code in (200, 201), answer.get_json()
    assert answer.get_json()["next_fire_times"] == []
    assert client.get(url, headers=auth).get_json()["end_at"] == format_ms(
        parse_instant(end_at))


def test_fires_end_where_year_9999_ends_in_any_zone(
        client: FlaskClient, auth: dict[str, str], topic_name: str) -> None:
    """A start in the last moments of year 9999 in a zone ahead of UTC has no fire that
    can be written: none, not a 500 (its local reading is in year 10000)."""
    last = parse_instant("9999-12-31T23:59:59.998Z")
    assert Cron("0 3 * * *", "Asia/Dhaka").next_after(last) is None
    # 23:59:59 of year 9999 in Tokyo: the next wall time is in year 10000
    tokyo_end = parse_instant("9999-12-31T14:59:59Z")
    assert list(Cron("* * * * *", "Asia/Tokyo").fires(tokyo_end - 60_000)) == [
        tokyo_end - 59_000]
    assert list(Cron("* * * * *", "America/New_York").fires(last - 120_000)) == [
        last - 119_998, last - 59_998]  # 23:58 and 23:59 UTC, then the wall times end
    answer = client.put(f"/v1/topics/{topic_name}/schedules/last", headers=auth, json={
        "cron": "*/5 * * * *", "payload": 1, "timezone": "Asia/Dhaka",
        "start_at": "9999-12-31T23:59:59.998Z"})
    assert answer.status_code in (200, 201), answer.get_json()
    assert answer.get_json()["next_fire_times"] == []
    answer = client.put(f"/v1/topics/{topic_name}/schedules/tokyo", headers=auth, json={
        "cron": "* * * * *", "payload": 1, "timezone": "Asia/Tokyo",
        "start_at": "9999-12-31T14:59:59Z"})
    assert answer.status_code in (200, 201), answer.get_json()
    assert answer.get_json()["next_fire_times"] == []


@pytest.fixture()
def topic_name(client: FlaskClient, auth: dict[str, str]) -> str:
    name = f"cron-{secrets.token_hex(3)}"
    assert client.put(f"/v1/topics/{name}", json={}, headers=auth).status_code == 201
    return name
