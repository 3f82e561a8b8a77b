"""Bugs found by trying redcrawl as a stranger would, with fleet-wide politeness on.

Each test runs real Scrapy workers on a real Redis against loopback sites
(tests/sitekit.py) and checks what the sites saw.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from .conftest import RedisServer
from .sitekit import SiteSpec, format_summary, serving
from .test_politeness_fleet import (
    CLOCK_TOLERANCE,
    PolitenessViolated,
    check_crawl_complete,
    fleet,
    fresh_frontier,
    wait_all,
)

ROBOTS_WAIT = 0.5
"""Seconds robots.txt takes to answer (on top of the site's own delay)."""


@pytest.mark.slow
def test_download_delay_holds_after_a_slow_robots_txt(redis7: RedisServer, tmp_path: Path) -> None:
    """``ROBOTSTXT_OBEY=True`` (Scrapy's project template), ``DOWNLOAD_DELAY=1``, no
    jitter, robots.txt answering in 0.6 s: page fetches at each host are at least 1 s
    apart, as with plain Scrapy (whose robots.txt request goes through the host's
    download slot and its delay). Seen: 0.4 s between the first two page fetches of every
    host (0.67 s in a trial with a 0.3 s robots.txt)."""
    crawl = "trials-robots-wait"
    frontier = fresh_frontier(redis7, crawl, "lists")
    delay = 1.0
    sites = [SiteSpec(pages=3, links=3, delay=0.1, robots_delay=ROBOTS_WAIT) for _ in range(3)]
    extra = [f"DOWNLOAD_DELAY={delay}", "ROBOTSTXT_OBEY=True"]
    with serving(sites) as kit, fleet(redis7.url, crawl, kit, tmp_path, "lists", extra) as procs:
        wait_all(procs, timeout=90)
        check_crawl_complete(kit, frontier)
        table = format_summary(kit.summary())
        gaps = {
            h: [b - a for a, b in itertools.pairwise(kit.starts(h, robots=False))]
            for h in kit.hosts
        }
        close = {
            h: round(min(g), 3) for h, g in gaps.items() if g and min(g) < delay - CLOCK_TOLERANCE
        }
        if close:
            raise PolitenessViolated(f"fetch starts closer than {delay}s at {close}:\n{table}")
