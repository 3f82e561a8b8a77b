"""A crawl of 16 partitions on a real Redis Cluster (3 masters, 3 replicas; tests/cluster.py):
the partitions spread over the masters, each partition's keys in one slot; the
conservation law summed over partitions (the state machine of
tests/test_frontier_properties.py, both backends); fair leasing; P fixed at creation; 3
worker processes of which one is SIGKILLed (tests/test_partitions.py's worker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from redcrawl.errors import LayoutMismatch
from redcrawl.frontier import PartitionedFrontier, open_frontier
from redcrawl.redis_server import LocalCluster
from redcrawl.settings import Settings

from .partition_helpers import envs, hosts_in, open_partitioned, run_machine
from .test_partitions import check_fair_leasing, run_kill_test

pytestmark = pytest.mark.cluster

P = 16


@pytest.fixture
def client(cluster_client: redis.Redis) -> redis.Redis:
    return cluster_client


def open_p(client: redis.Redis, crawl: str = "c", **settings: Any) -> PartitionedFrontier:
    return open_partitioned(client, P, crawl, **settings)


def test_partitions_spread_over_the_masters_each_in_one_slot(
    redis_cluster: LocalCluster, client: redis.Redis
) -> None:
    f = open_p(client)
    f.push(envs([h for p in range(P) for h in hosts_in(p, P, 1)], 5))
    f.ack(f.lease("w", 1))
    me: Any = client  # (a ClusterClient)
    masters = set()
    for sub in f.parts:
        keys = client.keys(f"rc:{{{sub.keys.tag}}}:*")
        assert len(keys) > 5 and any(b":pq:" in k for k in keys)
        slots = {me.keyslot(k) for k in keys}
        assert len(slots) == 1
        masters.add(me.get_node_from_key(keys[0]).name)
    assert len(masters) == 3  # 16 tags over 3 masters: every master has some
    assert f.counts().accepted == 5 * P


def test_the_partition_count_is_fixed_on_the_cluster(client: redis.Redis) -> None:
    open_p(client).push(envs(["a.example"], 1))
    with pytest.raises(LayoutMismatch, match="created with 16 partitions"):
        open_frontier(client, Settings(partitions=4), "c")
    with pytest.raises(LayoutMismatch):
        open_frontier(client, Settings(), "c")


@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_random_interleavings_with_sixteen_partitions_on_the_cluster(
    client: redis.Redis, backend: str
) -> None:
    run_machine(
        "ClusterPartitionedMachine", client, examples=10, steps=30, backend=backend, partitions=P
    )


def test_leases_follow_the_ready_work_on_the_cluster(client: redis.Redis) -> None:
    check_fair_leasing(open_p(client, politeness=False), 400, 40)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_sigkill_one_of_three_workers_of_a_partitioned_crawl_on_the_cluster(
    redis_cluster: LocalCluster, client: redis.Redis, tmp_path: Path, backend: str
) -> None:
    frontier = open_p(client, "kill", backend=backend)
    run_kill_test(redis_cluster.url, frontier, 3000, 3, tmp_path)
