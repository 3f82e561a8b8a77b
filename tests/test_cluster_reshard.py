"""Resharding under a crawl (issue 15): while a worker runs its lease/settle loop on a
crawl (the tree of tests/test_cluster_failover.py: request ``i`` pushes ``2i+1`` and
``2i+2`` in the settle that acknowledges it), ``redis-cli --cluster reshard`` moves the
crawl's slot to another master, and later back. Keys move one by one (``MIGRATE``);
meanwhile a multi-key script finds some of its keys gone (``ASK``, or ``TRYAGAIN`` when
they are split), and afterwards every command is ``MOVED``. The client waits and retries
(:class:`redcrawl.cluster.ClusterClient`; a retried script replays its first outcome by
its nonce). Counted: nothing lost, nothing processed twice (no lease expires: the worker
is alive throughout), the conservation law, and the crawl finished.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from redis.crc import key_slot

from redcrawl.connection import connect
from redcrawl.frontier import open_frontier
from redcrawl.keys import CrawlKeys, partition_of
from redcrawl.redis_server import LocalCluster, RedisServer
from redcrawl.settings import Settings

from . import cluster
from .test_cluster_failover import N, _env, tree_worker

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SITE = "site"
"""The host of every request of the tree (tests/test_cluster_failover.py's ``_env``)."""
NEAR = 16
"""The crawl's slot is among the first NEAR slots (``redis-cli --cluster create`` gives
slots 0-5460 to the first master): a reshard of that many slots, which takes a source's
slots from its lowest, moves it to another master, and the same reshard from there moves
it back (they are then that master's lowest slots too)."""


def crawl_near_slot_zero(partitions: int) -> tuple[str, int]:
    """A crawl name whose keys' slot (with partitions: the slot of the partition of the
    crawl's one site) is below NEAR, and how many slots a reshard must move to take it
    along."""
    for i in range(100_000):
        name = f"reshard-{i}"
        tag = name if partitions == 1 else f"{name}/{partition_of(SITE, partitions)}"
        slot = key_slot(f"{{{tag}}}".encode())
        if slot < NEAR:
            return name, slot + 1
    raise AssertionError("no crawl name found")


def node_id(node: RedisServer) -> str:
    with node.client() as c:
        return str(c.execute_command("CLUSTER", "MYID").decode())


def reshard(local: LocalCluster, source: RedisServer, target: RedisServer, slots: int) -> None:
    """``redis-cli --cluster reshard``: ``slots`` slots from the start of ``source``'s
    range to ``target``, keys migrated in pipelines of 10."""
    subprocess.run(
        [
            local.cli,
            "--cluster",
            "reshard",
            f"127.0.0.1:{source.port}",
            "--cluster-from",
            node_id(source),
            "--cluster-to",
            node_id(target),
            "--cluster-slots",
            str(slots),
            "--cluster-pipeline",
            "10",
            "--cluster-yes",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "backend,pipelined,partitions",
    [("lists", False, 1), ("streams", False, 1), ("lists", True, 1), ("lists", False, 4)],
)
def test_the_crawls_slot_moves_to_another_master_and_back(
    tmp_path: Path, backend: str, pipelined: bool, partitions: int
) -> None:
    """``pipelined``: the settles go through ``settle_begin`` (the Scrapy scheduler's way:
    a raw connection to the crawl's master, which stops serving the slot). With 4
    partitions, the slot of the partition holding the crawl's site moves."""
    crawl, slots = crawl_near_slot_zero(partitions)
    with cluster.start(tmp_path / "cluster") as local:
        settings = Settings(
            redis_url=local.url,
            backend=backend,  # type: ignore[arg-type]
            politeness=False,
            lease_ttl=30.0,
            partitions=partitions,
        )
        client = connect(settings)
        frontier = open_frontier(client, settings, crawl)
        frontier.push([_env(0)])
        processed: Counter[int] = Counter()
        errors: list[BaseException] = []

        def wait_for(done: int) -> None:
            deadline = time.monotonic() + 90
            while sum(processed.values()) < done:
                assert worker.is_alive() and time.monotonic() < deadline, errors
                time.sleep(0.005)

        worker = threading.Thread(
            target=tree_worker,
            args=(frontier, pipelined, processed, errors),
            kwargs={"work": 0.004},
        )
        worker.start()
        moving = (
            frontier.keys
            if partitions == 1
            else CrawlKeys(crawl, partition=partition_of(SITE, partitions))
        )
        home = local.master_of(moving.req)
        away = next(m for m in local.masters() if m.port != home.port)
        wait_for(N // 4)
        assert client.hlen(moving.req) > 0  # the crawl's requests are on the moving slot
        moved_at = sum(processed.values())
        reshard(local, home, away, slots)
        assert local.master_of(moving.req).port == away.port
        wait_for(moved_at + N // 4)
        back_at = sum(processed.values())
        reshard(local, away, home, slots)  # (the slots it got are the first of its range)
        assert local.master_of(moving.req).port == home.port
        worker.join(120)
        assert not errors, errors
        assert not worker.is_alive(), "the worker did not finish"
        c = frontier.counts()
        lost = [i for i in range(N) if processed[i] == 0]
        repeated = sum(n - 1 for n in processed.values() if n > 1)
        print(
            f"\nreshard ({backend}{', pipelined' if pipelined else ''}, P={partitions}): slot "
            f"moved after "
            f"{moved_at} processings, back after {back_at}; lost {len(lost)}, repeated "
            f"{repeated}; counts after: {c}"
        )
        assert c.finished and c.conserved, c
        assert not lost, f"never processed: {lost[:10]}"
        assert repeated == 0, "fetched twice without a lease expiring"
        assert c.done == N, c
        client.close()


def test_a_script_whose_keys_are_split_by_a_slow_migration_waits_for_it(
    tmp_path: Path,
) -> None:
    """A migration that leaves a crawl's keys split between two masters for longer than
    redis-py's own redirect budget (16 tries, ~0.4 s of TRYAGAIN): redis-py then raises
    ``ClusterError('TTL exhausted.')``, not ``TryAgainError``. That is the cluster
    reconfiguring, not a failed command: the frontier's call waits (its nonce makes a
    retry safe) and runs once the slot has moved. Under CI load a real reshard was
    seen to take that long and fail a worker."""
    crawl, _ = crawl_near_slot_zero(1)
    with cluster.start(tmp_path / "cluster") as local:
        settings = Settings(redis_url=local.url, politeness=False, lease_ttl=30.0)
        client = connect(settings)
        frontier = open_frontier(client, settings, crawl)
        assert frontier.push([_env(i) for i in range(5)]).accepted == 5
        keys = frontier.keys
        slot = key_slot(keys.req.encode())
        source = local.master_of(keys.req)
        target = next(m for m in local.masters() if m.port != source.port)
        src_id, tgt_id = node_id(source), node_id(target)
        with source.client() as s, target.client() as t:
            t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", tgt_id)
            # the stats hash moves first: a lease (which reads req and stats) is TRYAGAIN
            s.execute_command("MIGRATE", "127.0.0.1", target.port, keys.stats, 0, 5000)

            def finish() -> None:
                time.sleep(2.0)
                while names := s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                    for name in names:
                        s.execute_command("MIGRATE", "127.0.0.1", target.port, name, 0, 5000)
                for node in local.masters():
                    with node.client() as c:
                        c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", tgt_id)

            mover = threading.Thread(target=finish)
            mover.start()
            try:
                leases = frontier.lease("w1", 5)
            finally:
                mover.join(30)
        assert sorted(lease.envelope.url for lease in leases) == sorted(
            _env(i).url for i in range(5)
        )
        assert local.master_of(keys.req).port == target.port
        frontier.ack(leases)
        c = frontier.counts()
        assert c.done == 5 and c.conserved
        client.close()
