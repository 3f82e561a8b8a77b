#!/usr/bin/env python
"""What one ``/metrics`` scrape costs Redis, at 10 and at 1,000,000 requests in the crawl.

Usage::

    python bench/bench_metrics.py [--n 1000000] [--scrapes 50] [--backend lists|streams]
                                  [--quick] [--json PATH]

One throw-away ``redis-server`` (persistence off). One crawl (lists with fleet-wide
politeness by default, its requests spread over 1,000 sites) with 5 live workers that
heartbeat with their counters (:mod:`redcrawl.scrapy.counters`). Measured first with 10
requests in the crawl, then after pushing up to ``--n`` (some leased, some acked), in the
same run: per scrape (``redcrawl.metrics.collector.render`` on one long-lived
``SnapshotReader``, as ``redcrawl serve`` does), the Redis commands it sent
(``INFO commandstats`` delta), the Redis server CPU (``INFO cpu`` delta) and the wall
time (median). The ratio big / small should be ~1: the scrape reads bounded keys only.
Two readers: the crawl given (``redcrawl exporter --crawl``) and the crawls found by a
SCAN over the stats keys (the default): that SCAN walks the whole keyspace (at most 50
calls of COUNT 1000), which grows with the sites a polite crawl has ready work for (two
keys per site), not with its requests. Then the Redis CPU a heartbeat's counters add:
``--beats`` plain heartbeats against as many carrying a full set of counters. Never a
non-zero exit status.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

from redcrawl.codec import Envelope
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.metrics.collector import render
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.redis_server import RedisServer
from redcrawl.scrapy.counters import WorkerCounters
from redcrawl.settings import Settings

WORKERS = 5
SITES = 1000


def commands(r: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in r.info("commandstats").values())


def cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def push(f: FrontierCore, start: int, stop: int) -> None:
    batch = 5000
    for at in range(start, stop, batch):
        urls = [f"http://s{i % SITES}.example/{i}" for i in range(at, min(stop, at + batch))]
        f.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls])


def beat(f: FrontierCore) -> None:
    for w in range(WORKERS):
        c = WorkerCounters()
        c.response(200, 5000, 0.3)
        f.renew_counting(f"w{w}", c, ttl=600)


def measure(r: redis.Redis, reader: SnapshotReader, scrapes: int) -> dict[str, float]:
    render(reader)  # frontiers opened (their layout read) once, as in a running exporter
    walls = []
    # INFO itself counts as a command: measured before and after, subtracted
    c0, cpu0 = commands(r), cpu(r)
    for _ in range(scrapes):
        t = time.perf_counter()
        render(reader)
        walls.append(time.perf_counter() - t)
    c1, cpu1 = commands(r), cpu(r)
    return {
        "commands": (c1 - c0 - 1) / scrapes,
        "redis_cpu_ms": 1000 * (cpu1 - cpu0) / scrapes,
        "wall_ms": 1000 * statistics.median(walls),
    }


def heartbeat_cost(r: redis.Redis, f: FrontierCore, beats: int) -> dict[str, float]:
    """Redis CPU (us) of one plain heartbeat and of one carrying a full set of counters
    (every error kind, every download bucket, items stored), over ``beats`` each."""

    def full() -> WorkerCounters:
        c = WorkerCounters(exceptions=lambda: 1)
        for status in (200, 404, 503):
            for latency in (0.01, 0.07, 0.2, 0.4, 0.9, 2, 4, 9, 20, 50, 99):
                c.response(status, 5000, latency)
        c.callback_error(True)
        c.item_error()
        c.item()
        c.stored(True)
        c.stored(False)
        return c

    cpu0 = cpu(r)
    for _ in range(beats):
        f.renew("hb", ttl=600)
    plain = cpu(r) - cpu0
    sets = [full() for _ in range(beats)]
    cpu0 = cpu(r)
    for c in sets:
        f.renew_counting("hb", c, ttl=600)
    counted = cpu(r) - cpu0
    return {"plain_us": 1e6 * plain / beats, "counted_us": 1e6 * counted / beats}


def ratio(small: dict[str, float], big: dict[str, float]) -> dict[str, float]:
    return {k: big[k] / small[k] if small[k] else float("nan") for k in small}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=None, help="requests in the big crawl (1000000)")
    p.add_argument("--scrapes", type=int, default=50)
    p.add_argument("--backend", choices=("lists", "streams"), default="lists")
    p.add_argument("--beats", type=int, default=2000, help="heartbeats timed (2000)")
    p.add_argument("--quick", action="store_true", help="N=100000 (unless --n is given)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    n = args.n if args.n is not None else 100_000 if args.quick else 1_000_000
    server = RedisServer()
    try:
        r = redis.Redis.from_url(server.url)
        f = open_frontier(r, Settings(backend=args.backend), "bench")
        given = SnapshotReader(r, Settings(), crawls=["bench"])
        found = SnapshotReader(r, Settings())
        push(f, 0, 10)
        f.ack(f.lease("w0", 2)[:1])
        beat(f)
        small, small_found = measure(r, given, args.scrapes), measure(r, found, args.scrapes)
        t = time.perf_counter()
        push(f, 10, n)
        for w in range(WORKERS):
            f.ack(f.lease(f"w{w}", 200)[:100])
        beat(f)
        filled = time.perf_counter() - t
        big, big_found = measure(r, given, args.scrapes), measure(r, found, args.scrapes)
        counts = f.counts()
        keys = int(r.dbsize())
        beats = heartbeat_cost(r, f, args.beats)
    finally:
        server.stop()
    out: dict[str, Any] = {
        "backend": args.backend,
        "politeness": f.politeness,
        "workers": WORKERS,
        "scrapes": args.scrapes,
        "keys_in_redis": keys,
        "heartbeat": beats,
        "given": {"small": small, "big": big, "ratio": ratio(small, big)},
        "found": {"small": small_found, "big": big_found, "ratio": ratio(small_found, big_found)},
    }
    print(
        f"backend {args.backend}, politeness {f.politeness}, {WORKERS} live workers, "
        f"{args.scrapes} scrapes each; filling to {counts.accepted:,} requests "
        f"({keys:,} keys in Redis) took {filled:.1f}s"
    )
    print(
        "| crawls | requests in the crawl | Redis commands / scrape | Redis CPU / scrape "
        "| wall / scrape |"
    )
    print("|---|---|---|---|---|")
    for mode, label in (("given", "given (--crawl)"), ("found", "found (SCAN)")):
        rows = out[mode]
        for name, row in (("10", rows["small"]), (f"{counts.accepted:,}", rows["big"])):
            print(
                f"| {label} | {name} | {row['commands']:.1f} | {row['redis_cpu_ms']:.3f} ms "
                f"| {row['wall_ms']:.2f} ms |"
            )
        print(
            f"| {label} | ratio | "
            + " | ".join(
                f"{rows['ratio'][k]:.2f}x" for k in ("commands", "redis_cpu_ms", "wall_ms")
            )
            + " |"
        )
    added = beats["counted_us"] - beats["plain_us"]
    print(
        f"heartbeat: {beats['plain_us']:.1f} us of Redis CPU plain, "
        f"{beats['counted_us']:.1f} us with a full set of counters: {added:.1f} us added per "
        "heartbeat, e.g. "
        + ", ".join(
            f"{added / pages:.3f} us per page at {pages} pages per heartbeat"
            for pages in (10, 100, 1000)
        )
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
