"""robots.txt once per site for the fleet (issue 13, point 4).

The cache in Redis (:class:`redcrawl.politeness.robots.RobotsCache`) on a real server,
then real Scrapy workers (``scrapy runspider tests/sitekit.py``) against the multi-site
kit, which records every fetch and every robots.txt fetch per host.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore
from redcrawl.keys import CrawlKeys
from redcrawl.politeness.robots import RobotsCache, RobotsEntry
from redcrawl.workers import worker_command

from .conftest import Clock, FrontierFactory, RedisServer
from .sitekit import Fault, MultiSite, SiteSpec, format_summary, serving
from .test_politeness_fleet import fresh_frontier

ROOT = Path(__file__).resolve().parent.parent
SITEKIT = Path(__file__).with_name("sitekit.py")


# --- starts after a wait for robots.txt (the frontier's charge step) ---------------------


def _site(host: str, n: int) -> list[Envelope]:
    return [
        Envelope(url=f"http://{host}/p{i}", fingerprint=fingerprint(f"http://{host}/p{i}"))
        for i in range(n)
    ]


def _polite(make_frontier: FrontierFactory, **settings: object) -> FrontierCore:
    params: dict[str, object] = {"politeness_concurrency": 2, "politeness_randomize": False}
    f = make_frontier(**{**params, "politeness_start_window": 0.0, **settings})
    assert f.politeness == "host"
    return f


@pytest.mark.backends("lists", "streams")
def test_a_robots_txt_fetch_is_charged_and_a_waiter_after_it_is_refused(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """DOWNLOAD_DELAY=1: a request granted at 0 waits for robots.txt, fetched from 0.1
    to 0.6. Its start at 0.6 would come 0.5 s after the robots.txt fetch: refused (the
    worker gives it back); given back, it is granted again 1 s after that fetch."""
    f = _polite(make_frontier, politeness_delay=1.0)
    f.push(_site("a.test", 3))
    (first,) = f.lease("w1", 10)
    clock.advance(0.1)
    f.charge_fetch(["a.test"])
    clock.advance(0.5)
    assert f.start_late([first]) == [False]
    assert f.release([first]) == 1
    clock.advance(0.45)  # 1.05 s after the grant, 0.95 s after the robots.txt fetch
    assert f.lease("w1", 10) == []
    clock.advance(0.05)
    (again,) = f.lease("w1", 10)
    assert again.id == first.id
    assert f.counts().conserved


@pytest.mark.backends("lists", "streams")
def test_a_waiter_refused_after_a_crawl_delay_came_waits_it_from_the_robots_txt_fetch(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """Found by crawling a startproject project (``DOWNLOAD_DELAY = 0.3``) against a site
    whose robots.txt says ``Crawl-delay: 2``: its first page came 0.39 s after the
    robots.txt fetch. The fetch was charged with the delay known then (0.3 s); the waiter
    was refused, rightly, but granted again 0.3 s after the fetch. A refusal now holds
    the key for the whole delay from the start charged last."""
    f = _polite(make_frontier, politeness_delay=0.3)
    f.push(_site("a.test", 3))
    (first,) = f.lease("w1", 10)
    clock.advance(0.1)
    f.charge_fetch(["a.test"])  # robots.txt fetched from 0.1 to 0.4
    clock.advance(0.3)
    f.client.hset(f.keys.pol_override, "a.test", json.dumps({"crawl_delay": 2.0}))
    clock.advance(0.05)
    assert f.start_late([first]) == [False]
    assert f.release([first]) == 1
    clock.advance(1.6)  # 1.95 s after the robots.txt fetch
    assert f.lease("w1", 10) == []
    clock.advance(0.06)
    assert [x.id for x in f.lease("w1", 10)] == [first.id]
    assert f.counts().conserved


@pytest.mark.backends("lists", "streams")
def test_a_waiter_with_no_start_since_its_grant_starts_and_pushes_the_next_grant(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """A request that waited 0.6 s (robots.txt fetched by no one in its site's delay, e.g.
    found in the cache late) may start then; the next grant of its key waits the delay
    from that start, not from the grant (seen: 0.4 s between two fetches)."""
    f = _polite(make_frontier, politeness_delay=1.0)
    f.push(_site("a.test", 3))
    (first,) = f.lease("w1", 10)
    clock.advance(0.6)
    assert f.start_late([first]) == [True]
    clock.advance(0.5)  # 1.1 s after the grant, 0.5 s after the start
    assert f.lease("w2", 10) == []
    clock.advance(0.5)
    assert len(f.lease("w2", 10)) == 1


@pytest.mark.backends("lists", "streams")
def test_waiters_granted_together_before_a_crawl_delay_was_known_go_one_at_a_time(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """No DOWNLOAD_DELAY, concurrency 2: two requests of a host are granted at once, both
    wait for its robots.txt, which says ``Crawl-delay: 1``. The first may start, the
    second is refused (given back), and granted 1 s after the first start."""
    f = _polite(make_frontier)
    f.push(_site("a.test", 3))
    one, two = f.lease("w1", 10)
    clock.advance(1.5)  # the robots.txt fetch was charged long ago, or never
    f.client.hset(f.keys.pol_override, "a.test", json.dumps({"crawl_delay": 1.0}))
    assert f.start_late([one, two]) == [True, False]
    assert f.release([two]) == 1
    assert f.lease("w1", 10) == []
    clock.advance(0.99)
    assert f.lease("w1", 10) == []
    clock.advance(0.02)
    assert [x.id for x in f.lease("w1", 10)] == [two.id]


@pytest.mark.backends("lists", "streams")
def test_a_waiter_after_a_later_grant_of_its_key_is_refused(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """Another request of the key was granted after the waiter's grant (it may have
    started already): the waiter is refused. A waiter of a key without any delay starts;
    a lease no longer held does not (review 35: another worker may hold it now)."""
    f = _polite(make_frontier, politeness_delay=0.5)
    f.push(_site("a.test", 3) + _site("b.test", 1))
    leased = f.lease("w1", 10)
    first = next(x for x in leased if "a.test" in x.envelope.url)
    b = next(x for x in leased if "b.test" in x.envelope.url)
    clock.advance(0.6)
    assert len(f.lease("w2", 10)) == 1  # a.test again
    assert f.start_late([first]) == [False]
    f.client.hset(f.keys.pol_override, "b.test", json.dumps({"delay": 0}))
    assert f.start_late([b]) == [True]
    f.ack([b])
    assert f.start_late([b]) == [False]


@pytest.mark.backends("lists", "streams")
def test_a_charge_sets_the_idle_expiry_of_a_new_state(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """A robots.txt fetch of a key with nothing in flight writes its state with the idle
    expiry (state of idle keys must not stay forever)."""
    f = _polite(make_frontier, politeness_delay=1.0)
    f.charge_fetch(["idle.test"])
    ttl = f.client.pttl(f.keys.pol_state_base + "idle.test")
    assert 0 < ttl <= 3_600_000 + 1_000


@pytest.mark.backends("lists", "streams")
@pytest.mark.parametrize(
    ("settings", "crawl_delay", "bound"),
    [
        ({}, None, False),  # no delay anywhere: a late start is harmless
        ({"DOWNLOAD_DELAY": 0.5}, None, True),
        ({"DOWNLOAD_SLOTS": {"a.test": {"delay": 2.0}}}, None, True),
        ({"DOWNLOAD_SLOTS": {"b.test": {"delay": 2.0}}}, None, False),  # another key's
        ({"DOWNLOAD_SLOTS": {"a.test": {"concurrency": 1}}}, None, False),
        ({}, 1.0, True),  # Crawl-delay read by this worker
        ({"ROBOTSTXT_OBEY": True}, None, False),
    ],
)
def test_a_late_start_is_given_back_for_keys_with_a_delay_from_any_source(
    make_frontier: FrontierFactory,
    settings: dict[str, object],
    crawl_delay: float | None,
    bound: bool,
) -> None:
    """The worker's start window (the release of a request it could not start in time)
    applies to a key whose delay comes from DOWNLOAD_SLOTS or robots.txt's Crawl-delay
    while the crawl's DOWNLOAD_DELAY is 0, not only to crawls with a DOWNLOAD_DELAY."""
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from redcrawl.frontier import Lease
    from redcrawl.scrapy import Scheduler
    from redcrawl.scrapy.robots import RobotsTxtMiddleware

    crawler = get_crawler(Spider, {"ROBOTSTXT_OBEY": crawl_delay is not None, **settings})
    scheduler = Scheduler.from_crawler(crawler)
    assert isinstance(scheduler, Scheduler)
    scheduler.frontier = make_frontier(politeness_concurrency=2)
    if crawler.settings.getbool("ROBOTSTXT_OBEY"):
        mw = RobotsTxtMiddleware.from_crawler(crawler)
        scheduler._robots = mw
        if crawl_delay is not None:
            body = f"User-agent: *\nCrawl-delay: {crawl_delay}\n".encode()
            mw._settle("http://a.test", mw._parse(RobotsEntry(200, body)), 60.0)
    env = Envelope(url="http://a.test/p", fingerprint=fingerprint("http://a.test/p"))
    assert scheduler._delay_bound(Lease(b"x" * 20, "1", "w", 1, env, 1.0)) is bound


# --- the cache ---------------------------------------------------------------------------


@pytest.fixture
def keys() -> CrawlKeys:
    return CrawlKeys("robots-test")


def cache(
    client: redis.Redis,
    keys: CrawlKeys,
    *,
    max_bytes: int = 1 << 20,
    token: str | None = None,
    lock_ttl: float = 30.0,
) -> RobotsCache:
    return RobotsCache(client, keys, max_bytes=max_bytes, token=token, lock_ttl=lock_ttl)


def test_one_worker_fetches_the_others_wait_then_all_read_it(
    redis7_client: redis.Redis, keys: CrawlKeys
) -> None:
    a, b = cache(redis7_client, keys, token="a"), cache(redis7_client, keys, token="b")
    origin = "http://example.com:80"
    [first] = a.lookup([origin])
    [second] = b.lookup([origin])
    assert first.state == "fetch" and second.state == "wait" and second.ms_left > 0
    assert a.lookup([origin])[0].state == "fetch"  # asked again: still its own lock
    entry = RobotsEntry(200, b"User-agent: *\nDisallow: /x\n")
    stored = a.store(origin, entry, ttl=60, politeness_key="example.com", crawl_delay=None)
    assert stored.stored and stored.evicted == 0
    assert redis7_client.exists(keys.robots_lock(origin)) == 0  # released
    for c in (a, b):
        [found] = c.lookup([origin])
        assert found.state == "cached" and found.entry == entry
        assert 59_000 < found.ms_left <= 60_000


def test_entries_expire_and_are_fetched_again(redis7_client: redis.Redis, keys: CrawlKeys) -> None:
    c = cache(redis7_client, keys)
    origin = "https://example.org:443"
    assert c.lookup([origin])[0].state == "fetch"
    c.store(origin, RobotsEntry(503), ttl=0.2, politeness_key="example.org", crawl_delay=None)
    assert c.lookup([origin])[0].state == "cached"
    time.sleep(0.3)
    assert c.lookup([origin])[0].state == "fetch"


def test_crawl_delay_is_merged_into_the_override_keeping_operator_fields(
    redis7_client: redis.Redis, keys: CrawlKeys
) -> None:
    c = cache(redis7_client, keys)
    redis7_client.hset(
        keys.pol_override,
        "a.example",
        json.dumps({"concurrency": 2, "block_until": 1_800_000_000_000, "paused": False}),
    )
    origin = "http://a.example:80"
    c.lookup([origin])
    assert (
        c.store(
            origin,
            RobotsEntry(200, b"Crawl-delay: 2.5\n"),
            ttl=60,
            politeness_key="a.example",
            crawl_delay=2.5,
        ).override
        == 1
    )
    assert json.loads(redis7_client.hget(keys.pol_override, "a.example") or b"") == {
        "concurrency": 2,
        "block_until": 1_800_000_000_000,
        "paused": False,
        "crawl_delay": 2.5,
    }
    # robots.txt no longer says it: our field goes, the operator's stay
    assert (
        c.store(
            origin, RobotsEntry(200, b""), ttl=60, politeness_key="a.example", crawl_delay=None
        ).override
        == 1
    )
    assert json.loads(redis7_client.hget(keys.pol_override, "a.example") or b"") == {
        "concurrency": 2,
        "block_until": 1_800_000_000_000,
        "paused": False,
    }
    # a key with nothing but our field: the field goes, then the whole key
    c.store(
        "http://b.example:80", RobotsEntry(200), ttl=60, politeness_key="b.example", crawl_delay=1.0
    )
    assert json.loads(redis7_client.hget(keys.pol_override, "b.example") or b"") == {
        "crawl_delay": 1
    }
    assert (
        c.store(
            "http://b.example:80",
            RobotsEntry(200),
            ttl=60,
            politeness_key="b.example",
            crawl_delay=None,
        ).override
        == 1
    )
    assert redis7_client.hexists(keys.pol_override, "b.example") == 0
    # an override that is not a JSON object is left alone, and said so
    redis7_client.hset(keys.pol_override, "c.example", b"[1, 2")
    assert (
        c.store(
            "http://c.example:80",
            RobotsEntry(200),
            ttl=60,
            politeness_key="c.example",
            crawl_delay=1.0,
        ).override
        == -1
    )
    assert redis7_client.hget(keys.pol_override, "c.example") == b"[1, 2"


def test_the_cache_stays_under_its_bound(redis7_client: redis.Redis, keys: CrawlKeys) -> None:
    body = os.urandom(3000)  # incompressible: each entry is a little over 3000 bytes
    size = len(RobotsEntry(200, body).encode())
    c = cache(redis7_client, keys, max_bytes=3 * size + 10)
    for i in range(5):
        stored = c.store(
            f"http://h{i}:80",
            RobotsEntry(200, body),
            ttl=60 + i,
            politeness_key=f"h{i}",
            crawl_delay=None,
        )
        assert stored.stored and stored.evicted == (1 if i >= 3 else 0)
    total = int(redis7_client.get(keys.robots_bytes) or 0)
    assert (
        total
        == 3 * size
        == sum(redis7_client.hstrlen(keys.robots, f) for f in redis7_client.hkeys(keys.robots))
    )
    # the ones closest to expiry went first
    assert sorted(redis7_client.hkeys(keys.robots)) == [
        b"http://h2:80",
        b"http://h3:80",
        b"http://h4:80",
    ]
    assert c.lookup(["http://h0:80"])[0].state == "fetch"
    # an entry larger than the whole bound is not stored (and nothing is evicted for it)
    big = c.store(
        "http://big:80",
        RobotsEntry(200, os.urandom(4 * size)),
        ttl=60,
        politeness_key="big",
        crawl_delay=None,
    )
    assert not big.stored and big.evicted == 0
    assert redis7_client.hlen(keys.robots) == 3


def test_a_lock_is_renewed_only_by_its_owner(redis7_client: redis.Redis, keys: CrawlKeys) -> None:
    a = cache(redis7_client, keys, token="a", lock_ttl=0.5)
    b = cache(redis7_client, keys, token="b", lock_ttl=0.5)
    origin = "http://slow.example:80"
    assert a.lookup([origin])[0].state == "fetch"
    assert b.renew([origin]) == 0 and a.renew([origin]) == 1
    time.sleep(0.7)  # the owner died: the lock runs out, another worker takes over
    assert b.lookup([origin])[0].state == "fetch"


def test_entries_that_cannot_be_read_decode_to_none() -> None:
    assert RobotsEntry.decode(b"garbage") is None
    assert RobotsEntry.decode(RobotsEntry(404).encode()) == RobotsEntry(404)
    assert [RobotsEntry(s).kind for s in (200, 301, 404, 410, 500, 0)] == [
        "rules",
        "rules",
        "allow",
        "allow",
        "error",
        "error",
    ]


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://Example.COM/a?b", "http://example.com"),
        ("http://example.com:80/", "http://example.com"),
        ("https://example.com:443/", "https://example.com"),
        ("https://example.com:8443/", "https://example.com:8443"),
        ("http://user:secret@example.com:8080/", "http://example.com:8080"),
        ("http://[::1]:8080/x", "http://[::1]:8080"),
    ],
)
def test_the_origin_a_robots_txt_applies_to(url: str, origin: str) -> None:
    from scrapy import Request

    from redcrawl.scrapy.robots import _origin

    assert _origin(Request(url)) == origin


def _middleware(client: redis.Redis, keys: CrawlKeys, **settings: object) -> Any:
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from redcrawl.scrapy.robots import RobotsTxtMiddleware

    crawler = get_crawler(Spider, {"ROBOTSTXT_OBEY": True, **settings})
    mw = RobotsTxtMiddleware.from_crawler(crawler)
    mw.attach(client, keys)
    return mw


def test_a_disallowed_request_is_counted_for_the_crawl_with_the_next_heartbeat(
    redis7_client: redis.Redis, keys: CrawlKeys
) -> None:
    from scrapy import Request
    from scrapy.exceptions import IgnoreRequest

    from redcrawl.frontier import open_frontier
    from redcrawl.scrapy import counters
    from redcrawl.settings import Settings

    mw = _middleware(redis7_client, keys)
    try:
        f = open_frontier(redis7_client, Settings(), keys.crawl)
        counters.install(mw.crawler, f)
        parser = mw._parse(RobotsEntry(200, b"User-agent: *\nDisallow: /private\n"))
        mw._check(parser, Request("http://a.test/public"))
        for _ in range(2):
            with pytest.raises(IgnoreRequest):
                mw._check(parser, Request("http://a.test/private/x"))
        assert mw.stats.get_value("redcrawl/robots/disallowed") == 2
        assert "robots_disallowed" not in f.stats()
        f.renew("w1")
        assert f.stats()["robots_disallowed"] == 2
    finally:
        mw._spider_closed()


@pytest.mark.parametrize(
    ("mode", "meta", "key"),
    [
        ("host", {}, "www.example.co.uk"),
        ("domain", {}, "example.co.uk"),
        ("domain", {"download_slot": "slot-a"}, "slot-a"),
    ],
)
def test_crawl_delay_is_stored_under_the_requests_politeness_key(
    redis7_client: redis.Redis, keys: CrawlKeys, mode: str, meta: dict[str, str], key: str
) -> None:
    """The Crawl-delay of a robots.txt limits the key the frontier serves the waiting
    request's site under: with REDCRAWL_POLITENESS_KEY=domain its registrable domain (not
    its host), with a download_slot that slot."""
    from scrapy import Request

    mw = _middleware(redis7_client, keys, REDCRAWL_POLITENESS_KEY=mode)
    try:
        origin = "https://www.example.co.uk"
        mw._first[origin] = Request(f"{origin}/a", meta=meta)
        mw._fetching.add(origin)
        mw._got(origin, RobotsEntry(200, b"User-agent: *\nCrawl-delay: 2\n"), True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not redis7_client.hlen(keys.pol_override):
            time.sleep(0.02)
        stored = {
            (k.decode() if isinstance(k, bytes) else k): json.loads(v)
            for k, v in redis7_client.hgetall(keys.pol_override).items()
        }
        assert stored == {key: {"crawl_delay": 2.0}}
    finally:
        mw._spider_closed()


# --- a fleet of real workers --------------------------------------------------------------


def robots_worker(
    redis_url: str, crawl: str, urls: Sequence[str], name: str, log: Path, extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    cmd = worker_command(
        SITEKIT,
        settings=[
            "CONCURRENT_REQUESTS=16",
            "CONCURRENT_REQUESTS_PER_DOMAIN=4",
            "ROBOTSTXT_OBEY=True",
            "RETRY_ENABLED=False",
            "TELNETCONSOLE_ENABLED=False",
            "LOG_LEVEL=INFO",
            "REDCRAWL_LEASE_TTL=5",
            "REDCRAWL_IDLE_BEFORE_CLOSE=0.5",
            *extra,
        ],
        spider_args={"urls": ",".join(urls)},
    )
    env = {
        **os.environ,
        "REDCRAWL_REDIS_URL": redis_url,
        "REDCRAWL_CRAWL": crawl,
        "REDCRAWL_WORKER_ID": name,
        "PYTHONPATH": str(ROOT / "src"),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
            cwd=log.parent,
            start_new_session=True,
        )


def run_fleet(
    redis_url: str,
    crawl: str,
    urls: Sequence[str],
    tmp_path: Path,
    n: int,
    extra: Sequence[str] = (),
    timeout: float = 90,
) -> list[str]:
    """``n`` workers to the end; their logs."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for i in range(n):
            log = tmp_path / f"w{i}.log"
            procs.append((robots_worker(redis_url, crawl, urls, f"w{i}", log, extra), log))
        deadline = time.monotonic() + timeout
        for p, log in procs:
            rc = p.wait(timeout=max(0.1, deadline - time.monotonic()))
            assert rc == 0, log.read_text()[-3000:]
        return [log.read_text() for _, log in procs]
    finally:
        for p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def stat(logs: Sequence[str], name: str) -> int:
    """The sum over the workers' stats dumps of ``name``."""
    pattern = re.compile(rf"'{re.escape(name)}': (\d+)")
    return sum(int(m.group(1)) for text in logs for m in pattern.finditer(text))


RULES = "User-agent: *\nCrawl-delay: {delay}\nDisallow: /p/1\nDisallow: /p/2\n"
"""(Prefixes: with 10 pages or fewer, only /p/1 and /p/2 match.)"""
DISALLOWED = frozenset({"/p/1", "/p/2"})


@pytest.mark.slow
def test_a_fleet_fetches_each_robots_txt_once_and_obeys_it(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """3 workers; 2 hosts with rules (Crawl-delay 1, and 60 capped to 5), one whose
    robots.txt answers 500, one without (404) and one that hangs up (a network error):
    the last three allow everything. robots.txt answers slowly and the
    disallowed pages are start URLs too, so many requests wait for the same robots.txt at
    once in each worker. Each robots.txt is fetched once for the fleet, no disallowed page
    is fetched, the disallowed requests end DONE, and Crawl-delay lands in the override
    (capped), next to an operator's field."""
    crawl = "robots-fleet"
    frontier = fresh_frontier(redis7, crawl, "lists")
    client = redis.Redis.from_url(redis7.url)
    sites = [
        SiteSpec(pages=10, delay=0.1, robots=RULES.format(delay=1), robots_delay=0.6),
        SiteSpec(pages=10, delay=0.1, robots=RULES.format(delay=60), robots_delay=0.6),
        SiteSpec(pages=10, delay=0.1, robots_delay=0.6, faults={"/robots.txt": Fault(500)}),
        SiteSpec(pages=10, delay=0.1, robots_delay=0.6),
        SiteSpec(pages=10, delay=0.1, faults={"/robots.txt": Fault(0)}),
    ]
    keys = frontier.keys
    with serving(sites) as kit:
        ruled, capped, failing, missing, broken = kit.hosts
        client.hset(keys.pol_override, ruled, json.dumps({"concurrency": 3}))
        urls = [f"{root}{path}" for root in kit.roots for path in ("", "p/1", "p/2", "p/3")]
        # small leases and few requests at once, so that every worker gets requests of
        # several hosts (and reads robots.txt from the cache) even if one starts late
        logs = run_fleet(
            redis7.url,
            crawl,
            urls,
            tmp_path,
            3,
            [
                "REDCRAWL_ROBOTS_MAX_CRAWL_DELAY=5",
                "REDCRAWL_PREFETCH=2",
                "REDCRAWL_LOOKAHEAD=0",
                "CONCURRENT_REQUESTS=4",
            ],
        )
        table = format_summary(kit.summary())
        assert {h: kit.robots_fetches(h) for h in kit.hosts} == dict.fromkeys(kit.hosts, 1), table
        for host in (ruled, capped):
            fetched = {p for p in DISALLOWED if kit.fetched(host)[p]}
            assert not fetched, f"{host}: disallowed {fetched} fetched\n{table}"
        # the others allow everything: every page fetched
        for host in (failing, missing, broken):
            ok = {f.path for f in kit.fetches(host) if f.status == 200}
            assert kit.pages(host) <= ok, f"{host}: {sorted(kit.pages(host) - ok)} missing"
        for host in (ruled, capped):
            ok = {f.path for f in kit.fetches(host) if f.status == 200}
            assert kit.pages(host) - DISALLOWED <= ok
        c = frontier.counts()
        assert c.finished and c.conserved and c.dead == 0 and c.ready == 0, c
        assert c.done == c.accepted, c  # the disallowed requests too: DONE, not lost
        assert stat(logs, "redcrawl/robots/disallowed") == 2 * len(DISALLOWED)
        assert frontier.stats()["robots_disallowed"] == 2 * len(DISALLOWED)  # crawl-wide
        assert stat(logs, "redcrawl/robots/fetched") == 5
        assert stat(logs, "redcrawl/robots/errors") == 2  # the 500 and the hang-up
        assert stat(logs, "redcrawl/robots/cached") >= 1  # the others read it from Redis
        assert stat(logs, "redcrawl/robots/crawl_delay_capped") == 1
        assert sum("Crawl-delay 60 s; keeping 5 s" in text for text in logs) == 1
        override = {
            (k.decode() if isinstance(k, bytes) else k): json.loads(v)
            for k, v in client.hgetall(keys.pol_override).items()
        }
        assert override == {ruled: {"concurrency": 3, "crawl_delay": 1}, capped: {"crawl_delay": 5}}
        assert any("robots.txt is fetched once per site for the fleet" in text for text in logs)


@pytest.mark.slow
def test_robots_txt_is_read_from_the_cache_then_fetched_again_after_its_ttl(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """REDCRAWL_ROBOTS_TTL=6: a worker started right after the first one reads the host's
    robots.txt from Redis (no fetch); one started after the TTL fetches it again. Its
    rules hold every time."""
    crawl = "robots-ttl"
    frontier = fresh_frontier(redis7, crawl, "lists")
    sites = [SiteSpec(pages=6, robots="User-agent: *\nDisallow: /p/5\n", cross_links=False)]
    ttl = ["REDCRAWL_ROBOTS_TTL=6"]
    with serving(sites) as kit:
        host, root = kit.hosts[0], kit.roots[0]
        run_fleet(redis7.url, crawl, [root], tmp_path / "1", 1, ttl)
        assert kit.robots_fetches(host) == 1 and kit.fetched(host)["/"] == 1
        first_done = time.monotonic()
        # a new start URL (the rest is done): it needs the host's robots.txt again
        logs = run_fleet(redis7.url, crawl, [root + "?again"], tmp_path / "2", 1, ttl)
        assert time.monotonic() - first_done < 6, "too slow to see the cache: rerun"
        assert kit.robots_fetches(host) == 1 and kit.fetched(host)["/"] == 2
        assert stat(logs, "redcrawl/robots/cached") == 1
        time.sleep(max(0.0, first_done + 6.2 - time.monotonic()))
        logs = run_fleet(
            redis7.url, crawl, [root + "?later", root + "p/5?later"], tmp_path / "3", 1, ttl
        )
        assert kit.robots_fetches(host) == 2, format_summary(kit.summary())
        assert stat(logs, "redcrawl/robots/fetched") == 1
        assert stat(logs, "redcrawl/robots/disallowed") == 1
        assert kit.fetched(host)["/p/5"] == 0 and kit.fetched(host)["/"] == 3
        assert frontier.counts().finished


@pytest.mark.slow
def test_requests_waiting_together_for_robots_txt_are_all_checked(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """Scrapy's own middleware checks only the first of the requests waiting for the same
    robots.txt download (FACTS.md): here five disallowed start URLs wait together behind a
    slow robots.txt in one worker, and none of them is fetched."""
    crawl = "robots-waiting"
    frontier = fresh_frontier(redis7, crawl, "lists")
    sites = [
        SiteSpec(
            pages=6, robots="User-agent: *\nDisallow: /p/\n", robots_delay=0.5, cross_links=False
        )
    ]
    with serving(sites) as kit:
        root = kit.roots[0]
        logs = run_fleet(
            redis7.url, crawl, [f"{root}p/{i}" for i in range(1, 6)] + [root], tmp_path, 1
        )
        host = kit.hosts[0]
        assert kit.robots_fetches(host) == 1
        assert [f.path for f in kit.fetches(host)] == ["/robots.txt", "/"]
        assert stat(logs, "redcrawl/robots/disallowed") == 6  # /p/0 .. /p/5
        c = frontier.counts()
        assert c.finished and c.conserved and c.done == c.accepted == 7, c


@pytest.mark.slow
def test_listed_in_downloader_middlewares_it_replaces_scrapys(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """A project that lists redcrawl.scrapy.RobotsTxtMiddleware itself: Scrapy's is taken
    out (a startup note says so), robots.txt is still fetched once for the fleet."""
    crawl = "robots-listed"
    fresh_frontier(redis7, crawl, "lists")
    sites = [SiteSpec(pages=6, robots="User-agent: *\nDisallow: /p/3\n", robots_delay=0.3)]
    listed = json.dumps({"redcrawl.scrapy.RobotsTxtMiddleware": 100})
    with serving(sites) as kit:
        logs = run_fleet(
            redis7.url,
            crawl,
            kit.roots,
            tmp_path,
            2,
            [f"DOWNLOADER_MIDDLEWARES={listed}", "REDCRAWL_PREFETCH=2", "REDCRAWL_LOOKAHEAD=0"],
        )
        host = kit.hosts[0]
        assert kit.robots_fetches(host) == 1 and kit.fetched(host)["/p/3"] == 0
        assert all("Scrapy's RobotsTxtMiddleware is disabled" in text for text in logs)


@pytest.mark.slow
def test_robots_shared_off_keeps_scrapys_middleware(redis7: RedisServer, tmp_path: Path) -> None:
    """REDCRAWL_ROBOTS_SHARED=False: Scrapy's middleware, one robots.txt fetch per
    worker that needs it (said at start)."""
    crawl = "robots-off"
    fresh_frontier(redis7, crawl, "lists")
    sites = [SiteSpec(pages=10, delay=0.1, cross_links=False)]
    with serving(sites) as kit:
        logs = run_fleet(
            redis7.url,
            crawl,
            kit.roots,
            tmp_path,
            2,
            ["REDCRAWL_ROBOTS_SHARED=False", "REDCRAWL_PREFETCH=2", "REDCRAWL_LOOKAHEAD=0"],
        )
        host = kit.hosts[0]
        assert stat(logs, "redcrawl/robots/fetched") == 0
        assert kit.robots_fetches(host) == stat(logs, "robotstxt/request_count") >= 1
        assert all("REDCRAWL_ROBOTS_SHARED is off" in text for text in logs)


SLOW_ROBOTS = [
    SiteSpec(pages=6, robots="User-agent: *\nDisallow: /p/5\n", robots_delay=4.0, cross_links=False)
]
LOCKING = [
    "REDCRAWL_ROBOTS_LOCK_TTL=1.5",
    "REDCRAWL_PREFETCH=2",
    "REDCRAWL_LOOKAHEAD=0",
    "CONCURRENT_REQUESTS=2",
]  # w0 cannot hold every start request


def start_pair(
    redis_url: str, crawl: str, kit: MultiSite, tmp_path: Path
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """w0, then (once w0 is downloading robots.txt) w1, both with a start URL for each
    page, so that w1 has requests waiting for the same robots.txt."""
    root = kit.roots[0]
    urls = [root] + [f"{root}p/{i}" for i in range(6)]
    procs = [
        (
            robots_worker(redis_url, crawl, urls, "w0", tmp_path / "w0.log", LOCKING),
            tmp_path / "w0.log",
        )
    ]
    deadline = time.monotonic() + 30
    while kit.robots_fetches(kit.hosts[0]) == 0:
        assert time.monotonic() < deadline and procs[0][0].poll() is None
        time.sleep(0.02)
    procs.append(
        (
            robots_worker(redis_url, crawl, urls, "w1", tmp_path / "w1.log", LOCKING),
            tmp_path / "w1.log",
        )
    )
    return procs


def stop(procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    for p, _ in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.mark.slow
def test_the_lock_is_renewed_through_a_slow_robots_txt(redis7: RedisServer, tmp_path: Path) -> None:
    """robots.txt takes 4 s, the lock lasts 1.5 s unless renewed: the second worker
    still waits for the first one's download instead of fetching it too."""
    crawl = "robots-renew"
    frontier = fresh_frontier(redis7, crawl, "lists")
    with serving(SLOW_ROBOTS) as kit:
        procs = start_pair(redis7.url, crawl, kit, tmp_path)
        try:
            for p, log in procs:
                assert p.wait(timeout=60) == 0, log.read_text()[-3000:]
        finally:
            stop(procs)
        logs = [log.read_text() for _, log in procs]
        host = kit.hosts[0]
        assert kit.robots_fetches(host) == 1, format_summary(kit.summary())
        assert kit.fetched(host)["/p/5"] == 0
        assert stat(logs, "redcrawl/robots/cached") >= 1  # w1 had to wait for it
        assert frontier.counts().finished


@pytest.mark.slow
def test_a_worker_killed_while_fetching_robots_txt_does_not_hold_the_fleet(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """The worker downloading robots.txt is SIGKILLed: its lock runs out
    (REDCRAWL_ROBOTS_LOCK_TTL), the waiting worker fetches robots.txt itself, obeys it and
    finishes the crawl (the killed worker's leases come back)."""
    crawl = "robots-kill"
    frontier = fresh_frontier(redis7, crawl, "lists")
    with serving(SLOW_ROBOTS) as kit:
        procs = start_pair(redis7.url, crawl, kit, tmp_path)
        try:
            time.sleep(2.5)  # w1 started, leased and is waiting; w0's download goes on
            assert kit.robots_fetches(kit.hosts[0]) == 1
            os.killpg(procs[0][0].pid, signal.SIGKILL)
            procs[0][0].wait()
            p, log = procs[1]
            assert p.wait(timeout=60) == 0, log.read_text()[-3000:]
        finally:
            stop(procs)
        host = kit.hosts[0]
        assert kit.robots_fetches(host) == 2, format_summary(kit.summary())
        assert kit.fetched(host)["/p/5"] == 0
        ok = {f.path for f in kit.fetches(host) if f.status == 200}
        assert kit.pages(host) - {"/p/5"} <= ok
        c = frontier.counts()
        assert c.finished and c.conserved and c.dead == 0, c
