"""The exact filter stays compact on a Redis with default configuration, through the plain
frontier API (no scheduler, no CLI: nobody raises set-max-intset-entries), across a real
server restart with persistence (issue 11, "Memory").

Each test starts a server of its own in a temporary directory, so that its configuration
is Redis's default (set-max-intset-entries 512) and no other test's CONFIG SET leaks in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.dedupe import BUCKET_FILL, bucket_key, exact_spec, split
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.settings import Settings

from .conftest import RedisServer, redis_binary

N = 1_000_000
"""Done URLs at the end of the memory test (the crawl's planned capacity)."""
THROUGH_FRONTIER = 100_000
"""Of which pushed, leased and acked through the frontier (the rest, for the test's
runtime, go straight into the crawl's filter: the same Lua, the same keys)."""


class Server(RedisServer):
    """A redis-server that can be restarted on its own data, as an operator would: RDB
    (``SHUTDOWN SAVE``) or AOF (``appendonly yes``)."""

    def restart(self, *, save: bool | None = None) -> None:
        rdb = self.persistence == "rdb"
        super().restart(save=save if save is not None else (True if rdb else None))


@pytest.fixture(params=[("7", "aof"), ("6.2", "rdb")], ids=["redis7-aof", "redis6.2-rdb"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    kind, persistence = request.param
    binary = redis_binary(kind)
    s = Server(binary, tmp_path, persistence=persistence, timeout=60)
    try:
        yield s
    finally:
        s.stop()


def url(i: int) -> str:
    return f"http://example.com/page/{i}"


def fp(i: int) -> bytes:
    return hashlib.sha1(url(i).encode()).digest()


def envs(start: int, stop: int) -> list[Envelope]:
    return [Envelope(url=url(i), fingerprint=fp(i)) for i in range(start, stop)]


def crawl_through(frontier: FrontierCore, start: int, stop: int, batch: int = 10_000) -> None:
    """Push, lease and ack URLs start..stop with the public API, in big batches."""
    for lo in range(start, stop, batch):
        hi = min(stop, lo + batch)
        assert frontier.push(envs(lo, hi)).accepted == hi - lo
        leases = frontier.lease("worker", hi - lo, ttl=600)
        assert len(leases) == hi - lo
        assert frontier.ack(leases) == hi - lo


def add_directly(frontier: FrontierCore, start: int, stop: int, batch: int = 10_000) -> None:
    for lo in range(start, stop, batch):
        assert (
            sum(frontier.done.add([fp(i) for i in range(lo, min(stop, lo + batch))]))
            == min(stop, lo + batch) - lo
        )


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~45 s on a loaded 2-core machine
def test_a_million_done_urls_cost_at_most_10_bytes_each_on_a_default_redis(server: Server) -> None:
    client = redis.Redis(port=server.port)
    assert client.config_get("set-max-intset-entries")["set-max-intset-entries"] == "512"
    settings = Settings(dedupe_capacity=N, politeness=False)  # one host, bulk leases
    frontier = open_frontier(client, settings, "mem")
    used0 = int(client.info("memory")["used_memory"])
    half = THROUGH_FRONTIER // 2
    crawl_through(frontier, 0, half)
    add_directly(frontier, half, N // 2)
    server.restart()  # set-max-intset-entries is Redis's default again, whatever was set
    assert frontier.push(envs(0, 1000) + envs(N // 2 - 1000, N // 2)).accepted == 0
    add_directly(frontier, N // 2, N - half)
    crawl_through(frontier, N - half, N)  # the same frontier object, reconnected

    counts = frontier.counts()
    assert counts.done == THROUGH_FRONTIER and counts.conserved
    keys = [k for k in frontier.done.redis_keys() if not k.endswith(b":n")]
    # MEMORY USAGE of the filter's keys (key name, dict entry, object, the intset's
    # allocation): exactly what the filter costs, whatever else the server holds (the
    # frontier's own keys, scripts, AOF and client buffers all count in used_memory)
    per_url = frontier.done.memory() / N
    used_per_url = (int(client.info("memory")["used_memory"]) - used0) / N
    print(
        f"Redis {client.info('server')['redis_version']}: {per_url:.2f} B/URL (MEMORY "
        f"USAGE), used_memory delta {used_per_url:.2f} B/URL, {len(keys)} buckets"
    )
    assert per_url <= 10, f"{per_url:.2f} bytes per done URL"
    # a loose cross-check (hash-table buckets cost 30-75 bytes per URL): used_memory also
    # holds the lease replies kept for retries (CALL_SLOTS of up to 10,000 ids here)
    assert used_per_url <= 15, f"used_memory grew by {used_per_url:.2f} bytes per done URL"
    encodings = _pipe(client, "object", keys, "encoding")
    assert encodings.count(b"intset") == len(keys), "buckets left the intset encoding"

    # no false negative (every 3rd done URL, for the runtime; test_dedupe checks all)
    for lo in range(0, N, 30_000):
        assert all(frontier.done.contains([fp(i) for i in range(lo, min(N, lo + 30_000), 3)]))
    assert frontier.push(envs(N - 500, N + 500)).accepted == 500
    assert frontier.done.health() == []


def test_growth_past_the_planned_capacity_keeps_buckets_compact(server: Server) -> None:
    """10x the planned capacity: new levels of buckets, each bucket within BUCKET_FILL
    (well under 512), every fingerprint found, across a restart."""
    client = redis.Redis(port=server.port)
    frontier = open_frontier(client, Settings(dedupe_capacity=10_000, politeness=False), "grow")
    spec = frontier.dedupe
    crawl_through(frontier, 0, 20_000, batch=3_000)
    add_directly(frontier, 20_000, 60_000, batch=7_000)
    server.restart()
    add_directly(frontier, 60_000, 100_000, batch=7_000)
    crawl_through(frontier, 100_000, 110_000, batch=3_000)
    keys = [k for k in frontier.done.redis_keys() if not k.endswith(b":n")]
    sizes = [int(n) for n in _pipe(client, "scard", keys)]
    assert sum(sizes) == 110_000
    assert max(sizes) <= BUCKET_FILL * 1.5 < 512
    assert set(_pipe(client, "object", keys, "encoding")) == {b"intset"}
    assert int(client.get("rc:{grow}:fpd:n") or 0) == 110_000
    top = spec.level_of(110_000)
    assert top == 3  # levels of 10,240, 20,480, 40,960 and 81,920 URLs
    assert len(keys) == sum(spec.level_buckets(level) for level in range(top + 1))
    assert all(frontier.done.contains([fp(i) for i in range(110_000)]))
    assert not any(frontier.done.contains([fp(i) for i in range(110_000, 120_000)]))
    assert frontier.push(envs(0, 100) + envs(109_900, 110_000)).accepted == 0


def _pipe(client: redis.Redis, command: str, keys: list[bytes], *first: str) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        getattr(pipe, command)(*first, key)
    return list(pipe.execute())


def test_a_crawl_created_with_the_legacy_plan_keeps_it(server: Server) -> None:
    """A crawl created before levels (spec "exact <b> 0 0", buckets of ~2,048) keeps its
    stored plan: its done fingerprints stay found, new ones go to its buckets."""
    client = redis.Redis(port=server.port)
    settings = Settings(dedupe_capacity=100_000, politeness=False)
    legacy = exact_spec(100_000, legacy=True)
    assert legacy.encode() == "exact 6 0 0"  # what the code before levels planned
    # the crawl as that code left it: its layout, and done fingerprints in its buckets
    # (the 63-bit integer of bytes 9-16 in bucket <bytes 1-3> mod 2^6)
    frontier = open_frontier(client, settings, "old")
    layout = f"{settings.ordering} {','.join(map(str, settings.tier_bounds))} "
    client.hset(frontier.keys.control, "layout", layout + legacy.encode())
    pipe = client.pipeline(transaction=False)
    for i in range(5_000):
        bucket, member = split(fp(i), legacy.bucket_bits)
        pipe.sadd(bucket_key(frontier.keys.fp_done, 0, bucket), member)
    pipe.execute()

    frontier = open_frontier(client, settings, "old")  # a worker of the new code
    assert frontier.dedupe == legacy
    assert frontier.push(envs(0, 5_000)).accepted == 0  # still done
    crawl_through(frontier, 5_000, 6_000, batch=500)
    server.restart()
    assert frontier.push(envs(0, 6_000)).accepted == 0
    assert client.hget(frontier.keys.control, "layout") == (layout + legacy.encode()).encode()
    assert client.exists("rc:{old}:fpd:n") == 0  # no counter, no levels
    assert len(frontier.done.redis_keys()) == 2**legacy.bucket_bits
    # the new plan for a new crawl with the same settings
    assert open_frontier(client, settings, "new").dedupe == exact_spec(100_000)
