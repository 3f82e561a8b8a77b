"""AutoThrottle on fleet-wide state (issue 13, point 3): Scrapy's update rule in Lua against
Scrapy's own rule, the lease step spacing grants by the fleet's delay, and the Scrapy
extension that feeds it (swapped in for Scrapy's AutoThrottle), all on a real Redis.

The fleet test (real Scrapy workers, a slow site) is ``tests/test_autothrottle_fleet.py``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy import Spider, signals
from scrapy.extensions.throttle import AutoThrottle as ScrapyAutoThrottle
from scrapy.http import Request, Response
from scrapy.utils.test import get_crawler

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, Lease
from redcrawl.keys import CrawlKeys
from redcrawl.politeness.autothrottle import (
    CONTROL_FIELD,
    FleetThrottle,
    ThrottleRule,
    Update,
)
from redcrawl.scrapy import AutoThrottle
from redcrawl.scrapy.autothrottle import install, request_key

from .conftest import Clock, FrontierFactory

# --- the rule: Scrapy's own, as the reference ----------------------------------------


class _Slot:
    def __init__(self, delay: float) -> None:
        self.delay = delay


def scrapy_rule(rule: ThrottleRule) -> Any:
    """Scrapy's AutoThrottle with ``rule``'s settings, for its ``_adjust_delay`` alone."""
    at = ScrapyAutoThrottle.__new__(ScrapyAutoThrottle)
    at.target_concurrency = rule.target_concurrency
    at.mindelay = rule.min_delay
    at.maxdelay = rule.max_delay
    return at


def scrapy_next(rule: ThrottleRule, old: float, latency: float, status: int) -> float:
    slot = _Slot(old)
    scrapy_rule(rule)._adjust_delay(slot, latency, Response("http://a.test/", status=status))
    return slot.delay


def stored(x: float) -> float:
    """A delay as the key's state keeps it: milliseconds ("%.17g", exact), read back as
    seconds."""
    return float(repr(x * 1000)) / 1000


delays = st.floats(0.0, 100.0, allow_nan=False)
latencies = st.floats(0.0, 30.0, allow_nan=False)
statuses = st.sampled_from([200, 200, 200, 301, 404, 429, 500, 503])
rules = st.builds(
    lambda t, lo, hi, start: ThrottleRule(t, lo, hi, max(lo, start)),
    st.floats(0.1, 16.0),
    st.floats(0.0, 2.0),
    st.floats(0.0, 60.0),
    st.floats(0.0, 10.0),
)


@given(rules, delays, latencies, statuses)
def test_python_rule_is_scrapys(
    rule: ThrottleRule, old: float, latency: float, status: int
) -> None:
    assert rule.next_delay(old, latency, status) == scrapy_next(rule, old, latency, status)
    assert rule.next_delay(None, latency, status) == scrapy_next(
        rule, rule.start_delay, latency, status
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rules, st.lists(st.tuples(latencies, statuses), min_size=1, max_size=12), st.booleans())
def test_lua_rule_follows_scrapys_response_by_response(
    redis_client: redis.Redis,
    rule: ThrottleRule,
    responses: list[tuple[float, int]],
    one_call: bool,
) -> None:
    """The fleet's delay of a key after each response is Scrapy's slot delay after the same
    responses (starting from the start delay), whether they come in one call or one by one."""
    keys = CrawlKeys("at")
    redis_client.delete(keys.pol_state_base + "a.test")
    fleet = FleetThrottle(redis_client, keys, rule)
    updates = [Update("a.test", lat, status) for lat, status in responses]
    applied = fleet.update(updates) if one_call else [a for u in updates for a in fleet.update([u])]
    delay = rule.start_delay
    for (latency, status), result in zip(responses, applied, strict=True):
        expected = scrapy_next(rule, delay, latency, status)
        assert result.old == delay
        assert result.new == expected
        assert result.outcome == (1 if expected != delay else 0)
        delay = stored(expected) if result.outcome == 1 else delay
    assert fleet.delay("a.test") in (None, delay)
    if fleet.delay("a.test") is None:  # never written: it never left the start delay
        assert delay == rule.start_delay


def test_non_200_never_lowers_and_errors_never_count(redis7_client: redis.Redis) -> None:
    fleet = FleetThrottle(redis7_client, CrawlKeys("at"), ThrottleRule(1.0, 0.0, 60.0, 5.0))
    [first] = fleet.update([Update("a.test", 1.0, 200)])
    assert (first.old, first.new) == (5.0, 3.0)
    [small_error] = fleet.update([Update("a.test", 0.01, 404)])
    assert small_error.outcome == 0 and fleet.delay("a.test") == 3.0
    [slow_error] = fleet.update([Update("a.test", 8.0, 503)])
    assert slow_error.new == 8.0 and fleet.delay("a.test") == 8.0


def test_clamped_to_download_delay_and_max_delay(redis7_client: redis.Redis) -> None:
    fleet = FleetThrottle(redis7_client, CrawlKeys("at"), ThrottleRule(2.0, 0.5, 4.0, 5.0))
    fleet.update([Update("slow.test", 30.0, 200), Update("fast.test", 0.001, 200)] * 10)
    assert fleet.delay("slow.test") == 4.0
    assert fleet.delay("fast.test") == 0.5


def test_keys_are_independent_and_kept_in_their_state_which_expires_when_idle(
    redis7_client: redis.Redis,
) -> None:
    """The delay is the field ``ad`` (ms) of the key's state hash, next to the lease
    step's fields, which stay; the override is not touched (it would never expire). A
    state hash without anything in flight gets the lease step's idle expiry (an hour after
    its next allowed time); one with requests in flight stays (the lease step's)."""
    keys = CrawlKeys("at")
    state = keys.pol_state_base
    redis7_client.hset(keys.pol_override, "a.test", json.dumps({"crawl_delay": 2.0}))
    redis7_client.hset(state + "a.test", mapping={"in": 0, "next": 0, "fail": 1})
    redis7_client.hset(state + "busy.test", mapping={"in": 2, "next": 0})
    fleet = FleetThrottle(redis7_client, keys, ThrottleRule(1.0, 0.0, 60.0, 5.0))
    got = fleet.update(
        [Update("a.test", 1.0, 200), Update("b.test", 3.0, 200), Update("busy.test", 1.0, 200)]
    )
    assert [(a.key, a.new, a.outcome) for a in got] == [
        ("a.test", 3.0, 1),
        ("b.test", 4.0, 1),
        ("busy.test", 3.0, 1),
    ]
    assert redis7_client.hgetall(state + "a.test") == {
        b"in": b"0",
        b"next": b"0",
        b"fail": b"1",
        b"ad": b"3000",
    }
    assert redis7_client.hget(keys.pol_override, "a.test") == b'{"crawl_delay": 2.0}'
    assert redis7_client.hlen(keys.pol_override) == 1  # b.test: no override written
    for key in ("a.test", "b.test"):
        assert 3_590_000 < redis7_client.pttl(state + key) <= 3_600_000
    assert redis7_client.pttl(state + "busy.test") == -1
    redis7_client.hset(state + "bad.test", "ad", "soon")
    [bad] = fleet.update([Update("bad.test", 1.0, 200)])
    assert (bad.old, bad.new) == (5.0, 3.0)  # unreadable: from the start delay


def test_many_responses_in_one_round_trip(redis7_client: redis.Redis) -> None:
    fleet = FleetThrottle(redis7_client, CrawlKeys("at"), ThrottleRule(1.0, 0.0, 60.0, 5.0))
    rule = fleet.rule
    updates = [Update(f"h{i % 7}.test", 0.1 + (i % 5) / 10, 200) for i in range(1000)]
    before = redis7_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    fleet.update(updates)
    after = redis7_client.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert after - before == 1000 // 200  # one script call per 200 responses, one round trip
    for i in range(7):
        delay: float | None = None
        for u in updates[i::7]:
            delay = stored(rule.next_delay(delay, u.latency, u.status))
        assert fleet.delay(f"h{i}.test") == delay


# --- the lease step ----------------------------------------------------------------------

both_backends = pytest.mark.backends("lists", "streams")


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=fingerprint(url), priority=0, meta={})


def site(host: str, n: int) -> list[Envelope]:
    return [env(f"http://{host}/p{i}") for i in range(n)]


def hosts(leases: list[Lease]) -> Counter[str]:
    return Counter(lease.envelope.url.split("/")[2] for lease in leases)


def polite(make_frontier: FrontierFactory, delay: float = 0.0) -> FrontierCore:
    f = make_frontier(
        politeness_concurrency=10,
        politeness_delay=delay,
        politeness_randomize=False,
        politeness_start_window=0.0,  # grants exactly auto_delay apart
    )
    assert f.politeness == "host"
    f.store_politeness(worker=True)
    return f


def auto(f: FrontierCore, start: float) -> FleetThrottle:
    fleet = FleetThrottle(f.client, f.keys, ThrottleRule(1.0, 0.0, 60.0, start))
    fleet.enable()
    return fleet


@both_backends
def test_auto_delay_spaces_grants(make_frontier: FrontierFactory, clock: Clock) -> None:
    """A key's grants are auto_delay apart; a key never seen is spaced by the start
    delay; the delay changes with the next grant after an update."""
    f = polite(make_frontier)
    fleet = auto(f, start=5.0)
    f.push(site("slow.test", 10) + site("new.test", 10))
    fleet.update([Update("slow.test", 2.0, 200)])  # (5 + 2) / 2 = 3.5
    assert hosts(f.lease("w", 100)) == {"slow.test": 1, "new.test": 1}
    clock.advance(3.4)
    assert f.lease("w", 100) == []
    clock.advance(0.1)
    assert hosts(f.lease("w", 100)) == {"slow.test": 1}  # its next: 3.5 s from now
    fleet.update([Update("slow.test", 0.5, 200)] * 5)  # down to ~0.59
    delay = fleet.delay("slow.test")
    assert delay is not None and 0.5 < delay < 0.7
    clock.advance(1.5)  # new.test: 5 s after its first grant
    assert hosts(f.lease("w", 100)) == {"new.test": 1}
    clock.advance(2.0)  # a lower delay counts from the next grant on
    assert hosts(f.lease("w", 100)) == {"slow.test": 1}
    clock.advance(0.5)
    assert f.lease("w", 100) == []
    clock.advance(0.1)
    assert hosts(f.lease("w", 100)) == {"slow.test": 1}


@both_backends
def test_operator_delay_wins_and_the_larger_of_the_others(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, delay=1.0)
    fleet = auto(f, start=0.0)
    polo, state = f.keys.pol_override, f.keys.pol_state_base
    f.client.hset(polo, "op.test", json.dumps({"delay": 0.2}))
    f.client.hset(state + "op.test", "ad", 3000)
    f.client.hset(polo, "robots.test", json.dumps({"crawl_delay": 4.0}))
    f.client.hset(state + "robots.test", "ad", 2000)
    f.client.hset(state + "auto.test", "ad", 2000)
    f.client.hset(state + "small.test", "ad", 100)  # DOWNLOAD_DELAY wins
    names = ["op.test", "robots.test", "auto.test", "small.test"]
    f.push([e for h in names for e in site(h, 10)])
    assert set(hosts(f.lease("w", 100))) == set(names)
    gaps: dict[str, float] = {}
    for step in range(1, 41):
        clock.advance(0.1)
        for h in hosts(f.lease("w", 100)):
            gaps.setdefault(h, round(step * 0.1, 1))
    assert gaps == {"op.test": 0.2, "small.test": 1.0, "auto.test": 2.0, "robots.test": 4.0}
    assert fleet.rule.start_delay == 0.0


@both_backends
def test_auto_delay_is_ignored_when_the_fleet_runs_without_autothrottle(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier)
    fleet = auto(f, start=5.0)
    fleet.update([Update("a.test", 4.0, 200)])
    assert fleet.disable()
    f.push(site("a.test", 3))
    assert hosts(f.lease("w", 100)) == {"a.test": 3}


# --- the Scrapy extension ----------------------------------------------------------------

SETTINGS = {
    "AUTOTHROTTLE_ENABLED": True,
    "AUTOTHROTTLE_START_DELAY": 2.0,
    "AUTOTHROTTLE_TARGET_CONCURRENCY": 1.0,
    "DOWNLOAD_DELAY": 0.0,
}


def crawler_with(settings_dict: dict[str, Any]) -> Any:
    crawler = get_crawler(Spider, settings_dict)
    crawler.engine = SimpleNamespace(downloader=SimpleNamespace(_delay=0.0, slots={}))  # type: ignore[assignment]
    return crawler


def extensions(crawler: Any) -> list[type]:
    return [type(e) for e in crawler.extensions.middlewares]


def wait_for(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def response_for(url: str, latency: float, status: int = 200, **meta: Any) -> Response:
    request = Request(url, meta={"download_latency": latency, **meta})
    request.meta.setdefault("download_slot", request.url.split("/")[2].split(":")[0])
    return Response(url, status=status, request=request, body=b"x" * 10)


def downloaded(crawler: Any, response: Response) -> None:
    crawler.signals.send_catch_log(
        signals.response_downloaded,
        response=response,
        request=response.request,
        spider=crawler.spider,
    )


@both_backends
def test_the_scheduler_swaps_scrapys_autothrottle_for_the_fleets(
    make_frontier: FrontierFactory, caplog: pytest.LogCaptureFixture
) -> None:
    f = polite(make_frontier)
    crawler = crawler_with(SETTINGS)
    crawler.spider = Spider("s")
    assert ScrapyAutoThrottle in extensions(crawler)
    with caplog.at_level(logging.INFO, logger="redcrawl"):
        ours = install(crawler, f)
    assert isinstance(ours, AutoThrottle)
    assert AutoThrottle in extensions(crawler) and ScrapyAutoThrottle not in extensions(crawler)
    assert sum("AUTOTHROTTLE_ENABLED: one delay per site" in r.message for r in caplog.records) == 1
    control = json.loads(f.client.hget(f.keys.control, CONTROL_FIELD) or b"")
    assert control == {"start_delay": 2.0}
    crawler.signals.send_catch_log(signals.spider_opened, spider=crawler.spider)
    assert crawler.engine.downloader._delay == 0.0  # Scrapy's would have set 2.0
    downloaded(crawler, response_for("http://a.test/x", 1.0))
    downloaded(crawler, response_for("http://a.test/y", 1.0, autothrottle_dont_adjust_delay=True))
    downloaded(crawler, response_for("http://b.test/", 0.4, 500))  # not lowered
    downloaded(crawler, Response("http://c.test/", request=Request("http://c.test/")))  # no latency
    wait_for(lambda: crawler.stats.get_value("redcrawl/autothrottle/calls"))
    wait_for(lambda: ours.fleet is not None and ours.fleet.delay("a.test") == 1.5)
    assert crawler.stats.get_value("redcrawl/autothrottle/responses") == 2
    assert ours.fleet is not None and ours.fleet.delay("b.test") is None
    assert f.client.hget(f.keys.pol_state_base + "c.test", "ad") is None
    crawler.signals.send_catch_log(signals.spider_closed, spider=crawler.spider, reason="done")


class MyAutoThrottle(ScrapyAutoThrottle):
    """A project's own AutoThrottle."""


@both_backends
def test_shared_off_subclass_and_disabled_leave_scrapys_alone(
    make_frontier: FrontierFactory, caplog: pytest.LogCaptureFixture
) -> None:
    f = polite(make_frontier)
    auto(f, start=1.0)  # a previous worker had it on

    crawler = crawler_with({**SETTINGS, "REDCRAWL_AUTOTHROTTLE_SHARED": False})
    assert install(crawler, f) is None
    assert ScrapyAutoThrottle in extensions(crawler)
    assert f.client.hget(f.keys.control, CONTROL_FIELD) is None  # the latest worker wins

    path = f"{__name__}.MyAutoThrottle"
    crawler = crawler_with(
        {**SETTINGS, "EXTENSIONS": {"scrapy.extensions.throttle.AutoThrottle": None, path: 0}}
    )
    with caplog.at_level(logging.WARNING, logger="redcrawl"):
        assert install(crawler, f) is None
    assert MyAutoThrottle in extensions(crawler) and AutoThrottle not in extensions(crawler)
    assert any("subclass of Scrapy's AutoThrottle" in r.message for r in caplog.records)

    caplog.clear()
    crawler = crawler_with(
        {**SETTINGS, "EXTENSIONS": {"scrapy.extensions.throttle.AutoThrottle": None}}
    )
    with caplog.at_level(logging.WARNING, logger="redcrawl"):
        assert install(crawler, f) is None
    assert AutoThrottle not in extensions(crawler)
    assert any("EXTENSIONS disables" in r.message for r in caplog.records)

    crawler = crawler_with({**SETTINGS, "AUTOTHROTTLE_ENABLED": False})
    assert install(crawler, f) is None and AutoThrottle not in extensions(crawler)


@both_backends
def test_listed_in_extensions_it_is_attached_and_scrapys_goes(
    make_frontier: FrontierFactory,
) -> None:
    f = polite(make_frontier)
    crawler = crawler_with({**SETTINGS, "EXTENSIONS": {"redcrawl.scrapy.AutoThrottle": 0}})
    assert AutoThrottle in extensions(crawler) and ScrapyAutoThrottle in extensions(crawler)
    ours = install(crawler, f)
    assert ours is not None and ours.fleet is not None
    assert extensions(crawler).count(AutoThrottle) == 1
    assert ScrapyAutoThrottle not in extensions(crawler)


def test_without_fleet_politeness_nothing_changes(redis7_client: redis.Redis) -> None:
    crawler = crawler_with(SETTINGS)
    assert install(crawler, SimpleNamespace(politeness=None)) is None
    assert ScrapyAutoThrottle in extensions(crawler)


def test_request_key_is_the_key_the_frontier_stored() -> None:
    def req(url: str, slot: str | None = None) -> Request:
        r = Request(url)
        if slot is not None:
            r.meta["download_slot"] = slot
        return r

    assert request_key(req("http://WWW.Example.co.uk:81/x", "www.example.co.uk"), "host") == (
        "www.example.co.uk"
    )
    assert request_key(req("http://www.example.co.uk/", "www.example.co.uk"), "domain") == (
        "example.co.uk"
    )
    assert request_key(req("http://www.example.co.uk/", "mine"), "domain") == "mine"
    assert request_key(req("http://example.com./", "example.com."), "host") == "example.com"
    assert request_key(req("http://a.test/", "10.0.0.1"), "host", ip_slot="10.0.0.1") == "a.test"
    assert request_key(req("http://a.test/"), "host") == "a.test"


@both_backends
def test_debug_logs_each_adjustment(
    make_frontier: FrontierFactory, caplog: pytest.LogCaptureFixture
) -> None:
    f = polite(make_frontier)
    crawler = crawler_with({**SETTINGS, "AUTOTHROTTLE_DEBUG": True})
    crawler.spider = Spider("s")
    ours = install(crawler, f)
    assert ours is not None
    with caplog.at_level(logging.INFO, logger="redcrawl"):
        downloaded(crawler, response_for("http://a.test/", 1.0))
        wait_for(lambda: any("fleet-wide" in r.getMessage() for r in caplog.records))
    [line] = [r.getMessage() for r in caplog.records if "fleet-wide" in r.getMessage()]
    assert "slot: a.test" in line and "delay: 1500 ms (-500)" in line
    assert "latency: 1000 ms" in line


def test_without_redcrawls_scheduler_it_says_it_throttles_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crawler = crawler_with({**SETTINGS, "EXTENSIONS": {"redcrawl.scrapy.AutoThrottle": 0}})
    crawler.spider = Spider("s")
    with caplog.at_level(logging.WARNING, logger="redcrawl"):
        crawler.signals.send_catch_log(signals.spider_opened, spider=crawler.spider)
    assert any("throttles nothing here" in r.getMessage() for r in caplog.records)
    assert ScrapyAutoThrottle in extensions(crawler)  # Scrapy's stays on
    assert crawler.engine.downloader._delay == 2.0
    downloaded(crawler, response_for("http://a.test/", 1.0))  # ignored, no error
