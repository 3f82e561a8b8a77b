"""The range of the delay's jitter (Scrapy 2.19's ``DOWNLOAD_DELAY_JITTER`` and a
``DOWNLOAD_SLOTS`` entry's ``jitter``), kept by the frontier's lease step (lists backend):
each gap is the delay times a factor in [1 - j, 1 + j)."""

from __future__ import annotations

import json

import pytest
from scrapy.settings import Settings as ScrapySettings

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore
from redcrawl.settings import Settings

from .conftest import Clock, FrontierFactory


def site(host: str, n: int) -> list[Envelope]:
    return [
        Envelope(url=f"http://{host}/p{i}", fingerprint=fingerprint(f"http://{host}/p{i}"))
        for i in range(n)
    ]


def gaps(f: FrontierCore, clock: Clock, key: str, n: int = 40) -> list[int]:
    """The gaps (ms) the lease step charges for ``n`` grants of ``key`` in a row."""
    f.push(site(key, n))
    out = []
    for _ in range(n):
        assert len(f.lease("w", 10)) == 1
        nxt = int(f.client.hget(f.keys.pol_state_base + key, "next") or 0)
        out.append(nxt - clock.ms)
        clock.ms = nxt
    return out


def test_download_delay_jitter_is_read_with_scrapys_precedence() -> None:
    assert Settings.from_scrapy({"DOWNLOAD_DELAY_JITTER": 0.1}).politeness_jitter == 0.1
    assert Settings.from_scrapy({}).politeness_jitter == 0.5
    off = Settings.from_scrapy({"DOWNLOAD_DELAY_JITTER": 0})
    assert off.politeness_randomize is False
    # RANDOMIZE_DOWNLOAD_DELAY set at a higher priority wins, with Scrapy's range 0.5
    s = ScrapySettings()
    s.set("DOWNLOAD_DELAY_JITTER", 0.1, priority="project")
    s.set("RANDOMIZE_DOWNLOAD_DELAY", True, priority="cmdline")
    both = Settings.from_scrapy(s)
    assert (both.politeness_randomize, both.politeness_jitter) == (True, 0.5)
    slots = Settings.from_scrapy({"DOWNLOAD_SLOTS": {"a.test": {"jitter": 0.2}}})
    assert slots.politeness_slots["a.test"] == {"randomize_delay": True, "jitter": 0.2}


@pytest.mark.backends("lists", "streams")
def test_the_crawls_jitter_sets_the_range(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = make_frontier(
        politeness_concurrency=100,
        politeness_delay=1.0,
        politeness_randomize=True,
        politeness_jitter=0.1,
        politeness_start_window=0.0,
    )
    f.store_politeness(worker=True)
    assert json.loads(f.client.hget(f.keys.control, "politeness") or b"")["jitter"] == 0.1
    got = gaps(f, clock, "a.test")
    assert all(900 <= g < 1100 for g in got), got
    assert len(set(got)) > 10


@pytest.mark.backends("lists", "streams")
def test_a_slots_jitter_sets_the_range_of_its_key(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = make_frontier(
        politeness_concurrency=100,
        politeness_delay=1.0,
        politeness_randomize=False,
        politeness_start_window=0.0,
        politeness_slots={"wide.test": {"jitter": 0.9}, "narrow.test": {"jitter": 0.05}},
    )
    f.store_politeness(worker=True)
    plain = gaps(f, clock, "plain.test", 5)
    assert plain == [1000] * 5  # the crawl's: no jitter
    wide = gaps(f, clock, "wide.test")
    assert all(100 <= g < 1900 for g in wide) and min(wide) < 500 and max(wide) > 1500, wide
    narrow = gaps(f, clock, "narrow.test")
    assert all(950 <= g < 1050 for g in narrow), narrow


@pytest.mark.backends("lists", "streams")
def test_the_jitter_never_takes_a_gap_below_the_sites_crawl_delay(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """Found by crawling a startproject project (``DOWNLOAD_DELAY = 1``, Scrapy's default
    ``RANDOMIZE_DOWNLOAD_DELAY``) against a site whose robots.txt says ``Crawl-delay: 2``:
    gaps of 1.1 s at the site. The jitter is Scrapy's, for the crawl's own delay; a site's
    Crawl-delay is what the site asked for, a floor no draw goes under."""
    f = make_frontier(
        politeness_concurrency=100,
        politeness_delay=1.0,
        politeness_randomize=True,
        politeness_start_window=0.0,
    )
    f.store_politeness(worker=True)
    f.client.hset(f.keys.pol_override, "slow.test", json.dumps({"crawl_delay": 2}))
    f.client.hset(f.keys.pol_override, "mild.test", json.dumps({"crawl_delay": 0.2}))
    slow = gaps(f, clock, "slow.test")
    assert all(g >= 2000 for g in slow), slow
    # below the crawl's own delay, the Crawl-delay bites nowhere: Scrapy's range as before
    mild = gaps(f, clock, "mild.test")
    assert all(500 <= g < 1500 for g in mild) and min(mild) < 800, mild
    # an operator's delay wins outright, jitter and all (the operator's choice)
    f.client.hset(f.keys.pol_override, "ops.test", json.dumps({"crawl_delay": 2, "delay": 1}))
    ops = gaps(f, clock, "ops.test")
    assert all(500 <= g < 1500 for g in ops) and min(ops) < 800, ops
