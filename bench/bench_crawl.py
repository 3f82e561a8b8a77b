#!/usr/bin/env python
"""End-to-end crawl benchmark: Scrapy's in-memory scheduler vs scrapy-redis vs redcrawl.

Usage::

    python bench/bench_crawl.py [--products 3000] [--rounds 3] [--quick] [--fleet 2]
                                [--json PATH] [--profile]

A link-heavy crawl of the local shop site (``redcrawl.demo.site``, ``links_per_page=20``
like ``scrapy bench``: about 30 links a page, nearly all duplicates; no tracking
parameters and no faults, so every scheduler must fetch every canonical page exactly
once). Every worker is a real ``scrapy runspider bench/crawl_spider.py`` process; the
spider times itself with signals, so process start-up is never counted.

Measured in one run, on one throw-away ``redis-server`` (see ``bench_frontier.py``),
contenders alternating within each round, ``FLUSHALL`` between runs:

1. pages/s of one worker with (a) Scrapy's default in-memory scheduler, (b) scrapy-redis
   0.9.1 (``Scheduler`` + ``RFPDupeFilter`` + its default ``PriorityQueue``), (c) redcrawl;
2. total pages/s of ``--fleet`` workers sharing one crawl for (b) and (c); for (a), which
   cannot share, the same number of independent in-memory crawls run side by side (each
   on its own copy of the site) as the reference;
3. Redis server CPU per page and Redis commands per page (``INFO cpu`` and
   ``INFO commandstats`` deltas over the crawl / pages) for (b) and (c), and the pages/s
   one Redis core could serve at that cost.

Medians over the rounds. Missed targets are reported, never turned into a non-zero exit
status: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pstats
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import redis
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

from redcrawl.demo.site import ShopSite, SiteConfig
from redcrawl.workers import worker_command

HERE = Path(__file__).resolve().parent
SPIDER = HERE / "crawl_spider.py"

MEM = "in-memory"
SR = "scrapy-redis"
RC = "redcrawl"
CONTENDERS = (MEM, SR, RC)

LINKS_PER_PAGE = 20
TARGET_VS_MEMORY = 0.97
"""redcrawl's pages/s per worker, as a fraction of the in-memory scheduler's."""
TARGET_REDIS_US = 100.0
"""redcrawl's Redis CPU per page (microseconds)."""
SR_FLEET_IDLE_GRACE = 2.0
"""crawl_spider.py's idle_grace for scrapy-redis fleets (see its docstring)."""

COMMON_SETTINGS = (
    "CONCURRENT_REQUESTS=16",
    "CONCURRENT_REQUESTS_PER_DOMAIN=16",  # Scrapy's default is 8: one host would cap at 8
    # scrapy-redis has no fleet-wide limits: compare the frontiers' cost, not politeness
    # (bench_politeness.py compares the limits each keeps)
    "REDCRAWL_POLITENESS=off",
    "LOG_LEVEL=WARNING",
    "TELNETCONSOLE_ENABLED=False",
    "AUTOTHROTTLE_ENABLED=False",
    "ROBOTSTXT_OBEY=False",
    "COOKIES_ENABLED=False",
    "RETRY_ENABLED=False",
)


def contender_settings(name: str, redis_url: str, crawl: str) -> list[str]:
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
    ]


# --- Redis counters ------------------------------------------------------------------


def command_calls(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """``INFO commandstats``: command -> (calls, usec)."""
    out: dict[str, tuple[int, int]] = {}
    for key, value in r.info("commandstats").items():
        name = str(key).removeprefix("cmdstat_")
        if isinstance(value, dict):
            out[name] = (int(value.get("calls", 0)), int(value.get("usec", 0)))
    return out


def calls_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """Per-command (calls, usec) between two snapshots, without the bench's own INFO."""
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if name != "info" and calls > c0:
            out[name] = (calls - c0, usec - u0)
    return out


# --- one crawl ---------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    contender: str
    workers: int
    pages: int  # responses received, all workers
    window: float  # earliest first response -> latest last response (s)
    pps: float  # pages / window
    worker_pps: list[float]  # each worker's pages / its own window
    worker_pages: list[int]
    worker_cpu_us: float  # workers' CPU over their windows / pages
    idle_pct: float  # mean share of a worker's window it spent off the CPU (%)
    startup: float  # mean seconds from launch to first response
    tail: float  # max seconds from last response to spider_closed
    max_stall: float  # longest gap between two responses of one worker (s)
    load: float  # 1-minute load average when the crawl started
    redis_cpu_us: float | None = None
    redis_calls: float | None = None
    redis_core_pps: float | None = None
    commands: dict[str, tuple[int, int]] = field(default_factory=dict)
    canonical: int = 0  # canonical pages of one site
    missing: int = 0  # canonical pages never fetched
    duplicates: int = 0  # extra fetches of a page already fetched
    strays: int = 0  # fetches of non-canonical paths
    failures: list[str] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)


def start_site(config: SiteConfig, *, low_port: bool = True) -> ShopSite:
    """Serve the shop on a free loopback port: below 10000 unless ``low_port`` is off.

    Real sites are crawled without a port in their URLs; the ports the OS hands out
    (32768 and up) would make every link look unusual to redcrawl's fingerprint fast
    path, which accepts ports of at most four digits and sends anything else to w3lib's
    general (much slower) canonicalisation. A 4-digit port keeps the URLs on the path
    real crawls take; ``--ephemeral-port`` measures the other one."""
    if low_port:
        rng = random.Random()
        for _ in range(100):
            try:
                return ShopSite(config, port=rng.randrange(2000, 10000)).start()
            except OSError:
                continue
    return ShopSite(config).start()


def launch(
    contender: str,
    site_url: str,
    redis_url: str,
    crawl: str,
    stats_file: Path,
    log_file: Path,
    cwd: Path,
    *,
    idle_grace: float = 0.0,
    profile: Path | None = None,
) -> subprocess.Popen[bytes]:
    args = [f"url={site_url}", f"stats_file={stats_file}"]
    if idle_grace:
        args.append(f"idle_grace={idle_grace}")
    cmd = worker_command(
        SPIDER,
        settings=[*COMMON_SETTINGS, *contender_settings(contender, redis_url, crawl)],
        spider_args=args,
        redcrawl=contender == RC,
        python_args=["-m", "cProfile", "-o", str(profile)] if profile is not None else [],
    )
    with open(log_file, "wb") as log:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=worker_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def log_problems(text: str) -> list[str]:
    """Lines of a worker's log that say something went wrong."""
    keys = (" ERROR: ", " CRITICAL: ", "Traceback (most recent call last)")
    return [line for line in text.splitlines() if any(k in line for k in keys)]


def crawl_once(
    contender: str,
    workers: int,
    config: SiteConfig,
    admin: redis.Redis,
    redis_url: str,
    tmp: Path,
    run_id: str,
    timeout: float,
    profile: Path | None = None,
    low_port: bool = True,
) -> Run:
    flushall(admin)
    # In-memory workers cannot share a crawl: each gets its own site, crawled whole.
    n_sites = workers if contender == MEM else 1
    sites = [start_site(config, low_port=low_port) for _ in range(n_sites)]
    crawl = f"bench-{run_id}"
    idle_grace = SR_FLEET_IDLE_GRACE if contender == SR and workers > 1 else 0.0
    failures: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []
    files = [(tmp / f"{run_id}-w{i}.json", tmp / f"{run_id}-w{i}.log") for i in range(workers)]
    try:
        load = os.getloadavg()[0]
        cpu0, calls0 = redis_cpu(admin), command_calls(admin)
        launched = time.time()
        for i, (stats_file, log_file) in enumerate(files):
            site = sites[i % n_sites]
            procs.append(
                launch(
                    contender,
                    site.url,
                    redis_url,
                    crawl,
                    stats_file,
                    log_file,
                    tmp,
                    idle_grace=idle_grace,
                    profile=profile,
                )
            )
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failures.append(f"worker pid {p.pid} still running after {timeout:.0f}s: killed")
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        cpu1, calls1 = redis_cpu(admin), command_calls(admin)
        hits = [site.hits() for site in sites]
        canonical = sites[0].canonical_pages()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for site in sites:
            site.stop()
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

    active = [r for r in reports if r["first_response"] is not None]
    pages = sum(r["responses"] for r in reports)
    window = (
        max(r["last_response"] for r in active) - min(r["first_response"] for r in active)
        if active
        else 0.0
    )
    missing = duplicates = strays = 0
    for h in hits:
        missing += len(canonical - h.keys())
        duplicates += sum(n - 1 for path, n in h.items() if path in canonical and n > 1)
        strays += sum(n for path, n in h.items() if path not in canonical)
    served = sum(sum(h.values()) for h in hits)
    if served != pages:
        failures.append(f"site served {served} pages, workers counted {pages} responses")
    run = Run(
        contender=contender,
        workers=workers,
        pages=pages,
        window=window,
        pps=pages / window if window > 0 else 0.0,
        worker_pps=[r["responses"] / r["elapsed"] if r["elapsed"] > 0 else 0.0 for r in reports],
        worker_pages=[r["responses"] for r in reports],
        worker_cpu_us=(sum(r["cpu_window"] for r in reports) * 1e6 / pages if pages else 0.0),
        idle_pct=(
            statistics.mean(
                max(0.0, 100 * (1 - r["cpu_window"] / r["elapsed"]))
                for r in active
                if r["elapsed"] > 0
            )
            if active
            else 0.0
        ),
        startup=(
            statistics.mean(r["first_response"] - launched for r in active) if active else 0.0
        ),
        tail=max((r["closed_at"] - r["last_response"] for r in active), default=0.0),
        max_stall=max((gap for r in active for _, gap in r.get("stalls", [])), default=0.0),
        load=load,
        canonical=len(canonical),
        missing=missing,
        duplicates=duplicates,
        strays=strays,
        failures=failures,
        reports=reports,
    )
    if contender != MEM and pages:
        commands = calls_delta(calls0, calls1)
        run.commands = commands
        run.redis_cpu_us = (cpu1 - cpu0) * 1e6 / pages
        run.redis_calls = sum(c for c, _ in commands.values()) / pages
        run.redis_core_pps = 1e6 / run.redis_cpu_us if run.redis_cpu_us > 0 else float("inf")
    return run


# --- report ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metric:
    key: str  # "<workers>:<Run attribute>"
    label: str
    fmt: str
    higher_is_better: bool
    redis_only: bool = False
    ratio: bool = True  # False: a ratio of this row means nothing (shares near 0)


def metrics(fleet: int) -> tuple[Metric, ...]:
    f = f"{fleet} workers"
    return (
        Metric("1:pps", "1 worker: pages/s", "{:,.0f}", True),
        Metric("1:worker_cpu_us", "1 worker: worker CPU per page (us)", "{:,.0f}", False),
        Metric(
            "1:idle_pct",
            "1 worker: worker off-CPU (% of its window)",
            "{:.1f}%",
            False,
            ratio=False,
        ),
        Metric("1:max_stall", "1 worker: longest pause between responses (s)", "{:.2f}", False),
        Metric("1:redis_cpu_us", "1 worker: Redis CPU per page (us)", "{:,.1f}", False, True),
        Metric("1:redis_calls", "1 worker: Redis commands per page", "{:,.1f}", False, True),
        Metric(
            "1:redis_core_pps",
            "1 worker: pages/s one Redis core could serve",
            "{:,.0f}",
            True,
            True,
        ),
        Metric(f"{fleet}:pps", f"{f}: fleet pages/s", "{:,.0f}", True),
        Metric(f"{fleet}:speedup", f"{f}: fleet / 1 worker", "{:.2f}x", True),
        Metric(f"{fleet}:worker_cpu_us", f"{f}: worker CPU per page (us)", "{:,.0f}", False),
        Metric(
            f"{fleet}:idle_pct",
            f"{f}: worker off-CPU (% of its window)",
            "{:.1f}%",
            False,
            ratio=False,
        ),
        Metric(f"{fleet}:redis_cpu_us", f"{f}: Redis CPU per page (us)", "{:,.1f}", False, True),
        Metric(f"{fleet}:redis_calls", f"{f}: Redis commands per page", "{:,.1f}", False, True),
        Metric(
            f"{fleet}:redis_core_pps",
            f"{f}: pages/s one Redis core could serve",
            "{:,.0f}",
            True,
            True,
        ),
    )


def run_value(
    runs: dict[tuple[str, int], list[Run]], contender: str, key: str, rnd: int
) -> float | None:
    workers_s, attr = key.split(":", 1)
    workers = int(workers_s)
    if attr == "speedup":
        one = runs[(contender, 1)][rnd].pps
        return runs[(contender, workers)][rnd].pps / one if one else None
    value = getattr(runs[(contender, workers)][rnd], attr)
    return None if value is None else float(value)


def medians(
    runs: dict[tuple[str, int], list[Run]], fleet: int, rounds: int
) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for c in CONTENDERS:
        out[c] = {}
        for m in metrics(fleet):
            values = [
                v for rnd in range(rounds) if (v := run_value(runs, c, m.key, rnd)) is not None
            ]
            out[c][m.key] = statistics.median(values) if values else None
    return out


def render_table(
    med: dict[str, dict[str, float | None]], fleet: int, checks: dict[str, str]
) -> str:
    head = ["metric", MEM, SR, RC, "redcrawl/in-memory", "redcrawl/scrapy-redis"]
    rows = [head]

    def fmt(m: Metric, value: float | None) -> str:
        return "-" if value is None else m.fmt.format(value)

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "-"

    for m in metrics(fleet):
        mem = None if m.redis_only else med[MEM][m.key]
        label = m.label + (" *" if m.key in (f"{fleet}:pps", f"{fleet}:speedup") else "")
        row = [
            label,
            fmt(m, mem),
            fmt(m, med[SR][m.key]),
            fmt(m, med[RC][m.key]),
            ratio(med[RC][m.key], mem) if m.ratio else "-",
            ratio(med[RC][m.key], med[SR][m.key]) if m.ratio else "-",
        ]
        rows.append(row)
    rows.append(
        ["every canonical page fetched exactly once", checks[MEM], checks[SR], checks[RC], "", ""]
    )
    return markdown_table(rows)


def fetch_checks(runs: dict[tuple[str, int], list[Run]]) -> dict[str, str]:
    """Per contender: "yes", or the worst missing/duplicate counts over all its runs."""
    out = {}
    for c in CONTENDERS:
        all_runs = [r for (name, _), rs in runs.items() if name == c for r in rs]
        missing = max(r.missing for r in all_runs)
        dups = max(r.duplicates for r in all_runs)
        strays = max(r.strays for r in all_runs)
        if not (missing or dups or strays):
            out[c] = "yes"
        else:
            parts = [
                f"{missing} missing" if missing else "",
                f"{dups} dup" if dups else "",
                f"{strays} stray" if strays else "",
            ]
            out[c] = "NO: " + ", ".join(p for p in parts if p)
    return out


def targets(med: dict[str, dict[str, float | None]], fleet: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    rc, mem = med[RC]["1:pps"], med[MEM]["1:pps"]
    if rc is not None and mem:
        share = rc / mem
        out.append(
            {
                "target": f"redcrawl >= {TARGET_VS_MEMORY:.0%} of the in-memory "
                "scheduler's pages/s (1 worker)",
                "value": f"{share:.1%}",
                "met": share >= TARGET_VS_MEMORY,
            }
        )
    for workers in (1, fleet):
        us = med[RC][f"{workers}:redis_cpu_us"]
        if us is not None:
            out.append(
                {
                    "target": f"redcrawl <= {TARGET_REDIS_US:g} us Redis CPU per page "
                    f"({workers} worker{'s' if workers > 1 else ''})",
                    "value": f"{us:.1f} us",
                    "met": us <= TARGET_REDIS_US,
                }
            )
    return out


def command_breakdown(runs: dict[tuple[str, int], list[Run]], fleet: int) -> str:
    lines = [
        "Redis commands per page by command (last round; calls/page, usec/page as "
        "INFO commandstats counts them; redis.call()s inside Lua scripts are counted "
        "under their own names too, and their time is part of EVALSHA's):"
    ]
    for c in (SR, RC):
        for workers in sorted({1, fleet}):
            run = runs[(c, workers)][-1]
            top = sorted(run.commands.items(), key=lambda kv: -kv[1][0])
            parts = ", ".join(
                f"{name} {calls / run.pages:.2f} ({usec / run.pages:.1f}us)"
                for name, (calls, usec) in top[:10]
            )
            lines.append(f"  {c}, {workers} worker(s): {parts}")
    return "\n".join(lines)


def round_line(run: Run) -> str:
    redis_part = ""
    if run.redis_cpu_us is not None:
        redis_part = f"  Redis {run.redis_cpu_us:7.1f} us/page {run.redis_calls:5.1f} cmd/page"
    per_worker = " + ".join(f"{n}" for n in run.worker_pages)
    check = (
        "ok"
        if not (run.missing or run.duplicates or run.strays)
        else (f"missing {run.missing} dup {run.duplicates} stray {run.strays}")
    )
    return (
        f"{run.contender:<12} x{run.workers}  {run.pps:7,.0f} pages/s  {run.pages:>6} pages "
        f"({per_worker}) in {run.window:6.2f}s  worker CPU {run.worker_cpu_us:6,.0f} us/page"
        f"  off-CPU {run.idle_pct:4.1f}%{redis_part}  longest pause {run.max_stall:4.2f}s"
        f"  start-up {run.startup:4.1f}s"
        f"  load {run.load:.1f}  [{check}]"
    )


# --- profiling ---------------------------------------------------------------------

PROFILED = {
    MEM: ("scrapy/core/scheduler.py", ("enqueue_request", "next_request", "has_pending_requests")),
    SR: ("scrapy_redis/scheduler.py", ("enqueue_request", "next_request", "has_pending_requests")),
    RC: (
        "redcrawl/scrapy/scheduler.py",
        (
            "enqueue_request",
            "next_request",
            "has_pending_requests",
            "_on_finished",
            "_tick",
            "_beat",
            "_on_idle",
            "_on_response",
            "_on_item",
        ),
    ),
}


def _cum(stats: pstats.Stats, path: str, func: str) -> float:
    total = 0.0
    for (filename, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        if name == func and filename.endswith(path):
            total += row[3]
    return total


def script_names() -> dict[str, str]:
    """SHA1 -> name of redcrawl's frontier scripts, for every dedupe mode and backend."""
    from typing import get_args

    from redcrawl import scripts
    from redcrawl.dedupe import Mode
    from redcrawl.frontier.core import _SCRIPTS, script_files

    return {
        hashlib.sha1(scripts.source(*script_files(n, mode, backend)).encode()).hexdigest(): n
        for n in _SCRIPTS
        for mode in get_args(Mode)
        for backend in ("lists", "streams")
    }


def redis_time_by_command(
    c: str,
    config: SiteConfig,
    admin: redis.Redis,
    redis_url: str,
    tmp: Path,
    timeout: float,
    low_port: bool = True,
) -> tuple[str, dict[str, Any]]:
    """One un-profiled single-worker crawl with SLOWLOG recording every command: Redis's
    time per page by command, EVALSHA split by script. SLOWLOG durations are wall time
    inside each command (nested redis.call()s included), so on a busy machine they also
    count time the server was descheduled."""
    names = script_names()
    admin.config_set("slowlog-log-slower-than", 0)
    admin.config_set("slowlog-max-len", 2_000_000)
    admin.slowlog_reset()
    try:
        run = crawl_once(
            c, 1, config, admin, redis_url, tmp, f"slowlog-{c}", timeout, low_port=low_port
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
    pages = max(run.pages, 1)
    total = sum(us for _, us in agg.values())
    lines = [
        f"  Redis time by command, one {c} worker ({run.pages} pages; SLOWLOG wall time "
        f"inside commands: {total / pages:.1f} us/page of {run.redis_cpu_us or 0:.1f} us "
        "CPU/page, the rest is reading/writing sockets):"
    ]
    for name, (calls, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:12]:
        lines.append(
            f"    {name:<24} {calls / pages:6.2f} calls/page  {us / pages:7.1f} us/page"
            f"  {us / calls:7.1f} us/call"
        )
    return "\n".join(lines), {
        name: {"calls_per_page": calls / pages, "us_per_page": us / pages}
        for name, (calls, us) in agg.items()
    }


def profile_workers(
    config: SiteConfig,
    admin: redis.Redis,
    redis_url: str,
    tmp: Path,
    timeout: float,
    top: int,
    low_port: bool = True,
) -> tuple[str, dict[str, Any]]:
    """One cProfile'd worker per contender; where the worker's time goes, per page. Then,
    for the Redis contenders, Redis's time by command (one more, un-profiled, crawl)."""
    out: list[str] = []
    summary: dict[str, Any] = {}
    for c in (SR, RC):
        text, by_command = redis_time_by_command(
            c, config, admin, redis_url, tmp, timeout, low_port
        )
        out.append(text)
        summary[f"{c} redis by command"] = by_command
    for c in CONTENDERS:
        prof = tmp / f"profile-{c}.prof"
        run = crawl_once(
            c,
            1,
            config,
            admin,
            redis_url,
            tmp,
            f"profile-{c}",
            timeout,
            profile=prof,
            low_port=low_port,
        )
        if run.failures or not prof.exists():
            out.append(f"profile of {c} failed: {run.failures[:3]}")
            continue
        stats = pstats.Stats(str(prof))
        total = stats.total_tt  # type: ignore[attr-defined]
        path, funcs = PROFILED[c]
        parts = {f: _cum(stats, path, f) for f in funcs}
        sched = sum(parts.values())
        summary[c] = {
            "pages": run.pages,
            "profiled_seconds": total,
            "scheduler_seconds": sched,
            "per_function_seconds": parts,
            "redis_cpu_us_per_page": run.redis_cpu_us,
        }
        out.append(
            f"\n--- cProfile of one {c} worker: {run.pages} pages, {total:.2f}s "
            f"for the whole process, start-up included ({total * 1e6 / run.pages:,.0f} "
            "us/page; cProfile times are wall-clock and inflated by the profiler); "
            f"scheduler methods {sched:.2f}s = {sched / total:.1%} "
            f"({sched * 1e6 / run.pages:,.0f} us/page) ---"
        )
        for f, t in sorted(parts.items(), key=lambda kv: -kv[1]):
            if t:
                out.append(f"  {f:<22} {t:7.3f}s  {t * 1e6 / run.pages:7,.0f} us/page")
        if c == RC:
            frontier = {
                f: _cum(stats, "redcrawl/frontier/lists.py", f)
                for f in ("settle", "lease", "counts", "renew", "add_stats")
            }
            waited = sum(frontier.values())
            summary[c]["frontier_seconds"] = frontier
            out.append(
                f"  of which frontier calls (Redis round trips, the reactor waits): "
                f"{waited:.3f}s  {waited * 1e6 / run.pages:,.0f} us/page  ("
                + ", ".join(f"{f} {t * 1e6 / run.pages:,.0f}" for f, t in frontier.items() if t)
                + " us/page)"
            )
        if c == RC:
            buf = io.StringIO()
            s = pstats.Stats(str(prof), stream=buf)
            s.sort_stats("tottime").print_stats(r"redcrawl|/redis/|msgpack|hiredis", top)
            s.sort_stats("cumulative").print_stats(r"redcrawl", top)
            out.append(buf.getvalue())
    return "\n".join(out), summary


# --- main --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--products",
        type=int,
        default=None,
        help="product pages (default 3000, about 3,150 pages; 800 with --quick)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds; the median is reported (default 3, 1 with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="a smaller site and one round")
    p.add_argument("--fleet", type=int, default=2, help="workers sharing one crawl (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per crawl")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--profile", action="store_true", help="afterwards, cProfile one worker of each contender"
    )
    p.add_argument(
        "--ephemeral-port",
        action="store_true",
        help="serve the site on an OS-assigned (5-digit) port instead of one below "
        "10000; see start_site()",
    )
    p.add_argument("--profile-top", type=int, default=25, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    products: int = args.products if args.products is not None else 800 if args.quick else 3000
    rounds: int = args.rounds if args.rounds is not None else 1 if args.quick else 3
    if products < 1 or rounds < 1 or args.fleet < 2:
        p.error("--products and --rounds must be at least 1, --fleet at least 2")
    config = SiteConfig(products=products, links_per_page=LINKS_PER_PAGE, tracking_params=False)
    low_port = not args.ephemeral_port

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    binary = server_binary()
    server = RedisServer(binary)
    tmp = Path(tempfile.mkdtemp(prefix="redcrawl-bench-crawl-"))
    try:
        admin = redis.Redis.from_url(server.url)
        env = environment(admin, binary)
        env.pop("fingerprint", None)
        load = os.getloadavg()
        print(
            f"Redis {env['redis_version']} ({binary}) on {server.url}; nproc={env['nproc']} "
            f"({env['cpu']}); load average {load[0]:.2f}; Python {env['python']}; "
            f"scrapy {env['scrapy']}, scrapy-redis {env['scrapy-redis']}, "
            f"redis-py {env['redis-py']}, hiredis {env['hiredis']}"
        )
        print(
            f"Shop site: {products} products, {config.pages} canonical pages, "
            f"links_per_page={LINKS_PER_PAGE}, served on "
            f"{'a port below 10000' if low_port else 'an ephemeral port'}; 1 and "
            f"{args.fleet} workers per contender; {rounds} round(s)",
            flush=True,
        )

        # Warm-up: the OS file cache (imports), and a check that every contender runs.
        warm = replace(config, products=min(products, 100))
        for c in CONTENDERS:
            run = crawl_once(
                c, 1, warm, admin, server.url, tmp, f"warm-{c}", args.timeout, low_port=low_port
            )
            if run.failures:
                print(f"warm-up of {c} failed:\n  " + "\n  ".join(run.failures))
                return 0

        plan = [(c, w) for w in (1, args.fleet) for c in CONTENDERS]
        runs: dict[tuple[str, int], list[Run]] = {key: [] for key in plan}
        failures: list[str] = []
        for rnd in range(rounds):
            order = plan if rnd % 2 == 0 else plan[::-1]
            for c, w in order:
                run = crawl_once(
                    c,
                    w,
                    config,
                    admin,
                    server.url,
                    tmp,
                    f"r{rnd}-{c}-{w}",
                    args.timeout,
                    low_port=low_port,
                )
                runs[(c, w)].append(run)
                print(f"  round {rnd + 1} {round_line(run)}", flush=True)
                failures += [f"round {rnd + 1} {c} x{w}: {f}" for f in run.failures]

        med = medians(runs, args.fleet, rounds)
        checks = fetch_checks(runs)
        print()
        print(
            f"Median of {rounds} round(s); {config.pages} pages per crawl. pages/s = pages / "
            "(earliest first response -> latest last response), start-up excluded. "
            "Ratios: above 1 is better for pages/s, below 1 for CPU and commands."
        )
        print(render_table(med, args.fleet, checks))
        print(
            f"* {MEM}: {args.fleet} independent in-memory crawls side by side, each of its "
            f"own copy of the site ({args.fleet}x the pages): an in-memory scheduler cannot "
            "share a crawl; this is what the machine does with that many Scrapy processes."
        )
        print()
        print(command_breakdown(runs, args.fleet))
        print()
        verdicts = targets(med, args.fleet)
        print("Targets (informational; never an exit status):")
        for t in verdicts:
            print(f"  [{'MET   ' if t['met'] else 'MISSED'}] {t['target']} -> {t['value']}")
        print(
            "  reference (issue): scrapy-redis ~1 ms Redis CPU/page, 44 commands/page, "
            "~87% of in-memory pages/s"
        )
        if failures:
            print("\nProblems seen (the numbers above may be off):")
            for f in failures[:20]:
                print(f"  {f}")

        profile_summary: dict[str, Any] = {}
        if args.profile:
            profile_text, profile_summary = profile_workers(
                config, admin, server.url, tmp, args.timeout, args.profile_top, low_port
            )
            print(profile_text)

        write_json(
            args.json,
            {
                "products": products,
                "pages": config.pages,
                "links_per_page": LINKS_PER_PAGE,
                "rounds": rounds,
                "fleet": args.fleet,
                "environment": env,
                "site_port": "below 10000" if low_port else "ephemeral",
                "load_average": load,
                "median": med,
                "fetch_checks": checks,
                "targets": verdicts,
                "failures": failures,
                "profile": profile_summary,
                "runs": {f"{c} x{w}": [asdict(r) for r in rs] for (c, w), rs in runs.items()},
            },
        )
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
