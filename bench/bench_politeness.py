#!/usr/bin/env python
"""Politeness benchmark: per-site limits as the sites see them, scrapy-redis vs redcrawl.

Usage::

    python bench/bench_politeness.py [--hosts 12] [--pages 20] [--workers 3]
                                     [--concurrency 2] [--delay 0.2] [--site-delay 0.3]
                                     [--rounds 1] [--json PATH]

The same multi-site crawl, run in one session on one throw-away ``redis-server`` (see
``bench_frontier.py``), ``FLUSHALL`` between runs, contenders alternating by round:
``--hosts`` loopback sites (``tests/sitekit.py``: 127.0.0.2, 127.0.0.3, ..., each
answering in ``--site-delay`` seconds, ``--pages`` pages each, every root linking to
every other), crawled by ``--workers`` real ``scrapy runspider tests/sitekit.py``
processes sharing one crawl, with Scrapy's own per-site settings
``CONCURRENT_REQUESTS_PER_DOMAIN=--concurrency``, ``DOWNLOAD_DELAY=--delay`` and
``RANDOMIZE_DOWNLOAD_DELAY=False``:

1. scrapy-redis 0.9.1 (``Scheduler`` + ``RFPDupeFilter``, ``SCHEDULER_PERSIST``);
2. redcrawl (its ``Scheduler`` and ``DupeFilter``).

The sites record every fetch start and the requests in progress; printed per host and
over all hosts: the most requests in progress at once against the limit, the smallest
gap between two fetch starts against the delay, and the achieved fetch rate against
``1 / delay``, with ratios (``over limit`` = max in progress / concurrency; ``too close``
= delay / min gap). Each scrapy-redis process holds the limits for itself, so N workers
are expected near N times over; redcrawl's frontier enforces them for the fleet (lists
backend, ``REDCRAWL_POLITENESS`` on), so its columns should read 1.0x.

``--frontier`` measures the frontier alone instead (no Scrapy, no sites): ``--n``
requests spread over ``--keys`` hosts are pushed, then leased and acked by one client in
``settle`` round trips of 64 (ack the previous batch, lease the next) with politeness on
(no delay, concurrency 8 per host) and off, alternating by round on the same server;
printed: lease+ack throughput of each, the ratio on/off, Redis's and the clients' CPU per
request, the time inside the scripts per request split into the Redis commands they ran
and the Lua around them (``INFO commandstats``), and Redis memory per host key with ready
work (politeness on minus off, after the push, divided by ``--keys``).

``--frontier --instructions`` runs the same workload (``--n`` defaults to 10,000 over 1,000
hosts then) with one client against ``/usr/bin/redis-server`` under valgrind's callgrind:
Redis instructions per lease+ack and the commands per lease+ack (``INFO commandstats``,
the commands inside the scripts included), politeness on and off. Instruction counts do
not move with the machine's load (two runs agree within ~2%): use them for an A/B of a
Lua change (``PYTHONPATH`` pointing at the two checkouts). ``--only on`` (or ``off``)
measures one side (the other runs none of ``polite.lua``); ``--keep PREFIX`` keeps each
callgrind dump as ``PREFIX.on`` / ``PREFIX.off`` for ``callgrind_annotate``.

A benchmark, not a test: no asserts, exit status 0 when it ran to the end.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from bench_frontier import (
    RedisServer,
    _on_signal,
    command_stats,
    environment,
    flushall,
    redis_cpu,
    server_binary,
    stats_delta,
    used_memory,
    worker_env,
    write_json,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # tests.sitekit: the multi-site server and its spider

from redcrawl.workers import worker_command  # noqa: E402
from tests.sitekit import SITEKIT_FILE, MultiSite, SiteSpec  # noqa: E402

SR = "scrapy-redis"
RC = "redcrawl"
CONTENDERS = (SR, RC)
CLOCK_TOLERANCE = 0.05
"""Seconds: a gap this much under the delay still counts as kept (as in
tests/test_politeness_fleet.py)."""
SR_IDLE_GRACE = 2.0
"""SiteKitSpider's idle_grace for scrapy-redis (see its docstring)."""


def settings(
    contender: str, redis_url: str, crawl: str, concurrency: int, delay: float
) -> list[str]:
    common = [
        "CONCURRENT_REQUESTS=16",
        f"CONCURRENT_REQUESTS_PER_DOMAIN={concurrency}",
        f"DOWNLOAD_DELAY={delay}",
        "RANDOMIZE_DOWNLOAD_DELAY=False",
        "ROBOTSTXT_OBEY=False",
        "AUTOTHROTTLE_ENABLED=False",
        "RETRY_ENABLED=False",
        "COOKIES_ENABLED=False",
        "TELNETCONSOLE_ENABLED=False",
        "LOG_LEVEL=WARNING",
    ]
    if contender == SR:
        return [
            *common,
            "SCHEDULER=scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS=scrapy_redis.dupefilter.RFPDupeFilter",
            "SCHEDULER_PERSIST=True",
            f"REDIS_URL={redis_url}",
        ]
    return [
        *common,
        f"REDCRAWL_REDIS_URL={redis_url}",
        f"REDCRAWL_CRAWL={crawl}",
        "REDCRAWL_IDLE_BEFORE_CLOSE=0.5",
    ]


@dataclass(slots=True)
class Host:
    host: str
    fetches: int
    max_in_progress: int
    min_gap: float | None
    median_gap: float | None
    rate: float | None  # fetches per second over the host's first->last fetch
    close_share: float  # share of gaps shorter than the delay (minus tolerance)


@dataclass(slots=True)
class Run:
    contender: str
    workers: int
    seconds: float
    hosts: list[Host]
    missing: int
    failures: list[str] = field(default_factory=list)

    @property
    def max_in_progress(self) -> int:
        return max((h.max_in_progress for h in self.hosts), default=0)

    @property
    def min_gap(self) -> float | None:
        gaps = [h.min_gap for h in self.hosts if h.min_gap is not None]
        return min(gaps) if gaps else None

    @property
    def close_share(self) -> float:
        gaps = sum(max(h.fetches - 1, 0) for h in self.hosts)
        close = sum(h.close_share * max(h.fetches - 1, 0) for h in self.hosts)
        return close / gaps if gaps else 0.0

    @property
    def median_rate(self) -> float | None:
        rates = [h.rate for h in self.hosts if h.rate is not None]
        return statistics.median(rates) if rates else None

    @property
    def rate_range(self) -> tuple[float, float] | None:
        """The lowest and highest per-host fetch rate."""
        rates = [h.rate for h in self.hosts if h.rate is not None]
        return (min(rates), max(rates)) if rates else None

    @property
    def total_rate(self) -> float | None:
        """The per-host rates summed: the fleet's fetch rate while every host is being
        crawled (each host's rate is over its own first to last fetch, so hosts found
        later by links do not count as idle time)."""
        rates = [h.rate for h in self.hosts if h.rate is not None]
        return sum(rates) if rates else None


def host_figures(kit: MultiSite, host: str, delay: float) -> Host:
    times = kit.starts(host)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return Host(
        host,
        len(times),
        kit.max_in_progress(host),
        min(gaps, default=None),
        statistics.median(gaps) if gaps else None,
        (len(times) - 1) / span if span > 0 else None,
        sum(g < delay - CLOCK_TOLERANCE for g in gaps) / len(gaps) if gaps else 0.0,
    )


def crawl_once(
    contender: str,
    args: argparse.Namespace,
    admin: redis.Redis,
    redis_url: str,
    tmp: Path,
    run_id: str,
) -> Run:
    flushall(admin)
    spec = SiteSpec(pages=args.pages, links=3, delay=args.site_delay)
    crawl = f"polite-{run_id}"
    failures: list[str] = []
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    with MultiSite([spec] * args.hosts) as kit:
        spider_args = {"urls": ",".join(kit.roots)}
        if contender == SR:
            spider_args["idle_grace"] = str(SR_IDLE_GRACE)
        started = time.monotonic()
        try:
            for i in range(args.workers):
                log = tmp / f"{run_id}-w{i}.log"
                cmd = worker_command(
                    SITEKIT_FILE,
                    settings=settings(contender, redis_url, crawl, args.concurrency, args.delay),
                    spider_args=spider_args,
                    redcrawl=contender == RC,
                )
                env = {**worker_env(), "REDCRAWL_WORKER_ID": f"w{i}"}
                with log.open("wb") as out:
                    procs.append(
                        (
                            subprocess.Popen(
                                cmd,
                                cwd=tmp,
                                env=env,
                                stdin=subprocess.DEVNULL,
                                stdout=out,
                                stderr=subprocess.STDOUT,
                                start_new_session=True,
                            ),
                            log,
                        )
                    )
            deadline = time.monotonic() + args.timeout
            for p, log in procs:
                try:
                    rc = p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    failures.append(
                        f"worker pid {p.pid} still running after {args.timeout:.0f}s: killed"
                    )
                    continue
                if rc != 0:
                    failures.append(
                        f"worker pid {p.pid} exited with {rc}: "
                        f"{log.read_text(errors='replace')[-1500:]}"
                    )
        finally:
            for p, log in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                log.unlink(missing_ok=True)
        seconds = time.monotonic() - started
        hosts = [host_figures(kit, h, args.delay) for h in kit.hosts]
        missing = sum(len(kit.pages(h) - set(kit.fetched(h))) for h in kit.hosts)
    flushall(admin)
    return Run(contender, args.workers, seconds, hosts, missing, failures)


def fmt_gap(gap: float | None) -> str:
    return "-" if gap is None else f"{gap:.3f}"


def fmt_range(r: tuple[float, float] | None) -> str:
    return "-" if r is None else f"{r[0]:.2f}-{r[1]:.2f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.1f}x"


def gap_ratio(delay: float, gap: float | None) -> str:
    """delay / gap, or '>100x' when the gap is under a hundredth of the delay (two fetch
    starts at once: the ratio would be noise)."""
    if gap is not None and gap < delay / 100:
        return ">100x"
    return ratio(delay, gap)


def report(runs: dict[str, Run], args: argparse.Namespace) -> str:
    lines = [
        f"Limits: {args.concurrency} in progress per host, {args.delay:g} s between fetch "
        f"starts (at most {1 / args.delay:.1f} fetches/s per host); {args.workers} "
        "workers. Per host, last round:",
        "",
    ]
    head = f"{'host':<12}"
    for c in CONTENDERS:
        head += f" | {c + ': max in progress':>27} {'min gap s':>9} {'fetch/s':>7}"
    lines.append(head)
    for i, host in enumerate(runs[SR].hosts):
        row = f"{host.host:<12}"
        for c in CONTENDERS:
            h = runs[c].hosts[i]
            row += (
                f" | {h.max_in_progress:>27} {fmt_gap(h.min_gap):>9} "
                f"{'-' if h.rate is None else f'{h.rate:.1f}':>7}"
            )
        lines.append(row)
    lines += ["", f"{'all hosts':<40} {'limit':>8} " + " ".join(f"{c:>14}" for c in CONTENDERS)]
    rows: list[tuple[str, str, list[str]]] = [
        (
            "max in progress at one host",
            f"{args.concurrency}",
            [f"{runs[c].max_in_progress}" for c in CONTENDERS],
        ),
        (
            "  over the limit (max / limit)",
            "1.0x",
            [ratio(runs[c].max_in_progress, args.concurrency) for c in CONTENDERS],
        ),
        (
            "min gap between fetch starts (s)",
            f"{args.delay:g}",
            [fmt_gap(runs[c].min_gap) for c in CONTENDERS],
        ),
        (
            "  too close (delay / min gap)",
            "1.0x",
            [gap_ratio(args.delay, runs[c].min_gap) for c in CONTENDERS],
        ),
        (
            f"gaps under the delay (-{CLOCK_TOLERANCE:g} s)",
            "0%",
            [f"{runs[c].close_share:.0%}" for c in CONTENDERS],
        ),
        (
            "median per-host fetch rate (/s)",
            f"{1 / args.delay:.1f}",
            [f"{runs[c].median_rate:.2f}" if runs[c].median_rate else "-" for c in CONTENDERS],
        ),
        (
            "  over the rate (rate * delay)",
            "1.0x",
            [
                f"{runs[c].median_rate * args.delay:.2f}x" if runs[c].median_rate else "-"
                for c in CONTENDERS
            ],
        ),
        (
            "lowest - highest per-host rate (/s)",
            f"{1 / args.delay:.1f}",
            [fmt_range(runs[c].rate_range) for c in CONTENDERS],
        ),
        (
            "total rate, per-host rates summed (/s)",
            f"{args.hosts / args.delay:.1f}",
            [f"{runs[c].total_rate:.1f}" if runs[c].total_rate else "-" for c in CONTENDERS],
        ),
        (
            "  total * delay / hosts",
            "1.00",
            [
                f"{runs[c].total_rate * args.delay / args.hosts:.2f}" if runs[c].total_rate else "-"
                for c in CONTENDERS
            ],
        ),
        ("crawl time (s, start-up included)", "", [f"{runs[c].seconds:.1f}" for c in CONTENDERS]),
        ("pages never fetched", "0", [f"{runs[c].missing}" for c in CONTENDERS]),
    ]
    for label, limit, values in rows:
        lines.append(f"{label:<40} {limit:>8} " + " ".join(f"{v:>14}" for v in values))
    return "\n".join(lines)


def frontier_push(url: str, admin: redis.Redis, n: int, keys: int, polite: bool) -> int:
    """A fresh crawl of ``n`` requests over ``keys`` hosts; returns Redis memory added (B)."""
    from redcrawl.codec import Envelope
    from redcrawl.frontier import open_frontier

    flushall(admin)
    mem0 = used_memory(admin)
    client = redis.Redis.from_url(url)
    f = open_frontier(client, frontier_settings(url, polite), "bench")
    step = 2000
    for start in range(0, n, step):
        envs = []
        for i in range(start, min(n, start + step)):
            u = f"http://h{i % keys}.example/{i}"
            # (a cheap 20-byte fingerprint: the frontier never recomputes it)
            envs.append(Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()))
        f.push(envs)
    client.close()
    return used_memory(admin) - mem0


def frontier_settings(url: str, polite: bool) -> Any:
    from redcrawl.settings import Settings

    return Settings(
        redis_url=url, politeness=polite, politeness_concurrency=8, politeness_delay=0.0
    )


def frontier_client(
    url: str, polite: bool, worker: str, batch: int, go: Any, out: Any
) -> tuple[int, float, int]:
    """One client: settle (ack the previous batch, lease the next) until nothing is left.
    Returns (and puts on ``out``) the requests it leased and acked, its CPU time (s) and
    how many of its leases came back empty."""
    from redcrawl.frontier import open_frontier

    client = redis.Redis.from_url(url)
    f = open_frontier(client, frontier_settings(url, polite), "bench")
    done = empty = 0
    if go is not None:
        go.wait()
    cpu0 = time.process_time()
    res = f.settle(lease=(worker, batch))
    while True:
        if not res.leases:
            c = f.counts()
            if c.ready + c.delayed == 0:
                break
            empty += 1
            time.sleep(0.001)  # every open key's slots are held by other clients
        done += len(res.leases)
        res = f.settle(ack=res.leases, lease=(worker, batch))
    cpu = time.process_time() - cpu0
    client.close()
    if out is not None:
        out.put((done, cpu, empty))
    return done, cpu, empty


@dataclass
class FrontierRun:
    rate: float
    """lease+ack requests per second (all clients)."""
    cpu_us: float
    """Redis CPU per request (µs) during lease+ack."""
    mem: int
    """Redis memory after the push (B)."""
    client_us: float = 0.0
    """The clients' own CPU per request (µs; their polls after empty leases included):
    they share the machine with Redis."""
    empty: int = 0
    """Leases that came back empty (every open key's slots held by other clients)."""
    script_us: float = 0.0
    """Time inside the frontier's scripts per request (µs, ``INFO commandstats``: evalsha;
    wall time, so with clients on the same cores it includes Redis being preempted)."""
    command_us: float = 0.0
    """Of it, the time in the Redis commands the scripts ran (µs per request); the rest is
    the Lua around them (the interpreter, its tables and strings, the calls' arguments and
    replies converted)."""


def frontier_once(
    url: str, admin: redis.Redis, n: int, keys: int, polite: bool, clients: int, batch: int
) -> FrontierRun:
    mem = frontier_push(url, admin, n, keys, polite)
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event() if clients > 1 else None
    out = ctx.Queue() if clients > 1 else None
    procs = [
        ctx.Process(target=frontier_client, args=(url, polite, f"w{i}", batch, go, out))
        for i in range(clients if clients > 1 else 0)
    ]
    for pr in procs:
        pr.start()
    time.sleep(0.5 if procs else 0)
    stats0 = command_stats(admin)
    cpu0 = redis_cpu(admin)
    t0 = time.perf_counter()
    if go is not None and out is not None:
        go.set()
        outs = [out.get() for _ in procs]
        for pr in procs:
            pr.join()
    else:
        outs = [frontier_client(url, polite, "w0", batch, None, None)]
    elapsed = time.perf_counter() - t0
    cpu = redis_cpu(admin) - cpu0
    calls = stats_delta(stats0, command_stats(admin))
    script = sum(usec for cmd, (_, usec) in calls.items() if cmd in ("evalsha", "eval"))
    inner = sum(usec for cmd, (_, usec) in calls.items() if cmd not in ("evalsha", "eval"))
    done = sum(o[0] for o in outs)
    if done != n:
        print(f"  (warning: {done} of {n} requests leased and acked)", flush=True)
    return FrontierRun(
        rate=n / elapsed,
        cpu_us=cpu / n * 1e6,
        mem=mem,
        client_us=sum(o[1] for o in outs) / n * 1e6,
        empty=sum(o[2] for o in outs),
        script_us=script / n,
        command_us=inner / n,
    )


def frontier_instructions(args: argparse.Namespace) -> int:
    """Redis instructions and commands per lease+ack, on and off (callgrind, one client)."""
    import glob
    import re
    import socket

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (callgrind) is not installed: apt-get install valgrind")
        return 0
    out_dir = tempfile.mkdtemp(prefix="rc-callgrind-")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/cg.%p"]
    cmd += ["--dump-instr=no", "/usr/bin/redis-server", "--port", str(port)]
    cmd += ["--save", "", "--appendonly", "no"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"

    def control(flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(server.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )

    def instructions() -> int:
        files = sorted(glob.glob(f"{out_dir}/cg.*"), key=os.path.getmtime)
        with open(files[-1]) as fh:
            m = re.search(r"^(?:summary|totals): (\d+)", fh.read(), re.M)
        return int(m.group(1)) if m else 0

    try:
        admin = redis.Redis(port=port)
        for _ in range(600):
            try:
                admin.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        print(
            f"instructions: {args.n:,} requests over {args.keys:,} hosts, lease+ack in settle "
            f"calls of {args.batch}, one client, redis-server under callgrind",
            flush=True,
        )
        sides = {"on": (True,), "off": (False,)}.get(args.only, (True, False))
        for polite in sides:
            frontier_push(url, admin, min(args.n, 2000), args.keys, polite)  # warm up
            frontier_client(url, polite, "w0", args.batch, None, None)
            frontier_push(url, admin, args.n, args.keys, polite)
            s0 = command_stats(admin)
            control("-z")
            frontier_client(url, polite, "w0", args.batch, None, None)
            control("-d")
            s1 = command_stats(admin)
            time.sleep(0.5)
            ir = instructions()
            if args.keep:
                files = sorted(glob.glob(f"{out_dir}/cg.*"), key=os.path.getmtime)
                dest = f"{args.keep}.{'on' if polite else 'off'}"
                shutil.copy(files[-1], dest)
                print(f"  (callgrind dump kept: {dest})", flush=True)
            delta = stats_delta(s0, s1)
            calls = sorted(delta.items(), key=lambda kv: -kv[1][0])
            per = ", ".join(f"{c} {v[0] / args.n:.2f}" for c, v in calls[:12])
            print(
                f"  politeness {'on ' if polite else 'off'}: {ir / args.n:,.0f} Ir per lease+ack; "
                f"commands per request: {sum(v[0] for v in delta.values()) / args.n:.2f} ({per})",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(out_dir, ignore_errors=True)
    return 0


def frontier_bench(args: argparse.Namespace) -> int:
    if args.instructions:
        if args.n == 1_000_000 and args.keys == 100_000:
            args.n, args.keys = 10_000, 1_000
        return frontier_instructions(args)
    if args.quick:
        args.n, args.keys = 100_000, 10_000
    binary = server_binary()
    server = RedisServer(binary)
    try:
        admin = redis.Redis.from_url(server.url)
        print(
            f"frontier alone: {args.n:,} requests over {args.keys:,} hosts (concurrency 8 per "
            f"host, no delay), lease+ack in settle calls of {args.batch} by {args.clients} "
            f"client(s), {args.rounds} round(s); Redis {admin.info()['redis_version']}; "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        runs: dict[bool, list[FrontierRun]] = {True: [], False: []}
        for rnd in range(args.rounds):
            for polite in (True, False) if rnd % 2 == 0 else (False, True):
                run = frontier_once(
                    server.url, admin, args.n, args.keys, polite, args.clients, args.batch
                )
                runs[polite].append(run)
                print(
                    f"  round {rnd + 1} politeness {'on ' if polite else 'off'} "
                    f"lease+ack {run.rate:10,.0f}/s  Redis CPU {run.cpu_us:5.1f} µs/request  "
                    f"clients' CPU {run.client_us:5.1f} µs/request  scripts {run.script_us:5.1f} "
                    f"µs/request (commands {run.command_us:4.1f}, Lua "
                    f"{run.script_us - run.command_us:4.1f})  empty leases "
                    f"{run.empty:,}  memory after push {run.mem / 1e6:7.1f} MB",
                    flush=True,
                )

        def med(polite: bool, attr: str) -> float:
            return float(statistics.median(float(getattr(r, attr)) for r in runs[polite]))

        on, off = med(True, "rate"), med(False, "rate")
        con, coff = med(True, "cpu_us"), med(False, "cpu_us")
        kon, koff = med(True, "client_us"), med(False, "client_us")
        per_key = (med(True, "mem") - med(False, "mem")) / args.keys
        print(
            f"median lease+ack: on {on:,.0f}/s, off {off:,.0f}/s, on/off {on / off:.2f}; "
            f"Redis CPU per request: on {con:.1f} µs, off {coff:.1f} µs, off/on "
            f"{coff / con:.2f}; clients' CPU per request: on {kon:.1f} µs, off {koff:.1f} µs; "
            f"Redis memory per host key with ready work (on minus off, "
            f"{args.n // args.keys} requests each): {per_key:,.0f} B"
        )
        write_json(
            args.json,
            {
                "args": vars(args),
                "runs": {("on" if k else "off"): [asdict(r) for r in v] for k, v in runs.items()},
            },
        )
    finally:
        server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--hosts", type=int, default=12, help="sites (default 12)")
    p.add_argument("--pages", type=int, default=20, help="pages per site (default 20)")
    p.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    p.add_argument(
        "--concurrency", type=int, default=2, help="CONCURRENT_REQUESTS_PER_DOMAIN (default 2)"
    )
    p.add_argument("--delay", type=float, default=0.2, help="DOWNLOAD_DELAY (default 0.2)")
    p.add_argument(
        "--site-delay",
        type=float,
        default=0.3,
        help="seconds each site takes to answer (default 0.3)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds (default 1; the last is printed per host, every round in the summary lines)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per crawl")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--frontier",
        action="store_true",
        help="the frontier alone: lease+ack with politeness on vs off (see the module docstring)",
    )
    p.add_argument("--n", type=int, default=1_000_000, help="--frontier: requests (1,000,000)")
    p.add_argument("--keys", type=int, default=100_000, help="--frontier: hosts (100,000)")
    p.add_argument(
        "--quick", action="store_true", help="--frontier: 100,000 requests over 10,000 hosts"
    )
    p.add_argument(
        "--clients", type=int, default=1, help="--frontier: concurrent client processes (1)"
    )
    p.add_argument("--batch", type=int, default=64, help="--frontier: settle batch (64)")
    p.add_argument(
        "--instructions",
        action="store_true",
        help="--frontier: Redis instructions and commands per lease+ack under callgrind",
    )
    p.add_argument(
        "--only",
        choices=("on", "off"),
        help="--instructions: measure politeness on or off only (default both)",
    )
    p.add_argument(
        "--keep",
        metavar="PREFIX",
        help="--instructions: keep each callgrind dump as PREFIX.on / PREFIX.off",
    )
    args = p.parse_args(argv)
    if args.frontier:
        return frontier_bench(args)
    if not (
        1 <= args.hosts <= 250
        and args.pages >= 1
        and args.workers >= 1
        and args.concurrency >= 1
        and args.delay > 0
        and args.rounds >= 1
    ):
        p.error(
            "--hosts 1..250, --pages, --workers, --concurrency, --rounds at least 1, "
            "--delay above 0"
        )

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    binary = server_binary()
    server = RedisServer(binary)
    tmp = Path(tempfile.mkdtemp(prefix="redcrawl-bench-polite-"))
    try:
        admin = redis.Redis.from_url(server.url)
        env = environment(admin, binary)
        env.pop("fingerprint", None)
        print(
            f"Redis {env['redis_version']} ({binary}); nproc={env['nproc']}; load "
            f"{os.getloadavg()[0]:.2f}; scrapy {env['scrapy']}, scrapy-redis "
            f"{env['scrapy-redis']}; {args.hosts} sites x {args.pages + 1} pages, each "
            f"answering in {args.site_delay:g} s; {args.rounds} round(s)",
            flush=True,
        )
        history: dict[str, list[Run]] = {c: [] for c in CONTENDERS}
        for rnd in range(args.rounds):
            order = CONTENDERS if rnd % 2 == 0 else CONTENDERS[::-1]
            for c in order:
                run = crawl_once(c, args, admin, server.url, tmp, f"r{rnd}-{c}")
                history[c].append(run)
                print(
                    f"  round {rnd + 1} {c:<12} {run.seconds:5.1f}s  max in progress "
                    f"{run.max_in_progress}  min gap {fmt_gap(run.min_gap)} s  missing "
                    f"{run.missing}" + (f"  PROBLEMS: {len(run.failures)}" if run.failures else ""),
                    flush=True,
                )
        last = {c: history[c][-1] for c in CONTENDERS}
        print()
        print(report(last, args))
        problems = [
            f"{c} round {i + 1}: {f}"
            for c in CONTENDERS
            for i, r in enumerate(history[c])
            for f in r.failures
        ]
        if problems:
            print("\nProblems seen (the numbers above may be off):")
            for line in problems[:10]:
                print(f"  {line}")
        write_json(
            args.json,
            {
                "environment": env,
                "args": vars(args),
                "runs": {c: [asdict(r) for r in rs] for c, rs in history.items()},
            },
        )
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
