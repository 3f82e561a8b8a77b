"""Fleet-wide AutoThrottle seen from the site (issue 13, point 3): three real Scrapy workers
crawl one slow site (every page answers in 0.5 s) with ``AUTOTHROTTLE_TARGET_CONCURRENCY=1``.

* Fleet-wide (politeness on, redcrawl.scrapy.AutoThrottle): one delay for the site, for all
  workers, tending to latency / target = 0.5 s; the site sees fetch starts about that far
  apart and about one request in progress.
* Per process (``REDCRAWL_POLITENESS=off``, Scrapy's AutoThrottle): each worker keeps its
  own 0.5 s delay, so the site sees up to three times the rate.

Both are printed (``pytest -s``); the asserts have generous tolerances (the workers share
two busy cores).
"""

from __future__ import annotations

import itertools
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.politeness.autothrottle import FleetThrottle, ThrottleRule
from redcrawl.settings import Settings

from .conftest import RedisServer
from .sitekit import MultiSite, SiteSpec, serving
from .test_politeness_fleet import CLOCK_TOLERANCE, check_crawl_complete, fleet, wait_all

LATENCY = 0.5
TARGET = 1.0
START_DELAY = 1.0
WARM_UP = 6
"""Fetches at the start of a crawl left out of the gaps (the delay starts at START_DELAY
and takes a few responses to settle)."""

SITES = [SiteSpec(pages=36, links=3, delay=LATENCY)]

AUTOTHROTTLE = (
    "CONCURRENT_REQUESTS_PER_DOMAIN=8",
    "DOWNLOAD_DELAY=0",
    "AUTOTHROTTLE_ENABLED=True",
    f"AUTOTHROTTLE_START_DELAY={START_DELAY}",
    f"AUTOTHROTTLE_TARGET_CONCURRENCY={TARGET}",
    "AUTOTHROTTLE_MAX_DELAY=10",
)


@dataclass(frozen=True)
class Seen:
    """What the site saw of one crawl, after the warm-up."""

    fetches: int
    median_gap: float
    min_gap: float
    short: float
    """The share of gaps shorter than the site's latency (less two clock tolerances)."""
    max_in_progress: int
    rate: float
    """Fetch starts per second."""

    def line(self, name: str) -> str:
        return (
            f"{name:<28} fetches {self.fetches:>3}  median gap {self.median_gap:.3f}s  "
            f"min gap {self.min_gap:.3f}s  short {self.short:.0%}  "
            f"max in progress {self.max_in_progress}  rate {self.rate:.2f}/s"
        )


def seen(kit: MultiSite) -> Seen:
    [host] = kit.hosts
    starts = kit.starts(host, robots=False)[WARM_UP:]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    return Seen(
        fetches=len(kit.starts(host)),
        median_gap=statistics.median(gaps),
        min_gap=min(gaps),
        short=sum(g < LATENCY - 2 * CLOCK_TOLERANCE for g in gaps) / len(gaps),
        max_in_progress=kit.max_in_progress(host),
        rate=(len(starts) - 1) / (starts[-1] - starts[0]),
    )


def stat(logs: list[str], name: str) -> int:
    """The sum of a stat over the workers' final stats dumps."""
    pattern = re.compile(rf"'{re.escape(name)}': (\d+)")
    return sum(int(m.group(1)) for text in logs for m in pattern.finditer(text))


def frontier_for(server: RedisServer, crawl: str, polite: bool, backend: str) -> FrontierCore:
    client = redis.Redis.from_url(server.url)
    settings = Settings(backend=backend, politeness=polite)  # type: ignore[arg-type]
    return open_frontier(client, settings, crawl)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_fleet_wide_autothrottle_vs_per_process(
    redis7: RedisServer, tmp_path: Path, backend: str
) -> None:
    redis.Redis.from_url(redis7.url).flushall()

    shared = frontier_for(redis7, "at-fleet", polite=True, backend=backend)
    (tmp_path / "fleet").mkdir()
    with (
        serving(SITES) as kit,
        fleet(redis7.url, "at-fleet", kit, tmp_path / "fleet", backend, AUTOTHROTTLE) as procs,
    ):
        wait_all(procs, timeout=120)
        check_crawl_complete(kit, shared)
        on = seen(kit)
        [host] = kit.hosts
        logs = [log.read_text() for _, log in procs]
    rule = ThrottleRule(TARGET, 0.0, 10.0, START_DELAY)
    final = FleetThrottle(shared.client, shared.keys, rule).delay(host)

    alone = frontier_for(redis7, "at-alone", polite=False, backend=backend)
    (tmp_path / "alone").mkdir()
    per_process = (*AUTOTHROTTLE, "REDCRAWL_POLITENESS=off")
    with (
        serving(SITES) as kit,
        fleet(redis7.url, "at-alone", kit, tmp_path / "alone", backend, per_process) as procs,
    ):
        wait_all(procs, timeout=120)
        check_crawl_complete(kit, alone)
        off = seen(kit)

    print()
    print(on.line("fleet-wide (redcrawl)"))
    print(off.line("per process (Scrapy's)"))
    print(
        f"fleet's final delay for {host}: {final}; per-process/fleet rate {off.rate / on.rate:.2f}"
    )

    responses, calls = (
        stat(logs, "redcrawl/autothrottle/responses"),
        stat(logs, "redcrawl/autothrottle/calls"),
    )
    print(f"AutoThrottle: {responses} latencies sent in {calls} script calls")
    assert 0 < calls <= responses
    for text in logs:
        assert text.count("AUTOTHROTTLE_ENABLED: one delay per site for the whole fleet") == 1
    # the fleet's delay settled near latency / target (download_latency adds a little)
    assert final is not None and LATENCY <= final < 2 * LATENCY
    # the site saw the fleet's delay between fetch starts, and about one at a time
    assert on.median_gap >= LATENCY - 2 * CLOCK_TOLERANCE, on
    assert on.short <= 0.2, on  # a request that waited in a busy worker starts late
    assert on.max_in_progress <= 2, on
    # per process, the fleet hits the site harder (about N = 3 times)
    assert off.rate >= 1.5 * on.rate, (on, off)
    assert off.max_in_progress >= 2, off
