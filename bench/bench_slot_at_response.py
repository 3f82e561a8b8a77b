#!/usr/bin/env python
"""Single-site crawl with a slow parse callback: what a politeness slot held to the ack costs.

Usage::

    python bench/bench_slot_at_response.py [--pages 40] [--site-delay 0.1] [--parse 0.1]
        [--parse-mode block|wait] [--concurrency 2] [--rounds 2]
        [--before /work/main/src] [--after src]

One loopback site (``tests/sitekit.py``, ``--pages`` pages answering in ``--site-delay``
seconds, every page linking to 3 others), one Scrapy worker (this file is also the
spider: ``scrapy runspider``), ``CONCURRENT_REQUESTS_PER_DOMAIN=--concurrency``, no
delay, a parse callback that takes ``--parse`` seconds: ``block`` (``time.sleep``: CPU
work, the reactor waits) or ``wait`` (an awaited timer: the reactor is free meanwhile).
Contenders, alternating by round on one throw-away ``redis-server``:

* ``off``: ``REDCRAWL_POLITENESS=off`` with ``--after``'s redcrawl: Scrapy's own
  per-process per-domain concurrency (its downloader frees a slot when the download ends);
* ``before``: fleet-wide politeness with ``--before``'s redcrawl (a slot held to the ack);
* ``after``: fleet-wide politeness with ``--after``'s redcrawl (the slot back when the
  response arrives).

Printed per contender: pages fetched, the span from the first to the last fetch start at
the site, pages per second over it, and the most requests in progress at the site.
A benchmark, not a test: no asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import scrapy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))


class SlowParseSpider(scrapy.Spider):
    """Follows every link; its callback takes ``parse`` seconds (``mode`` block/wait)."""

    name = "slowparse"

    def __init__(self, urls: str = "", parse: str = "0.1", mode: str = "block", **kw: Any):
        super().__init__(**kw)
        self.roots = [u for u in urls.split(",") if u]
        self.parse_time = float(parse)
        self.mode = mode

    async def start(self) -> AsyncIterator[Any]:
        for url in self.roots:
            yield scrapy.Request(url, callback=self.parse)

    async def parse(self, response: Any) -> Any:
        if self.mode == "block":
            time.sleep(self.parse_time)
        else:
            from scrapy.utils.defer import maybe_deferred_to_future
            from twisted.internet import reactor
            from twisted.internet.task import deferLater

            await maybe_deferred_to_future(deferLater(reactor, self.parse_time))  # type: ignore[arg-type]
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)


def crawl(
    name: str, src: str, polite: bool, args: argparse.Namespace, url: str, tmp: Path
) -> dict[str, Any]:
    from redcrawl.workers import worker_command
    from tests.sitekit import MultiSite, SiteSpec

    spec = SiteSpec(pages=args.pages, links=3, delay=args.site_delay)
    with MultiSite([spec]) as kit:
        cmd = worker_command(
            Path(__file__),
            settings=[
                "CONCURRENT_REQUESTS=16",
                f"CONCURRENT_REQUESTS_PER_DOMAIN={args.concurrency}",
                "DOWNLOAD_DELAY=0",
                "ROBOTSTXT_OBEY=False",
                "TELNETCONSOLE_ENABLED=False",
                "LOG_LEVEL=WARNING",
                f"REDCRAWL_POLITENESS={'on' if polite else 'off'}",
                "SCHEDULER_FLUSH_ON_START=True",
            ],
            spider_args={"urls": ",".join(kit.roots), "parse": args.parse, "mode": args.mode},
        )
        env = {
            **os.environ,
            "PYTHONPATH": src,
            "REDCRAWL_REDIS_URL": url,
            "REDCRAWL_CRAWL": f"bench-{name}-{time.monotonic_ns()}",
        }
        t0 = time.monotonic()
        out = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, timeout=600)
        wall = time.monotonic() - t0
        host = kit.hosts[0]
        starts = sorted(kit.starts(host, robots=False))
        fetched = len(kit.fetched(host))
        span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
        if out.returncode != 0:
            print(f"{name}: exit {out.returncode}: {out.stderr.decode()[-1500:]}")
        return {
            "fetched": fetched,
            "span": span,
            "rate": (len(starts) - 1) / span if span else 0.0,
            "max_in_progress": kit.max_in_progress(host),
            "wall": wall,
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--pages", type=int, default=40)
    p.add_argument("--site-delay", type=float, default=0.1)
    p.add_argument("--parse", type=float, default=0.1)
    p.add_argument("--mode", choices=("block", "wait"), default="block")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--before", default="/work/main/src")
    p.add_argument("--after", default=str(ROOT / "src"))
    args = p.parse_args()
    from bench_frontier import RedisServer, server_binary

    server = RedisServer(server_binary())
    contenders = [("off", args.after, False), ("before", args.before, True)]
    contenders.append(("after", args.after, True))
    results: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in contenders}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.rounds):
                for name, src, polite in contenders:
                    results[name].append(crawl(name, src, polite, args, server.url, Path(tmp)))
    finally:
        server.stop()
    print(
        f"1 site, {args.pages} pages answering in {args.site_delay}s, parse {args.parse}s "
        f"({args.mode}), CONCURRENT_REQUESTS_PER_DOMAIN={args.concurrency}, 1 worker, "
        f"{args.rounds} round(s): median"
    )
    print(f"{'':8} {'fetched':>8} {'span s':>8} {'pages/s':>8} {'max in prog':>12} {'wall s':>8}")
    for name, runs in results.items():

        def med(k: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(r[k] for r in runs)

        print(
            f"{name:8} {med('fetched'):8.0f} {med('span'):8.2f} {med('rate'):8.2f} "
            f"{med('max_in_progress'):12.0f} {med('wall'):8.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
