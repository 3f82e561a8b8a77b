"""``redcrawl migrate --to URL --partitions P``: a stopped crawl re-homed into another
number of partitions while it is copied (:mod:`redcrawl.migrate_rehome`), against real
servers: one Redis 6.2 into a Redis 7 (P = 1 -> 4, P = 2 -> 4), and into the real cluster
(P = 1 -> 16, marker ``cluster``).

The crawl has requests in every state (ready in three tiers, delayed, in flight under an
expired lease, done, dead), requests without a fingerprint, duplicates filtered, a
politeness override, a block and an AutoThrottle delay, a robots.txt cache entry and
stats of its own. In the copy every request must sit in the partition its politeness key
hashes to, the counts and counters must be the source's with the in-flight requests back
to ready, a done URL pushed again must be refused, and a worker then drains the copy,
every request once. Bad inputs change nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from redcrawl import codec
from redcrawl.cli import app
from redcrawl.codec import Envelope
from redcrawl.errors import ConfigError, FrontierError, LayoutMismatch
from redcrawl.frontier import Counts, FrontierCore, open_frontier
from redcrawl.frontier.records import parse_record, record_key
from redcrawl.keys import CrawlKeys, partition_of
from redcrawl.migrate_to import copy_crawl, crawl_redis_keys
from redcrawl.politeness import politeness_key
from redcrawl.politeness.autothrottle import FleetThrottle, ThrottleRule, Update
from redcrawl.politeness.hosts import Hosts
from redcrawl.politeness.robots import RobotsCache, RobotsEntry
from redcrawl.redis_server import LocalCluster
from redcrawl.settings import Settings

from . import cluster
from .conftest import Backend, RedisServer
from .test_migrate_to import CRAWL, content, env, snapshot

HOSTS = 24
runner = CliRunner()


def settings(backend: Backend, polite: bool, ordering: str = "fifo") -> Settings:
    return Settings(
        backend=backend,
        politeness=polite,
        ordering=ordering,  # type: ignore[arg-type]
        retry_backoff=0.0,
        lease_ttl=30.0,
        max_attempts=3,
    )


def pages() -> list[Envelope]:
    """96 pages of 24 hosts in three priority tiers, and 4 without a fingerprint."""
    out = [env(f"http://h{i % HOSTS}.test/p{i}", priority=(i % 3) - 1) for i in range(96)]
    return out + [Envelope(url=f"http://h{i}.test/again", dont_filter=True) for i in range(4)]


def build(client: Any, s: Settings, partitions: int = 1) -> Counts:
    """A stopped crawl with requests in every state; returns its counts."""
    f = open_frontier(client, s.replace(partitions=partitions), CRAWL)
    assert f.push(pages()).accepted == 100
    assert f.push(pages()[:5]).filtered == 5
    got = f.lease("w1", 12)
    assert len(got) == 12
    f.ack(got[:5])  # done
    f.nack(got[5], "timeout", delay=3600)  # delayed
    f.nack(got[6], "timeout", delay=3600)
    f.dead_letter(got[7], "bad page")  # dead
    f.nack(got[8], "timeout")  # retried: ready again, with an error and an attempt
    if s.politeness:  # a 429 with Retry-After: its site blocked for 10 minutes
        f.defer(got[9], "429", retry_after=600)
        f.release(got[10:])
    else:
        f.release(got[9:])
    f.forget_worker("w1")
    held = f.lease("w2", 6, ttl=0.6)  # in flight; w2 then "dies"
    assert len(held) == 6
    f.add_stats(items=11)
    keys = CrawlKeys(CRAWL)
    if s.politeness:
        Hosts(f).set("h1.test", delay=2.5, concurrency=1)
        throttle = FleetThrottle(client, keys, ThrottleRule(1.0, 0.0, 60.0, 5.0))
        throttle.enable()
        throttle.update([Update("h3.test", 2.0, 200)])
    RobotsCache(client, keys, max_bytes=1 << 20).store(
        "http://h0.test:80",
        RobotsEntry(200, b"User-agent: *\nCrawl-delay: 3"),
        ttl=3600,
        politeness_key="h0.test",
        crawl_delay=3.0,
    )
    time.sleep(1.2)  # w2's heartbeat and lease expire: the crawl is stopped
    c = f.counts()
    assert (c.accepted, c.done, c.dead, c.in_flight) == (100, 5, 1, 6)
    assert c.delayed in (2, 3) and c.conserved  # (the retried one: due, not yet promoted)
    return c


def assert_same_sites(src: FrontierCore, copy: FrontierCore) -> None:
    """Every site's politeness as ``redcrawl hosts show`` reads it: limits and where they
    come from, next time, blocks (a 429's and the operator's), backoff, overrides,
    Crawl-delay, AutoThrottle's delay, robots.txt; its ready and in-flight requests all
    ready in the copy."""
    a, b = Hosts(src), Hosts(copy)
    blocked = 0
    for i in range(HOSTS):
        x, y = a.show(f"h{i}.test"), b.show(f"h{i}.test")
        same = (
            "concurrency",
            "delay",
            "next_allowed",
            "block_until",
            "block",
            "backoff_failures",
            "paused",
            "override",
            "crawl_delay",
            "auto_delay",
            "robots",
        )
        assert [getattr(x, n) for n in same] == [getattr(y, n) for n in same], x.key
        assert (y.ready, y.in_flight) == (x.ready + x.in_flight, 0)
        blocked += x.block is not None
    assert blocked == 1  # (the 429's block came along)


def key_of(rec: bytes, s: Settings) -> str:
    key = record_key(rec)
    if key is not None:
        return key
    e = codec.decode(parse_record(rec)[3])
    return politeness_key(e.url, e.meta.get("download_slot"), s.politeness_key)


def check_homes(client: Any, s: Settings, partitions: int) -> Counter[int]:
    """Every request of the copy sits in the partition its politeness key hashes to;
    returns the requests per partition."""
    keys = CrawlKeys(CRAWL)
    per: Counter[int] = Counter()
    for q in range(partitions):
        for rid, rec in client.hgetall(keys.part(q).req).items():
            assert partition_of(key_of(rec, s), partitions) == q, (rid, q)
            per[q] += 1
    return per


def drain(client: Any, s: Settings, partitions: int) -> Counts:
    """A worker (as it runs: REDCRAWL_PARTITIONS=P, not following the layout) leases and
    acks until the copy is finished; every request is leased once."""
    from .conftest import Clock

    clock = Clock()
    clock.advance(7200)  # the delayed come due
    f = open_frontier(client, s.replace(partitions=partitions), CRAWL, clock=clock)
    seen: Counter[bytes] = Counter()
    for _ in range(400):
        got = f.lease("w9", 20)
        seen.update(x.id for x in got)
        f.ack(got)
        clock.advance(5)  # h1.test's override: 2.5 s between pages
        c = f.counts()
        if c.finished:
            assert max(seen.values()) == 1, seen.most_common(3)
            return c
    raise AssertionError(f"the copy did not finish: {f.counts()}")


CASES = [
    ("lists", True, "fifo"),
    ("lists", True, "priority"),
    ("lists", False, "lifo"),
    ("lists", False, "priority"),
    ("streams", False, "fifo"),
    ("streams", True, "fifo"),
]


@pytest.mark.parametrize(("backend", "polite", "ordering"), CASES)
def test_one_partition_rehomes_into_four_with_nothing_lost(
    source: redis.Redis,
    target: redis.Redis,
    backend: Backend,
    polite: bool,
    ordering: str,
) -> None:
    s = settings(backend, polite, ordering)
    before = build(source, s)
    kept = snapshot(source)
    src_stats = open_frontier(source, s, CRAWL).stats()
    result = copy_crawl(source, target, s, CRAWL, partitions=4)
    assert snapshot(source) == kept  # the source is untouched
    assert result.rehome is not None and result.returned == 6 and result.dead_lettered == 0
    per = check_homes(target, s, 4)
    assert len(per) == 4 and sum(per.values()) == before.accepted - before.done
    assert result.rehome.requests == [per[q] for q in range(4)]
    copy = open_frontier(target, s.replace(partitions=4), CRAWL)  # as a worker opens it
    assert copy.lost_partitions() == []  # (every partition holds the copy's identity)
    c = copy.counts()
    assert (c.accepted, c.filtered, c.done, c.dead, c.delayed, c.in_flight) == (
        before.accepted,
        before.filtered,
        before.done,
        before.dead,
        before.delayed,
        0,
    )
    assert c.ready == before.ready + before.in_flight and c.conserved
    stats = copy.stats()
    assert stats["items"] == 11 and stats["reclaimed"] == src_stats.get("reclaimed", 0) + 6
    for name in ("accepted", "filtered", "done", "retried", "died", "requeued"):
        assert stats.get(name, 0) == src_stats.get(name, 0), name
    # dedupe stays exact: done, queued and dead URLs are refused in their partitions
    again = copy.push([e for e in pages() if not e.dont_filter])
    assert again.accepted == 0
    assert target.sismember("rc:crawls", CRAWL)
    keys = CrawlKeys(CRAWL)
    found = RobotsCache(target, keys, max_bytes=1 << 20).lookup(["http://h0.test:80"])
    assert found[0].state == "cached"  # at the anchor, where a partitioned crawl reads it
    if polite:
        home = keys.part(partition_of("h1.test", 4))
        assert b"h1.test" in target.hgetall(home.pol_override)
        assert target.exists(home.pol_state_base + "h1.test")
        assert_same_sites(open_frontier(source, s, CRAWL), copy)
        rule = ThrottleRule(1.0, 0.0, 60.0, 5.0)
        delay = FleetThrottle(source, keys, rule).delay("h3.test")
        assert delay is not None and FleetThrottle(target, keys, rule).delay("h3.test") == delay
    end = drain(target, s, 4)
    assert end.done == before.accepted - before.dead and end.dead == before.dead


@pytest.mark.parametrize("dedupe", ["exact", "bloom"])
def test_a_done_url_is_refused_in_its_new_partition(
    source: redis.Redis,
    target: redis.Redis,
    dedupe: str,
) -> None:
    """The DONE filter's fingerprints carry no site: every partition has its copy, so a
    URL done in the source is refused wherever its site now lives, and a new one is not
    (exact filter and Bloom filter)."""
    s = settings("lists", False).replace(
        dedupe=dedupe, bloom_backend="lua", dedupe_capacity=100_000
    )
    f = open_frontier(source, s, CRAWL)
    urls = [env(f"http://site{i}.test/") for i in range(64)]
    f.push(urls)
    for _ in range(10):
        f.ack(f.lease("w1", 16))
    f.forget_worker("w1")
    assert f.counts().done == 64 and f.counts().in_flight == 0
    # settings that are not the crawl's: its DONE filter would be read with another plan
    with pytest.raises(LayoutMismatch, match="DEDUPE_CAPACITY"):
        copy_crawl(source, target, s.replace(dedupe_capacity=12345), CRAWL, partitions=8)
    assert target.dbsize() == 0
    result = copy_crawl(source, target, s, CRAWL, partitions=8)
    assert result.rehome is not None
    src_filter = open_frontier(source, s, CRAWL).done.memory()
    copy = open_frontier(target, s.replace(partitions=8), CRAWL)
    assert 6 * src_filter < copy.done.memory() < 10 * src_filter  # (docs/cluster.md)
    assert copy.push(urls).accepted == 0
    assert copy.push([env("http://site1.test/new")]).accepted == 1


def test_two_partitions_rehome_into_four(
    source: redis.Redis,
    target: redis.Redis,
) -> None:
    s = settings("lists", True)
    before = build(source, s, partitions=2)
    kept = snapshot2(source)
    result = copy_crawl(source, target, s.replace(partitions=2), CRAWL, partitions=4)
    assert result.rehome is not None and result.rehome.filter_copies >= 2
    assert snapshot2(source) == kept
    check_homes(target, s, 4)
    copy = open_frontier(target, s.replace(partitions=4), CRAWL)
    assert copy.push([e for e in pages() if not e.dont_filter]).accepted == 0
    end = drain(target, s, 4)
    assert end.done == before.accepted - before.dead


def snapshot2(client: Any) -> dict[bytes, object]:
    return {k: content(client, k) for k in client.keys("*")}


def test_bad_partition_counts_and_targets_are_refused_with_nothing_changed(
    source: redis.Redis,
    target: redis.Redis,
    redis7: RedisServer,
) -> None:
    s = settings("lists", True)
    build(source, s)
    kept = snapshot(source)
    url = source.connection_pool.connection_kwargs
    src_url = f"redis://{url['host']}:{url['port']}/0"
    base = ["migrate", "--crawl", CRAWL, "--redis-url", src_url, "--to", redis7.url]
    for bad in ("0", "-3", "1025", "x"):
        out = runner.invoke(app, [*base, "--partitions", bad])
        assert out.exit_code == 2 and "--partitions" in out.output, out.output
    with pytest.raises(ConfigError, match="1 to 1024"):
        copy_crawl(source, target, s, CRAWL, partitions=0)
    assert target.dbsize() == 0 and snapshot(source) == kept
    # a crawl of 2 partitions into 3: its filter cannot be split so
    with redis.Redis.from_url(redis7.url.rstrip("/") + "/4") as two:
        two.flushdb()
        build(two, s, partitions=2)
        with pytest.raises(ConfigError, match="not a multiple of 2"):
            copy_crawl(two, target, s.replace(partitions=2), CRAWL, partitions=3)
        two.flushdb()
    assert target.dbsize() == 0
    # an existing target crawl, a running crawl
    out = runner.invoke(app, [*base, "--partitions", "4"])
    assert out.exit_code == 0, out.output
    assert "re-homed from 1 into 4 partitions" in out.output
    n = target.dbsize()
    out = runner.invoke(app, [*base, "--partitions", "4"])
    assert out.exit_code == 1 and "already holds a crawl" in out.output
    f = open_frontier(source, s, CRAWL)
    f.lease("w5", 2, ttl=60)
    kept = snapshot(source)
    with pytest.raises(FrontierError, match="is running"):
        copy_crawl(source, target, s, CRAWL, partitions=8, replace=True)
    assert target.dbsize() == n and snapshot(source) == kept


@pytest.mark.cluster
@pytest.mark.parametrize(("backend", "polite"), [("lists", True), ("streams", False)])
def test_one_partition_rehomes_into_sixteen_on_the_cluster(
    redis_cluster: LocalCluster,
    target: redis.Redis,
    backend: Backend,
    polite: bool,
) -> None:
    """From a single Redis 7 into the real cluster, P = 1 -> 16: the partitions spread
    over the masters, and a worker drains the copy there."""
    s = settings(backend, polite)
    one = target
    before = build(one, s)
    kept = snapshot(one)
    dst: Any = cluster.client(redis_cluster)
    try:
        result = copy_crawl(one, dst, s, CRAWL, partitions=16)
        assert snapshot(one) == kept and result.returned == 6
        per = check_homes(dst, s, 16)
        assert sum(per.values()) == before.accepted - before.done
        nodes = {
            dst.get_node_from_key(CrawlKeys(CRAWL).part(q).req).name for q in range(16) if per[q]
        }
        assert len(nodes) == 3  # spread over the three masters
        copy = open_frontier(dst, s.replace(partitions=16), CRAWL)
        assert copy.push([e for e in pages() if not e.dont_filter]).accepted == 0
        end = drain(dst, s, 16)
        assert end.done == before.accepted - before.dead
    finally:
        dst.close()


@pytest.mark.parametrize(("backend", "polite", "ordering"), CASES)
def test_each_site_is_served_in_the_source_order(
    source: redis.Redis,
    target: redis.Redis,
    backend: Backend,
    polite: bool,
    ordering: str,
) -> None:
    """Each site's ready requests come out of the copy in the order the source would have
    served them (FIFO, LIFO, or by priority and then push order)."""
    s = settings(backend, polite, ordering)
    f = open_frontier(source, s, CRAWL)
    f.push(pages())
    f.push([env(f"http://h{i % 3}.test/late{i}", priority=i % 2) for i in range(30)])
    want = site_order(f, s)
    copy_crawl(source, target, s, CRAWL, partitions=4)
    copy = open_frontier(target, s.replace(partitions=4), CRAWL)
    assert site_order(copy, s) == want


def site_order(f: FrontierCore, s: Settings) -> dict[str, list[str]]:
    """Each site's ready URLs, next served first, as the frontier lists them (its
    partitions' queues for a partitioned crawl)."""
    out: dict[str, list[str]] = {}
    for part in getattr(f, "parts", None) or [f]:
        by_tier = sorted(part.pending(10_000), key=lambda x: x.tier)
        for info in by_tier:
            out.setdefault(politeness_key(info.url, None, s.politeness_key), []).append(info.url)
    return out


def test_the_command_dry_runs_force_expires_and_deletes_the_source(
    source: redis.Redis,
    target: redis.Redis,
    redis62: RedisServer,
    redis7: RedisServer,
) -> None:
    s = settings("lists", True)
    build(source, s)
    f = open_frontier(source, s, CRAWL)
    f.lease("w5", 3, ttl=60)  # a worker the operator knows is gone
    before = f.counts()
    kept = snapshot(source)
    base = ["migrate", "--crawl", CRAWL, "--redis-url", redis62.url, "--to", redis7.url]
    out = runner.invoke(app, [*base, "--partitions", "4", "--dry-run"])
    assert out.exit_code == 1 and "is running" in out.output  # (not forced)
    out = runner.invoke(app, [*base, "--partitions", "4", "--dry-run", "--force-expire"])
    assert out.exit_code == 0, out.output
    assert "dry run" in out.output and "into 4 partitions" in out.output
    assert target.dbsize() == 0 and snapshot(source) == kept
    args = [*base, "--partitions", "4", "--force-expire", "--delete-source"]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "re-homed from 1 into 4 partitions" in text and "REDCRAWL_PARTITIONS=4" in text
    assert "3 in-flight request(s) went back to ready" in text
    assert "verified in counts and counters" in text
    assert "source crawl was deleted" in text
    assert crawl_redis_keys(source, CrawlKeys(CRAWL))[0] == []
    c = open_frontier(target, s.replace(partitions=4), CRAWL).counts()
    assert (c.accepted, c.in_flight, c.ready) == (
        before.accepted,
        0,
        before.ready + before.in_flight,
    )
