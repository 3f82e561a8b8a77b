"""Time and memory of ``redcrawl migrate --to URL --partitions P`` (docs/cluster.md,
"Moving a crawl"): a stopped crawl of N requests over S sites on one Redis (20% done,
1% in flight under expired leases, the rest ready), copied keeping one partition (the
reference, DUMP/RESTORE), then re-homed into P partitions on another server and on a
throwaway 3-master cluster. Prints seconds, requests per second, the target's memory and
the DONE filter's memory before and after.

    PYTHONPATH=src python bench/bench_rehome.py [--requests 100000] [--sites 1000]
        [--partitions 16] [--backend lists|streams] [--dedupe exact|bloom]
        [--capacity N]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.frontier import open_frontier
from redcrawl.migrate_to import copy_crawl
from redcrawl.redis_server import LocalCluster, RedisServer
from redcrawl.settings import Settings

CRAWL = "bench"


def used(client: Any) -> int:
    """Bytes of memory in use, summed over a cluster's masters."""
    if hasattr(client, "nodes_manager"):
        infos = client.info("memory", target_nodes=client.PRIMARIES)
        return sum(int(i["used_memory"]) for i in infos.values())
    return int(client.info("memory")["used_memory"])


def build(client: Any, s: Settings, n: int, sites: int) -> None:
    f = open_frontier(client, s, CRAWL)
    envs = [
        Envelope(
            url=f"http://site{i % sites}.test/p{i}",
            fingerprint=hashlib.sha1(b"%d" % i).digest(),
        )
        for i in range(n)
    ]
    for i in range(0, n, 5000):
        f.push(envs[i : i + 5000])
    done = 0
    while done < n // 5:
        got = f.lease("w1", 500)
        f.ack(got)
        done += len(got)
    f.forget_worker("w1")
    f.lease("w2", n // 100, ttl=0.5)
    time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--sites", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--backend", default="lists")
    ap.add_argument("--dedupe", default="exact")
    ap.add_argument("--capacity", type=int, default=None, help="REDCRAWL_DEDUPE_CAPACITY")
    a = ap.parse_args()
    s = Settings(backend=a.backend, politeness=True, dedupe=a.dedupe, bloom_backend="lua")
    if a.capacity:
        s = s.replace(dedupe_capacity=a.capacity)
    with RedisServer() as one, RedisServer() as two:
        src = one.client()
        build(src, s, a.requests, a.sites)
        f = open_frontier(src, s, CRAWL, follow_layout=True)
        c = f.counts()
        fpd = f.done.memory()
        print(f"source: {c}")
        print(f"source memory {used(src) / 1e6:.1f} MB, DONE filter {fpd / 1e6:.2f} MB")
        dst = two.client()
        base = used(dst)
        for label, p in (("copy, 1 partition", None), (f"re-home, {a.partitions}", a.partitions)):
            dst.flushall()
            t = time.perf_counter()
            r = copy_crawl(src, dst, s, CRAWL, partitions=p)
            dt = time.perf_counter() - t
            copy = open_frontier(dst, s, CRAWL, follow_layout=True)
            print(
                f"{label} (one server): {dt:.2f} s, {a.requests / dt:,.0f} requests/s, "
                f"target {(used(dst) - base) / 1e6:.1f} MB, DONE filter "
                f"{copy.done.memory() / 1e6:.2f} MB, in flight back {r.returned}"
            )
        cluster = LocalCluster(masters=3, replicas=0)
        try:
            cc = connect(s, url=cluster.url)
            base = used(cc)
            t = time.perf_counter()
            copy_crawl(src, cc, s, CRAWL, partitions=a.partitions)
            dt = time.perf_counter() - t
            copy = open_frontier(cc, s, CRAWL, follow_layout=True)
            infos = cc.info("memory", target_nodes=cc.PRIMARIES)
            per = ", ".join(f"{int(i['used_memory']) / 1e6:.1f}" for i in infos.values())
            print(
                f"re-home, {a.partitions} (3-master cluster): {dt:.2f} s, "
                f"{a.requests / dt:,.0f} requests/s, target {(used(cc) - base) / 1e6:.1f} MB "
                f"(per master {per} MB), DONE filter {copy.done.memory() / 1e6:.2f} MB, "
                f"counts {copy.counts()}"
            )
            cc.close()
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
