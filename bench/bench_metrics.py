#!/usr/bin/env python
"""What reading a fleet's state costs Redis: one ``/metrics`` scrape, one frame of
``redcrawl top`` and one dashboard page, at 10 thousand and at 10 million done URLs.

Usage::

    python bench/bench_metrics.py [--done 10000000] [--crawls 10] [--workers 100]
                                  [--reads 20] [--quick] [--json PATH]

One throw-away ``redis-server`` (persistence off). ``--crawls`` crawls (lists with
fleet-wide politeness, the default layout), ``--workers`` live workers spread over them
(each heartbeats with a set of counters, :mod:`redcrawl.scrapy.counters`), every crawl
with requests ready over 100 sites and requests in flight. Measured twice in the same
run, the state otherwise the same:

* **small**: 10,000 done URLs in all, each pushed, leased and acked through the frontier;
* **big**: ``--done`` done URLs in all. The rest are loaded fast, not crawled: each
  crawl's done filter gets its share of fingerprints through the frontier's own filter
  (``FrontierCore.done.add``: the dedupe Lua the ack step runs, 10,000 fingerprints per
  call) and the crawl's ``accepted`` and ``done`` counters are raised by as many
  (``HINCRBY`` on the stats hash), so the conservation law holds and the crawl looks as it
  would after acking them. (A done request keeps nothing else in Redis: its record is
  deleted by the ack.)

Per read, medians over ``--reads``: the Redis commands it sent (``INFO commandstats``
delta), the Redis server CPU (``INFO cpu`` delta; the ``INFO`` calls themselves are
left out of the commands, not of the CPU) and the wall time. Four reads:

* ``scrape (given)``: ``redcrawl.metrics.collector.render`` on one long-lived
  ``SnapshotReader`` of the crawls given (``redcrawl exporter --crawl``; ``redcrawl serve``
  reads the crawls found);
* ``scrape (found)``: the same, crawls found by the bounded SCAN over the keyspace;
* ``top frame``: one frame of ``redcrawl top`` of one crawl, its hosts panel read at
  every frame (the real ``top`` reads it every 5 s);
* ``dashboard page``: ``GET /crawls/<crawl>`` of ``redcrawl serve`` (through Starlette's
  TestClient, no network; its history sample included).

The ratio big / small should be ~1 for each: they read bounded, pre-aggregated keys.
Then the Redis CPU a heartbeat's counters add: ``--beats`` plain heartbeats against as
many carrying a full set of counters, and the Redis CPU per page of the frontier's own
work (push, lease and ack of 20,000 requests in batches of 100, as the scheduler sends
them) measured in the same run, as the reference. Never a non-zero exit status.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from redcrawl.codec import Envelope
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.metrics.collector import render
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.metrics.top import Top
from redcrawl.redis_server import RedisServer
from redcrawl.scrapy.counters import WorkerCounters
from redcrawl.settings import Settings

SITES = 100
SMALL_DONE = 10_000
READY = 2_000
"""Requests left ready in each crawl (over SITES sites)."""
HELD = 50
"""Requests each crawl's first worker holds (in flight)."""
CRAWL_PAGE_REF_US = (66.0, 61.0)
"""Redis CPU per page of ``bench/bench_crawl.py`` (redcrawl, 1 / 2 workers; README)."""


def commands(r: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in r.info("commandstats").values())


def usec(r: redis.Redis) -> dict[str, float]:
    """Redis's own time per command (``INFO commandstats`` usec), by command."""
    return {k.removeprefix("cmdstat_"): float(v["usec"]) for k, v in r.info("commandstats").items()}


def cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def envelopes(crawl: str, start: int, stop: int) -> list[Envelope]:
    urls = [f"http://s{i % SITES}.{crawl}.example/{i}" for i in range(start, stop)]
    return [Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls]


def crawl_to_done(f: FrontierCore, n: int) -> None:
    """Push ``n`` requests and lease and ack them all (real frontier steps)."""
    for at in range(0, n, 1000):
        f.push(envelopes(f.crawl, at, min(n, at + 1000)))
    done = 0
    while done < n:
        leased = f.lease("filler", min(500, n - done))
        if not leased:
            raise RuntimeError(f"{f.crawl}: nothing to lease at {done} of {n} done")
        f.ack(leased)
        done += len(leased)


def counters() -> WorkerCounters:
    """What a worker counted over one heartbeat interval (a typical set)."""
    c = WorkerCounters()
    for i in range(50):
        c.response(200 if i % 10 else 404, 5000, 0.05 + i / 100)
        c.item()
    return c


def beat(fs: list[FrontierCore], workers: int) -> None:
    for w in range(workers):
        fs[w % len(fs)].renew_counting(f"w{w}", counters(), ttl=600)


def measure(r: redis.Redis, read: Callable[[], Any], reads: int) -> dict[str, Any]:
    read()  # frontiers opened (their layout read) once, as in a running process
    walls, cmds, cpus = [], [], []
    by_command = usec(r)
    for _ in range(reads):
        c0, cpu0 = commands(r), cpu(r)
        t = time.perf_counter()
        read()
        walls.append(time.perf_counter() - t)
        # the INFO commandstats after the read is counted by Redis before it answers
        cmds.append(commands(r) - c0 - 2)
        cpus.append(cpu(r) - cpu0)
    after = usec(r)
    spent = {k: (v - by_command.get(k, 0.0)) / reads for k, v in after.items()}
    spent.pop("info", None)
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:4]
    return {
        "top_commands_us": {k: round(v, 1) for k, v in top},
        "commands": statistics.median(cmds),
        "redis_cpu_ms": 1000 * statistics.median(cpus),
        "wall_ms": 1000 * statistics.median(walls),
    }


def load_done(f: FrontierCore, n: int, seed: int) -> None:
    """``n`` more done URLs in ``f``'s crawl, loaded fast (module docstring)."""
    batch = 10_000
    for at in range(0, n, batch):
        fps = [hashlib.sha1(f"{seed}/{i}".encode()).digest() for i in range(at, min(n, at + batch))]
        f.done.add(fps)
    pipe = f.client.pipeline(transaction=True)
    pipe.hincrby(f.keys.stats, "accepted", n)
    pipe.hincrby(f.keys.stats, "done", n)
    pipe.execute()


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
        c.robots_disallowed()
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


def frontier_cost(r: redis.Redis, f: FrontierCore, n: int) -> float:
    """Redis CPU (us) per request of push + lease + ack, batches of 100."""
    cpu0 = cpu(r)
    for at in range(0, n, 100):
        f.push(envelopes("ref", at, at + 100))
    done = 0
    while done < n:
        leased = f.lease("ref", 100)
        if not leased:
            break
        f.ack(leased)
        done += len(leased)
    return 1e6 * (cpu(r) - cpu0) / max(done, 1)


def ratio(small: dict[str, Any], big: dict[str, Any]) -> dict[str, float]:
    return {
        k: big[k] / small[k] if small[k] else float("nan")
        for k in ("commands", "redis_cpu_ms", "wall_ms")
    }


def dashboard(url: str, crawl: str) -> Callable[[], Any]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette's note on httpx
        from fastapi.testclient import TestClient

    from redcrawl.api import create_app

    settings = Settings(redis_url=url)
    app = create_app(settings, redis.Redis.from_url(url))
    client = TestClient(app, base_url="http://127.0.0.1:8700")
    client.get("/")  # its session cookie (an open API: loopback, no tokens)

    def page() -> Any:
        got = client.get(f"/crawls/{crawl}", params={"refresh": "0"})
        if got.status_code != 200:
            raise RuntimeError(f"dashboard answered {got.status_code}: {got.text[:200]}")
        return got

    return page


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--done", type=int, default=None, help="done URLs in all (10,000,000)")
    p.add_argument("--crawls", type=int, default=10)
    p.add_argument("--workers", type=int, default=100, help="live workers in all")
    p.add_argument("--reads", type=int, default=20, help="reads measured per kind (20)")
    p.add_argument("--beats", type=int, default=2000, help="heartbeats timed (2000)")
    p.add_argument("--quick", action="store_true", help="--done 1000000 (unless given)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    total = args.done if args.done is not None else 1_000_000 if args.quick else 10_000_000
    total = max(total, SMALL_DONE)
    server = RedisServer()
    try:
        r = redis.Redis.from_url(server.url)
        settings = Settings(redis_url=server.url)
        names = [f"bench{i}" for i in range(args.crawls)]
        fs = [open_frontier(r, settings, n) for n in names]
        t = time.perf_counter()
        for f in fs:
            crawl_to_done(f, SMALL_DONE // args.crawls)
            f.push(envelopes(f.crawl, 10**9, 10**9 + READY))
            f.lease("w0", HELD)
        beat(fs, args.workers)
        built_small = time.perf_counter() - t
        given = SnapshotReader(r, settings, crawls=names)
        found = SnapshotReader(r, settings)
        top = Top(SnapshotReader(r, settings, crawls=[names[0]]), names[0], hosts_every=0)
        page = dashboard(server.url, names[0])
        reads: dict[str, Callable[[], Any]] = {
            "scrape (given)": lambda: render(given),
            "scrape (found)": lambda: render(found),
            "top frame": top.frame,
            "dashboard page": page,
        }
        small = {k: measure(r, fn, args.reads) for k, fn in reads.items()}
        seen_small = len(found.find_crawls()[0])
        t = time.perf_counter()
        share = (total - SMALL_DONE) // args.crawls
        for i, f in enumerate(fs):
            load_done(f, share, i)
        beat(fs, args.workers)
        built_big = time.perf_counter() - t
        big = {k: measure(r, fn, args.reads) for k, fn in reads.items()}
        seen_big = len(found.find_crawls()[0])
        done = sum(f.counts().done for f in fs)
        keys = int(r.dbsize())
        memory = int(r.info("memory")["used_memory"])
        beats = heartbeat_cost(r, fs[0], args.beats)
        per_page = frontier_cost(r, open_frontier(r, settings, "ref"), 20_000)
    finally:
        server.stop()
    added = beats["counted_us"] - beats["plain_us"]
    out: dict[str, Any] = {
        "crawls": args.crawls,
        "workers": args.workers,
        "done": {"small": SMALL_DONE, "big": done},
        "keys_in_redis": keys,
        "used_memory": memory,
        "build_seconds": {"small": built_small, "big": built_big},
        "crawls_found_by_scan": {"small": seen_small, "big": seen_big},
        "reads": {
            k: {"small": small[k], "big": big[k], "ratio": ratio(small[k], big[k])} for k in reads
        },
        "heartbeat": beats,
        "frontier_redis_cpu_us_per_page": per_page,
    }
    print(
        f"{args.crawls} crawls (lists, politeness), {args.workers} live workers, {args.reads} "
        f"reads each; small: {SMALL_DONE:,} done (crawled, {built_small:.1f}s); big: "
        f"{done:,} done (loaded, {built_big:.1f}s; {keys:,} keys, "
        f"{memory / 2**20:,.0f} MiB in Redis); the SCAN found {seen_small} / {seen_big} "
        "crawls"
    )
    print("| read | done URLs | Redis commands | Redis CPU | wall |")
    print("|---|---|---|---|---|")
    for k in reads:
        for label, row in ((f"{SMALL_DONE:,}", small[k]), (f"{done:,}", big[k])):
            print(
                f"| {k} | {label} | {row['commands']:.0f} | {row['redis_cpu_ms']:.2f} ms "
                f"| {row['wall_ms']:.1f} ms |"
            )
        for label, row in ((f"{SMALL_DONE:,}", small[k]), (f"{done:,}", big[k])):
            spent = ", ".join(f"{c} {us:g}" for c, us in row["top_commands_us"].items())
            print(f"|   | Redis time by command at {label} (us / read): {spent} | | | |")
        rt = out["reads"][k]["ratio"]
        print(
            f"| {k} | ratio | {rt['commands']:.2f}x | {rt['redis_cpu_ms']:.2f}x "
            f"| {rt['wall_ms']:.2f}x |"
        )
    print(
        f"heartbeat: {beats['plain_us']:.1f} us of Redis CPU plain, {beats['counted_us']:.1f} "
        f"us with a full set of counters: {added:.1f} us added per heartbeat"
    )
    print(
        f"Redis CPU per page: frontier push+lease+ack in this run {per_page:.1f} us; "
        f"bench_crawl.py (README) {CRAWL_PAGE_REF_US[0]:g} / {CRAWL_PAGE_REF_US[1]:g} us"
    )
    for pages in (10, 100, 1000):
        print(
            f"  at {pages} pages per heartbeat: {added / pages:.3f} us per page = "
            f"{100 * added / pages / CRAWL_PAGE_REF_US[1]:.2f}% of bench_crawl's "
            f"{CRAWL_PAGE_REF_US[1]:g} us, {100 * added / pages / per_page:.2f}% of the "
            "frontier's"
        )
    print(
        f"  under 5% of bench_crawl's from {added / (0.05 * CRAWL_PAGE_REF_US[1]):.0f} pages per "
        f"heartbeat, of the frontier's from {added / (0.05 * per_page):.0f}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
