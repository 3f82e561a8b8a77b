"""``redcrawl migrate --to URL``: a stopped crawl copied to another Redis
(:mod:`redcrawl.migrate_to`), against real servers: Redis 6.2 (the embedded one) to
Redis 7, and Redis 7 to the real cluster of tests/cluster.py (marker ``cluster``).

The crawl has requests in every state (ready in three tiers, delayed, in flight under an
expired lease, done, dead), duplicates filtered, a politeness override, a robots.txt
cache entry and stats of its own. The copy must have the same counts, the source must
be left byte for byte as it was, the copy's in-flight requests go back to ready, and
the copy then crawls to its end with a real frontier. Bad inputs change nothing.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.codec import Envelope
from redcrawl.errors import ConfigError, FrontierError
from redcrawl.frontier import Counts, FrontierCore, open_frontier
from redcrawl.keys import CrawlKeys
from redcrawl.migrate_to import copy_crawl, crawl_redis_keys
from redcrawl.politeness.robots import RobotsCache, RobotsEntry
from redcrawl.redis_server import LocalCluster, free_port
from redcrawl.settings import Settings

from . import cluster
from .conftest import Backend, Clock, RedisServer

CRAWL = "shop"
URLS = 40
runner = CliRunner()


def env(url: str, priority: int = 0) -> Envelope:
    return Envelope(url=url, priority=priority, fingerprint=hashlib.sha1(url.encode()).digest())


def pages() -> list[Envelope]:
    """40 pages of 4 hosts, in three priority tiers."""
    return [env(f"http://h{i % 4}.test/p{i}", priority=(i % 3) - 1) for i in range(URLS)]


def settings(backend: Backend) -> Settings:
    return Settings(
        backend=backend,
        politeness=backend == "lists",
        retry_backoff=0.0,
        lease_ttl=30.0,
        max_attempts=3,
    )


def frontier(client: Any, backend: Backend, **kw: Any) -> FrontierCore:
    return open_frontier(client, settings(backend), CRAWL, follow_layout=True, **kw)


def build(client: Any, backend: Backend) -> Counts:
    """A stopped crawl with requests in every state; returns its counts."""
    f = open_frontier(client, settings(backend), CRAWL)
    assert f.push(pages()).accepted == URLS
    assert f.push(pages()[:5]).filtered == 5  # duplicates
    got = f.lease("w1", 7)
    assert len(got) == 7
    f.ack(got[:3])  # done
    f.nack(got[3], "timeout", delay=3600)  # delayed
    f.nack(got[4], "timeout", delay=3600)
    f.dead_letter(got[5], "bad page")  # dead
    f.dead_letter(got[6], "bad page")
    f.forget_worker("w1")
    held = f.lease("w2", 3, ttl=0.6)  # in flight; w2 then "dies"
    assert len(held) == 3
    f.add_stats(items=11)
    if backend == "lists":
        from redcrawl.politeness.hosts import Hosts

        Hosts(f).set("h1.test", delay=2.5, concurrency=1)
    keys = CrawlKeys(CRAWL)
    RobotsCache(client, keys, max_bytes=1 << 20).store(
        "http://h0.test:80",
        RobotsEntry(200, b"User-agent: *\nDisallow: /private"),
        ttl=3600,
        politeness_key="h0.test",
        crawl_delay=None,
    )
    time.sleep(1.2)  # w2's heartbeat and lease expire: the crawl is stopped
    c = f.counts()
    assert (c.accepted, c.filtered, c.delayed, c.in_flight, c.done, c.dead) == (
        URLS,
        5,
        2,
        3,
        3,
        2,
    )
    assert c.ready == URLS - 10 and c.conserved
    return c


def content(client: Any, key: bytes) -> object:
    """A key's value as data. Not its DUMP: a read that moves an incremental rehash on
    changes a hash table's DUMP bytes (and so their equality) but not its content."""
    kind = client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind == "hash":
        return client.hgetall(key)
    if kind == "list":
        return client.lrange(key, 0, -1)
    if kind == "set":
        return client.smembers(key)
    if kind == "zset":
        return client.zrange(key, 0, -1, withscores=True)
    if kind == "stream":
        groups = client.xinfo_groups(key)
        return client.xrange(key), [(g["name"], g["pending"]) for g in groups]
    return client.dump(key)  # strings (filters, counters) are byte-exact anyway


def snapshot(client: Any) -> dict[bytes, object]:
    """Every key of the crawl with its content."""
    found, other = crawl_redis_keys(client, CrawlKeys(CRAWL))
    return {k: content(client, k) for k in [*found, *other]}


def crawl_to_the_end(client: Any, backend: Backend) -> Counts:
    """Lease and ack until the copy is finished, on a clock two hours ahead (the delayed
    come due) that moves 5 s a round (h1.test's override asks for 2.5 s between pages)."""
    clock = Clock()
    clock.advance(7200)
    later = open_frontier(client, settings(backend), CRAWL, follow_layout=True, clock=clock)
    for _ in range(200):
        got = later.lease("w9", 10)
        later.ack(got)
        clock.advance(5)
        c = later.counts()
        if c.finished:
            return c
    raise AssertionError(f"the copy did not finish: {later.counts()}")


def check_copy(source: Any, target: Any, backend: Backend, before: Counts) -> None:
    """The copy's state: counts with the in-flight back to ready, dedupe, politeness,
    robots.txt cache and stats carried over; then it crawls to its end."""
    f = frontier(target, backend)
    c = f.counts()
    assert c.in_flight == 0 and c.conserved
    assert (c.accepted, c.filtered, c.done, c.delayed, c.dead) == (
        before.accepted,
        before.filtered,
        before.done,
        before.delayed,
        before.dead,
    )
    assert c.ready == before.ready + before.in_flight
    assert f.stats()["items"] == 11
    assert f.push(pages()).accepted == 0  # dedupe state: queued and done ones
    keys = CrawlKeys(CRAWL)
    assert target.hgetall(keys.pol_override) == source.hgetall(keys.pol_override)
    if backend == "lists":
        assert b"h1.test" in target.hgetall(keys.pol_override)
    found = RobotsCache(target, keys, max_bytes=1 << 20).lookup(["http://h0.test:80"])
    assert found[0].state == "cached" and found[0].entry is not None
    end = crawl_to_the_end(target, backend)
    assert end.done == URLS - before.dead and end.dead == before.dead


def migrate(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["migrate", "--crawl", CRAWL, *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_a_stopped_crawl_copies_to_another_server_with_nothing_lost(
    source: redis.Redis, target: redis.Redis, backend: Backend
) -> None:
    before = build(source, backend)
    kept = snapshot(source)
    result = copy_crawl(source, target, settings(backend), CRAWL)
    assert result.before == before
    assert result.returned == 3 and result.dead_lettered == 0 and result.promoted == 0
    assert result.keys == len(crawl_redis_keys(source, CrawlKeys(CRAWL))[0])
    assert {"req", "stats", "fpd", "robots"} <= set(result.parts)
    assert ("pol" in result.parts) == (backend == "lists")
    assert ("s" in result.parts) == (backend == "streams")
    assert snapshot(source) == kept  # the source is untouched
    check_copy(source, target, backend, before)


def test_the_command_dry_runs_copies_and_deletes_the_source_on_request(
    source: redis.Redis, target: redis.Redis, redis62: RedisServer, redis7: RedisServer
) -> None:
    before = build(source, "lists")
    kept = snapshot(source)
    code, out = migrate("--redis-url", redis62.url, "--to", redis7.url, "--dry-run")
    assert code == 0, out
    assert "dry run" in out and "would copy" in out and "3 in flight would go back" in out
    assert target.dbsize() == 0 and snapshot(source) == kept
    code, out = migrate("--redis-url", redis62.url, "--to", redis7.url)
    assert code == 0, out
    assert f"accepted {URLS}" in out and "verified" in out
    assert "3 in-flight request(s) went back to ready" in out
    assert "source was left as it was" in out and snapshot(source) == kept
    # a second run: the target holds the crawl now
    code, out = migrate("--redis-url", redis62.url, "--to", redis7.url)
    assert code == 1 and "already holds a crawl named 'shop'" in out and "--replace" in out
    code, out = migrate(
        "--redis-url", redis62.url, "--to", redis7.url, "--replace", "--delete-source"
    )
    assert code == 0, out
    assert "deleted first" in out and "source crawl was deleted" in out
    assert crawl_redis_keys(source, CrawlKeys(CRAWL))[0] == []
    check_copy(target, target, "lists", before)


def test_a_running_crawl_is_refused_unless_its_leases_are_force_expired(
    source: redis.Redis, target: redis.Redis, redis62: RedisServer, redis7: RedisServer
) -> None:
    f = open_frontier(source, settings("lists"), CRAWL)
    f.push(pages())
    f.lease("w1", 4, ttl=60)  # a live worker holds 4
    kept = snapshot(source)
    with pytest.raises(
        FrontierError, match=r"is running: 1 live worker\(s\), 4 request\(s\) leased"
    ):
        copy_crawl(source, target, settings("lists"), CRAWL)
    code, out = migrate("--redis-url", redis62.url, "--to", redis7.url)
    assert code == 1 and "Stop its workers" in out and "--force-expire" in out
    assert target.dbsize() == 0 and snapshot(source) == kept
    result = copy_crawl(source, target, settings("lists"), CRAWL, force_expire=True)
    assert result.live_workers == 1 and result.held_leases == 4 and result.returned == 4
    c = frontier(target, "lists").counts()
    assert (c.ready, c.in_flight, c.accepted) == (URLS, 0, URLS)
    assert frontier(target, "lists").workers() == {}
    assert snapshot(source) == kept


def test_bad_targets_say_what_to_do_and_change_nothing(
    source: redis.Redis,
    target: redis.Redis,
    redis62: RedisServer,
    redis7: RedisServer,
    tmp_path: Path,
) -> None:
    build(source, "lists")
    kept = snapshot(source)
    cases = [
        (f"redis://127.0.0.1:{free_port()}", 3, "cannot reach the target Redis"),
        (f"redis+cluster://127.0.0.1:{redis7.port}", 2, "not a Redis Cluster node"),
        ("ftp://127.0.0.1:1", 2, "option --to"),
        (redis62.url, 2, "the target is the source itself"),
    ]
    for url, code_wanted, message in cases:
        code, out = migrate("--redis-url", redis62.url, "--to", url)
        assert code == code_wanted and message in " ".join(out.split()), (url, out)
    code, out = migrate("--redis-url", redis62.url, "--to", redis7.url, "--crawl", "nope")
    assert code == 1 and "no crawl named 'nope'" in out
    assert target.dbsize() == 0 and snapshot(source) == kept
    # another database of the same server is another Redis
    other_db = redis62.url.rstrip("/") + "/3"
    with redis.Redis.from_url(other_db) as other:
        result = copy_crawl(source, other, settings("lists"), CRAWL)
        assert result.keys > 0 and snapshot(source) == kept
        other.flushdb()


def test_a_newer_source_into_an_older_target_is_refused_with_nothing_left(
    source: redis.Redis, target: redis.Redis
) -> None:
    """Redis 7's DUMP payloads cannot be restored by 6.2: the error says so, and the
    keys restored before the failure (none here) are removed."""
    build(target, "lists")  # (the 7 is the source here)
    with pytest.raises(FrontierError, match=r"cannot read the source's DUMP payloads"):
        copy_crawl(target, source, settings("lists"), CRAWL)
    assert source.dbsize() == 0


def test_the_target_must_not_be_the_source(source: redis.Redis) -> None:
    build(source, "lists")
    with pytest.raises(ConfigError, match="the target is the source itself"):
        copy_crawl(source, source, settings("lists"), CRAWL)


@pytest.mark.cluster
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_a_stopped_crawl_copies_into_the_cluster(
    redis_cluster: LocalCluster, target: redis.Redis, redis7: RedisServer, backend: Backend
) -> None:
    """From a single Redis 7 (``target`` fixture, the source here) into the cluster;
    every key of the copy lands on the master of the crawl's slot. (The library call:
    the command's clients are the same, and through CliRunner a cluster client's socket
    was reported unclosed at garbage collection in some sessions: see the report.)"""
    one = target
    before = build(one, backend)
    kept = snapshot(one)
    dst: Any = cluster.client(redis_cluster)
    try:
        result = copy_crawl(one, dst, settings(backend), CRAWL)
        assert result.before == before and result.returned == 3
        assert snapshot(one) == kept
        slots = {dst.keyslot(k) for k in crawl_redis_keys(dst, CrawlKeys(CRAWL))[0]}
        assert len(slots) == 1  # one partition: the crawl's slot
        check_copy(one, dst, backend, before)
        # a crawl already there is refused, with the cluster unchanged
        n = dst.dbsize()
        with pytest.raises(FrontierError, match="already holds a crawl named 'shop'"):
            copy_crawl(one, dst, settings(backend), CRAWL)
        assert dst.dbsize() == n
        # and back out of the cluster (the finished copy) into another database: its
        # last worker's heartbeat is two hours ahead (crawl_to_the_end's clock), so it
        # counts as running until --force-expire
        finished = frontier(dst, backend).counts()
        with redis.Redis.from_url(redis7.url.rstrip("/") + "/5") as back:
            back.flushdb()
            with pytest.raises(FrontierError, match="is running: 1 live worker"):
                copy_crawl(dst, back, settings(backend), CRAWL)
            copy_crawl(dst, back, settings(backend), CRAWL, force_expire=True)
            assert frontier(back, backend).counts() == finished
            back.flushdb()
    finally:
        dst.close()


@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_a_crawl_of_four_partitions_copies_with_every_partition(
    source: redis.Redis, target: redis.Redis, backend: Backend
) -> None:
    """Every partition's keys (``{crawl/p}``) travel with the crawl's own; the copy has
    the same counts, its in-flight requests back to ready, and crawls to its end."""
    parted = settings(backend).replace(partitions=4)
    f = open_frontier(source, parted, CRAWL)
    urls = [env(f"http://h{i % 16}.test/p{i}") for i in range(URLS)]
    assert f.push(urls).accepted == URLS
    done = f.lease("w1", 6)
    f.ack(done)
    f.forget_worker("w1")
    assert f.lease("w2", 5, ttl=0.6)  # in flight; w2 then "dies"
    time.sleep(1.2)
    before = f.counts()
    assert before.in_flight and before.done == len(done) and before.conserved
    spread = {str(k).split("}")[0] for k in source.keys(f"rc:{{{CRAWL}/*")}
    assert len(spread) == 4  # the test's crawl has requests in every partition
    result = copy_crawl(source, target, parted, CRAWL)
    assert result.returned == before.in_flight
    copy = open_frontier(target, parted, CRAWL, follow_layout=True)
    c = copy.counts()
    assert (c.accepted, c.done, c.in_flight, c.ready) == (
        URLS,
        before.done,
        0,
        before.ready + before.in_flight,
    )
    assert copy.push(urls).accepted == 0  # every partition's dedupe state came along
    for _ in range(100):
        copy.ack(copy.lease("w9", 10))
        if copy.counts().finished:
            break
    assert copy.counts().done == URLS


def test_the_target_can_come_from_the_environment(
    source: redis.Redis, target: redis.Redis, redis62: RedisServer, redis7: RedisServer
) -> None:
    """A target URL with a password given as `--to` sits in the process list (`ps`) for
    the whole copy (the security review): REDCRAWL_MIGRATE_TO takes it instead, as
    REDCRAWL_SOURCE_URL takes `--source-url`."""
    build(source, "lists")
    result = runner.invoke(
        app,
        ["migrate", "--crawl", CRAWL, "--redis-url", redis62.url, "--dry-run"],
        env={"REDCRAWL_MIGRATE_TO": redis7.url},
    )
    assert result.exit_code == 0, result.output
    assert "would copy" in result.output
    assert target.dbsize() == 0
