#!/usr/bin/env python
"""What ``REDCRAWL_WAIT_REPLICAS=1`` costs on a Redis Cluster (3 masters, 3 replicas on
loopback, ``redcrawl.redis_server.LocalCluster``, started here and killed at the end).

Usage::

    python bench/bench_wait_replicas.py [--n 20000] [--rounds 3] [--batch 100]

Per setting (WAIT 0 and 1, alternating within each round, ``FLUSHALL`` between), on one
crawl (one master and its replica):

* **push (req/s)**: N requests pushed in ``settle`` calls of ``batch``;
* **lease+ack (req/s)**: every request leased and acked by ``settle`` calls (ack the
  previous batch, lease the next), one at a time (``settle``);
* **lease+ack pipelined (req/s)**: the same with ``settle_begin``, two calls on their way
  (the Scrapy scheduler's default);
* **call latency (ms)**: median of 500 one-request pushes.

The ratio WAIT 1 / WAIT 0 is the cost. On loopback a replica acknowledges within
microseconds; across machines each waited call adds about one round trip from master
to replica (the replica acknowledges its offset at once when asked: WAIT sends it
``REPLCONF GETACK``). A benchmark, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections import deque
from typing import Any

from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.frontier import open_frontier
from redcrawl.redis_server import LocalCluster
from redcrawl.settings import Settings


def _envs(n: int, start: int = 0) -> list[Envelope]:
    return [
        Envelope(url=f"http://site{i % 50}/{i}", fingerprint=hashlib.sha1(b"%d" % i).digest())
        for i in range(start, start + n)
    ]


def one_round(local: LocalCluster, wait: int, n: int, batch: int) -> dict[str, float]:
    settings = Settings(redis_url=local.url, wait_replicas=wait, politeness=False, batch_size=batch)
    client = connect(settings)
    client.flushall()
    out: dict[str, float] = {}
    envs = _envs(n)
    for mode in ("plain", "pipelined"):
        client.flushall()
        f = open_frontier(client, settings, f"bench{wait}")
        t = time.perf_counter()
        for i in range(0, n, batch):
            f.settle(push=envs[i : i + batch])
        if mode == "plain":
            out["push"] = n / (time.perf_counter() - t)
        t = time.perf_counter()
        done = 0
        if mode == "plain":
            held = f.lease("w", batch)
            while held:
                done += len(held)
                held = f.settle(ack=held, lease=("w", batch)).leases
        else:
            batches = deque([f.lease("w", batch), f.lease("w", batch)])
            pending: deque[Any] = deque()
            while batches or pending:
                while batches:  # every batch in hand acked, and one more leased
                    got = batches.popleft()
                    if got:
                        done += len(got)
                        pending.append(f.settle_begin(ack=got, lease=("w", batch)))
                if pending:  # two calls on their way: wait for the oldest
                    got = pending.popleft().result().leases
                    if got:
                        batches.append(got)
        assert done == n and f.counts().done == n, (done, f.counts())
        out["lease+ack" if mode == "plain" else "lease+ack pipelined"] = n / (
            time.perf_counter() - t
        )
    client.flushall()
    f = open_frontier(client, settings, f"lat{wait}")
    lat = []
    for env in _envs(500, n):
        t = time.perf_counter()
        f.push([env])
        lat.append(time.perf_counter() - t)
    out["call latency ms"] = statistics.median(lat) * 1000
    if f.replica_wait is not None:
        out["short"] = f.replica_wait.short
    client.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=100)
    a = p.parse_args()
    results: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    with LocalCluster(masters=3, replicas=1, node_timeout=2000) as local:
        for r in range(a.rounds):
            for wait in (0, 1) if r % 2 == 0 else (1, 0):
                results[wait].append(one_round(local, wait, a.n, a.batch))
    print(
        f"REDCRAWL_WAIT_REPLICAS on a loopback cluster (3 masters + 3 replicas), "
        f"N={a.n}, batch {a.batch}, median of {a.rounds} rounds"
    )
    print(f"{'':24}{'WAIT 0':>12}{'WAIT 1':>12}{'1 / 0':>8}")
    for key in ("push", "lease+ack", "lease+ack pipelined", "call latency ms"):
        w0 = statistics.median(x[key] for x in results[0])
        w1 = statistics.median(x[key] for x in results[1])
        unit = "" if "ms" in key else " req/s"
        print(f"{key + unit:<24}{w0:>12.1f}{w1:>12.1f}{w1 / w0:>8.2f}")
    short = sum(x.get("short", 0) for x in results[1])
    print(f"calls whose WAIT saw no replica in time: {short:.0f}")


if __name__ == "__main__":
    main()
