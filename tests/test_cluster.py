"""redcrawl on a real Redis Cluster (3 masters, 3 replicas on loopback: tests/cluster.py),
one partition per crawl: every key of a crawl has the hash tag ``{crawl}``, so a crawl
lives on one master and several crawls spread over the masters.

- ``redis+cluster://`` URLs: parsed, connected, and refused with a message that says what
  to do (a bad URL, a server that is not a cluster, a cluster node given as redis://).
- Crawls are found on every master (CLI, API, metrics), and the metrics' Redis figures
  are every master's, summed; ``redcrawl serve`` in its own process.
- The conservation law under random interleavings (the hypothesis state machine of
  tests/test_frontier_properties.py, fewer examples), on both backends.
- Worker processes SIGKILLed mid-crawl (tests/test_kill.py's check, a smaller crawl), on
  both backends.
- A real Scrapy crawl of the local shop site with 2 workers (``redcrawl crawl``), then
  ``redcrawl status``, ``redcrawl crawls``, ``redcrawl top`` and ``redcrawl hosts``.
- Server settings (CONFIG GET/SET) read and set on every master.

The frontier contract itself (tests/test_frontier.py and others, unchanged) runs on the
cluster in tests/test_cluster_frontier.py; a master killed under a lease/ack loop in
tests/test_cluster_failover.py.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from hypothesis import HealthCheck
from hypothesis import settings as hsettings

from redcrawl.cluster import ClusterClient, cluster_nodes, is_cluster_url, merge_infos
from redcrawl.codec import Envelope
from redcrawl.connection import connect, redis_cli_hint
from redcrawl.errors import ConfigError, RedisUnavailable
from redcrawl.frontier import open_frontier
from redcrawl.keys import CrawlKeys
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.redis_server import LocalCluster, free_port
from redcrawl.settings import Settings

from . import cluster
from .apikit import AUTH_READ, SRC, ApiServer, api_settings, serving
from .conftest import RedisServer
from .killkit import kill_one_midway, parse_log
from .shop_helpers import crawl_the_shop
from .test_frontier_properties import FrontierMachine

pytestmark = pytest.mark.cluster


@pytest.fixture
def client(redis_cluster: LocalCluster) -> Iterator[redis.Redis]:
    c = cluster.client(redis_cluster)
    yield c
    c.close()


def _fps(n: int, start: int = 0) -> list[Envelope]:
    return [
        Envelope(url=f"http://site/{i}", fingerprint=hashlib.sha1(b"%d" % i).digest())
        for i in range(start, start + n)
    ]


# --- connecting ------------------------------------------------------------------------
def test_cluster_urls_name_every_node_and_keep_credentials_tls_and_options() -> None:
    assert is_cluster_url("redis+cluster://h:1") and is_cluster_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://h:1") and not is_cluster_url(None)
    plain, nodes = cluster_nodes("redis+cluster://u:p%40ss@a:7000,b:7001,[::1]:7002,c/0?x=1")
    assert plain == "redis://u:p%40ss@a:7000/0?x=1"
    assert nodes == [("a", 7000), ("b", 7001), ("::1", 7002), ("c", 6379)]
    plain, nodes = cluster_nodes("rediss+cluster://a:7000")
    assert (plain, nodes) == ("rediss://a:7000", [("a", 7000)])
    for bad, says in [
        ("redis://a:1", "redis\\+cluster://"),
        ("redis+cluster://a:1,,b:2", "host:port"),
        ("redis+cluster://a:x", "not host:port"),
        ("redis+cluster://a:70000", "not host:port"),
        ("redis+cluster://a:1/3", "only database 0"),
    ]:
        with pytest.raises(ConfigError, match=says):
            cluster_nodes(bad)


def test_connecting_to_a_cluster_and_the_errors_that_say_what_to_do(
    redis_cluster: LocalCluster, redis7: RedisServer
) -> None:
    c = connect(Settings(redis_url=redis_cluster.url))
    assert isinstance(c, ClusterClient) and c.ping()
    assert len(c.masters()) == 3
    c.close()
    # one node is enough to find the others
    one = redis_cluster.nodes[4]
    c = connect(Settings(redis_url=f"redis+cluster://127.0.0.1:{one.port}"))
    assert len(c.masters()) == 3
    c.close()
    with pytest.raises(ConfigError, match=r"not a Redis Cluster node.*redis://"):
        connect(Settings(redis_url=f"redis+cluster://127.0.0.1:{redis7.port}"))
    with pytest.raises(ConfigError, match=r"is a Redis Cluster node.*redis\+cluster://"):
        connect(Settings(redis_url=f"redis://127.0.0.1:{one.port}"))
    with pytest.raises(RedisUnavailable, match="cannot reach Redis"):
        connect(Settings(redis_url=f"redis+cluster://127.0.0.1:{free_port()}"))
    with pytest.raises(ConfigError, match="only database 0"):
        connect(Settings(redis_url=redis_cluster.url, redis_db=2))
    hint = redis_cli_hint(Settings(redis_url=f"redis+cluster://u:secret@127.0.0.1:{one.port}"))
    assert hint == f"redis-cli -c -u 'redis://u:***@127.0.0.1:{one.port}'"


def test_closing_a_cluster_client_closes_its_sockets(redis_cluster: LocalCluster) -> None:
    """A closed client leaves no socket open (redis-py 8 kept one per node it had used
    when the client came from a URL, until garbage collection: a ResourceWarning)."""
    c = connect(Settings(redis_url=redis_cluster.url))
    assert isinstance(c, ClusterClient)
    for i in range(20):  # keys on every master
        c.set(f"close-{i}", 1)
    pools = [n.redis_connection.connection_pool for n in c.nodes_manager.nodes_cache.values()]
    conns = [x for pool in pools for x in pool._available_connections]
    assert any(x._sock is not None for x in conns)  # (the test sees the sockets)
    c.close()
    assert [x for x in conns if x._sock is not None] == []


# --- crawls over masters -----------------------------------------------------------------
def test_a_crawl_lives_on_one_master_and_crawls_spread_over_all(
    redis_cluster: LocalCluster, client: redis.Redis
) -> None:
    names = [f"crawl-{i}" for i in range(12)]
    for backend, name in zip(["lists", "streams"] * 6, names, strict=True):
        f = open_frontier(client, Settings(backend=backend, politeness=False), name)  # type: ignore[arg-type]
        f.push(_fps(5))
        f.ack(f.lease("w", 2))
    homes: dict[str, set[int]] = defaultdict(set)
    for master in redis_cluster.masters():
        with master.client() as mc:
            for key in mc.keys("rc:{*"):  # (not rc:crawls, the crawl registry)
                homes[key.decode().split("{")[1].split("}")[0]].add(master.port)
    assert set(homes) == set(names)
    assert all(len(ports) == 1 for ports in homes.values()), homes  # one master per crawl
    assert len({p for ports in homes.values() for p in ports}) == 3  # and all masters used
    # every crawl is found: SCAN over every master (metrics, API, CLI use it)
    reader = SnapshotReader(client, Settings())
    assert reader.find_crawls() == (sorted(names), 0)
    snap = reader.read()
    assert sorted(s.crawl for s in snap.crawls) == sorted(names)
    assert all(s.counts.done == 2 and s.counts.ready == 3 for s in snap.crawls)
    # the Redis figures are the masters', summed
    per_master = []
    for m in redis_cluster.masters():
        with m.client() as mc:
            per_master.append(int(mc.info("memory")["used_memory"]))
    assert snap.redis is not None
    assert 0.5 * sum(per_master) < snap.redis.used_memory < 2 * sum(per_master)
    assert snap.redis.used_memory > max(per_master)
    # a pattern in one crawl's hash tag is scanned on that crawl's master only
    assert len(client.keys("rc:{crawl-3}:*")) == len(list(client.scan_iter("rc:{crawl-3}:*")))


def test_merged_info_sums_counters_and_keeps_the_worst() -> None:
    merged = merge_infos(
        {
            "a": {"used_memory": 10, "maxmemory": 100, "rdb_last_bgsave_status": "ok",
                  "maxmemory_policy": "noeviction", "rdb_last_save_time": 50, "aof_enabled": 1},
            "b": {"used_memory": 5, "maxmemory": 100, "rdb_last_bgsave_status": "err",
                  "maxmemory_policy": "allkeys-lru", "rdb_last_save_time": 20, "aof_enabled": 0},
        }
    )  # fmt: skip
    assert merged == {
        "used_memory": 15,
        "maxmemory": 200,
        "rdb_last_bgsave_status": "err",
        "maxmemory_policy": "allkeys-lru",
        "rdb_last_save_time": 20,
        "aof_enabled": 0,
        "cluster_masters": 2,
    }


def test_api_lists_and_reads_crawls_on_every_master(
    redis_cluster: LocalCluster, client: redis.Redis
) -> None:
    names = [f"api-{i}" for i in range(6)]
    for name in names:
        open_frontier(client, Settings(politeness=False), name).push(_fps(3))
    server = ApiServer(api_settings(redis_cluster.url), client)
    try:
        r = httpx.get(f"{server.url}/v1/crawls", headers=AUTH_READ, timeout=10)
        assert r.status_code == 200, r.text
        assert sorted(c["crawl"] for c in r.json()["crawls"]) == names
        r = httpx.get(f"{server.url}/v1/crawls/api-4/pending", headers=AUTH_READ, timeout=10)
        assert r.status_code == 200 and len(r.json()["items"]) == 3, r.text
        r = httpx.get(f"{server.url}/metrics", headers=AUTH_READ, timeout=10)
        assert r.status_code == 200 and "redcrawl_up 1.0" in r.text, r.text
    finally:
        server.stop()


def test_redcrawl_serve_on_a_cluster_url(
    redis_cluster: LocalCluster, client: redis.Redis, tmp_path: Path
) -> None:
    """``redcrawl serve`` (its own process) reaches the cluster and submits work."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "REDCRAWL_REDIS_URL": redis_cluster.url,
        "REDCRAWL_API_PORT": str(port),
    }
    env.pop("REDCRAWL_API_TOKENS", None)
    env.pop("REDCRAWL_API_ADMIN_TOKENS", None)
    with serving(tmp_path, env, f"http://127.0.0.1:{port}/v1/ready") as (r, _log):
        assert r.json() == {"status": "ok"}
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/crawls/served/requests",
            json={"requests": [{"url": "https://example.com/"}]},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
    assert open_frontier(client, Settings(), "served").counts().ready == 1


# --- the conservation law ------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_random_interleavings_on_the_cluster(client: redis.Redis, backend: str) -> None:
    """The state machine of tests/test_frontier_properties.py (conservation law, counters
    against a model, one owner per request, politeness caps on lists), fewer examples."""
    cls: type[FrontierMachine] = type(
        "ClusterMachine", (FrontierMachine,), {"client": client, "backend": backend}
    )
    cls.TestCase.settings = hsettings(
        max_examples=15,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    cls.TestCase().runTest()


# --- SIGKILL -------------------------------------------------------------------------------
N = 4000


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_sigkill_one_of_three_workers_loses_nothing(
    redis_cluster: LocalCluster, client: redis.Redis, tmp_path: Path, backend: str
) -> None:
    """tests/test_kill.py on the cluster: 3 worker processes (tests/frontier_worker.py)
    through ``redis+cluster://``; one is SIGKILLed while it holds leases. Every request
    ends DONE, acked once; what the victim held is handed out again."""
    crawl = "kill"
    frontier = open_frontier(client, Settings(backend=backend), crawl)  # type: ignore[arg-type]
    envs = _fps(N)
    assert frontier.push(envs).accepted == N
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    held = kill_one_midway(redis_cluster.url, crawl, logs, backend, frontier, N)
    c = frontier.counts()
    assert (c.accepted, c.done, c.dead, c.pending) == (N, N, 0, 0), c
    assert c.conserved
    acked: dict[str, list[str]] = defaultdict(list)
    processed: set[str] = set()
    for i, log in enumerate(logs):
        batches, counts = parse_log(log)
        for n, batch in enumerate(batches):
            processed |= {rid for rid, _ in batch}
            if n < len(counts) and counts[n] == len(batch):
                for rid, _ in batch:
                    acked[rid].append(f"w{i}")
    assert len(processed) == N
    assert not {r: w for r, w in acked.items() if len(w) > 1}, "acked twice"
    assert set(acked) == processed, "processed but never acknowledged"
    assert held and all(x.id in acked for x in held)


# --- a Scrapy crawl ------------------------------------------------------------------------
@pytest.mark.slow
def test_two_scrapy_workers_crawl_the_shop_through_a_cluster_url(
    redis_cluster: LocalCluster, client: redis.Redis, tmp_path: Path
) -> None:
    shop = crawl_the_shop(redis_cluster.url, tmp_path, products=300, timeout=180)
    c = open_frontier(client, Settings(), "shop").counts()
    assert c.finished and c.conserved and c.done == len(shop.expected) and c.dead == 0, c
    assert len(shop.logs) == 2
    listing = shop.cli("crawls")
    assert listing.returncode == 0 and b"shop" in listing.stdout, listing.stderr.decode()
    top = shop.cli("top", "--once", "--crawl", "shop")
    assert top.returncode == 0 and b"alive" in top.stdout, top.stderr.decode()
    hosts = shop.cli("hosts", "--crawl", "shop", "--json")
    assert hosts.returncode == 0 and b'"complete": true' in hosts.stdout, hosts.stderr.decode()


def test_keys_of_a_crawl_share_one_slot(redis_cluster: LocalCluster, client: redis.Redis) -> None:
    """Every key a crawl's scripts touch, including the per-key ones Lua builds from the
    bases in KEYS (politeness queues and state, dedupe buckets), is in the crawl's slot."""
    f = open_frontier(client, Settings(), "slots")  # lists, politeness on: per-key queues
    f.push(
        [Envelope(url=f"http://h{i % 3}.example/{i}", fingerprint=b"%020d" % i) for i in range(30)]
    )
    f.ack(f.lease("w", 5))
    keys = client.keys("rc:{slots}:*")
    assert len(keys) > 10 and any(b":pq:" in k for k in keys) and any(b":fpd" in k for k in keys)
    me: Any = client  # (a ClusterClient)
    assert {me.keyslot(k) for k in keys} == {me.keyslot(CrawlKeys("slots").req)}


def test_server_settings_are_read_and_set_on_every_master(
    redis_cluster: LocalCluster, client: redis.Redis
) -> None:
    """The exact filter raises set-max-intset-entries (REDCRAWL_CONFIGURE_SERVER): on every
    master, since a crawl may live on any; a limit the masters disagree on reads as the
    smallest."""
    before = str(client.config_get("set-max-intset-entries")["set-max-intset-entries"])
    try:
        assert client.config_set("set-max-intset-entries", 4096)
        for m in redis_cluster.masters():
            with m.client() as mc:
                assert mc.config_get("set-max-intset-entries")["set-max-intset-entries"] == "4096"
        with redis_cluster.masters()[1].client() as mc:
            mc.config_set("set-max-intset-entries", 600)
        assert client.config_get("set-max-intset-entries")["set-max-intset-entries"] == "600"
    finally:
        client.config_set("set-max-intset-entries", before)
