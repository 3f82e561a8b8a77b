"""Three real Scrapy workers on a crawl of 4 partitions (``REDCRAWL_PARTITIONS=4``) obey
robots.txt's ``Crawl-delay`` as on a crawl of one: the loopback sites of tests/sitekit.py
(127.0.0.2 to .5) are in partitions 3, 3, 1 and 2, robots.txt is fetched once per site for
the fleet (the cache at the crawl's anchor), and the delay, written into the site's
partition, spaces every site's page fetches (tests/test_politeness_fleet.py's crawl)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from redcrawl.frontier import PartitionedFrontier, open_frontier
from redcrawl.keys import partition_of
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.settings import Settings

from .conftest import RedisServer
from .sitekit import SiteSpec, format_summary, serving
from .test_politeness_fleet import (
    ROBOTS,
    check_crawl_complete,
    check_gaps,
    fleet,
    handovers_of,
    wait_all,
)

P = 4


@pytest.mark.slow
def test_robots_crawl_delay_kept_by_a_fleet_on_a_partitioned_crawl(
    redis7: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    frontier = open_frontier(client, Settings(partitions=P), "polite-parts")
    assert isinstance(frontier, PartitionedFrontier)
    sites = [SiteSpec(pages=5, delay=0.1, robots=ROBOTS) for _ in range(4)]
    extra = ["ROBOTSTXT_OBEY=True", f"REDCRAWL_PARTITIONS={P}"]
    with (
        serving(sites) as kit,
        fleet(redis7.url, "polite-parts", kit, tmp_path, "lists", extra) as procs,
    ):
        assert {partition_of(h, P) for h in kit.hosts} - {0}, "no site outside partition 0"
        wait_all(procs, timeout=90)
        check_crawl_complete(kit, frontier, disallowed=frozenset({"/p/1"}))
        table = format_summary(kit.summary())
        robots = {h: kit.robots_fetches(h) for h in kit.hosts}
        assert set(robots.values()) == {1}, f"robots.txt fetches per host {robots}:\n{table}"
        assert not {h for h in kit.hosts if kit.fetched(h)["/p/1"]}, table
        check_gaps(kit, handovers_of(procs), 1.0)  # (Crawl-delay: 1)
    snap = SnapshotReader(client, Settings(), crawls=["polite-parts"]).read().crawls[0]
    assert snap.counts.done == snap.counts.accepted > 0
    assert snap.stats.get("robots_disallowed") == 4  # /p/1 of each site, summed
    assert snap.stats.get("pages", 0) > 0  # the workers' counters, summed
    client.close()
