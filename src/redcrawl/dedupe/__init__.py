"""Dedupe of DONE requests: a compact exact filter, or a Bloom filter for billions of URLs.

"Queued" dedupe needs no structure of its own (a queued request's id is its fingerprint,
a field of the crawl's request hash); this package remembers the fingerprints of requests
that are DONE. Three modes, one interface (``dd_done_flags`` / ``dd_mark_done`` in Lua,
prepended to the frontier's scripts; :class:`Filter` from Python):

* ``exact`` (default): 63-bit integers in 2^b bucket sets kept in Redis's intset
  encoding, about 9 bytes per URL and no false positive short of a 63+b-bit collision.
  Buckets are planned to hold at most :data:`BUCKET_FILL` members, well under Redis's
  default ``set-max-intset-entries`` (512), so they stay compact on any server, after any
  restart, without ``CONFIG SET``; beyond the planned capacity the filter grows by levels
  of twice as many buckets.
* ``bloom`` with RedisBloom loaded (``rbloom``): BF.* filters, one per shard.
* ``bloom`` without it: redcrawl's own scalable Bloom filter on bitmaps (``lua/bloom.lua``).

A :class:`DedupeSpec` fixes the mode and its sizes for the life of a crawl; it travels to
every script as one string. With a recrawl window (``REDCRAWL_RECRAWL_AFTER``), DONE
fingerprints go into time generations that expire as whole keys.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import redis.exceptions

from redcrawl import scripts
from redcrawl.errors import ConfigError
from redcrawl.settings import Settings

__all__ = [
    "BUCKET_FILL",
    "GENERATIONS",
    "DedupeSpec",
    "Filter",
    "ImportResult",
    "bucket_key",
    "exact_spec",
    "has_redisbloom",
    "import_hex_set",
    "prelude",
    "resolve_spec",
    "split",
]

Mode = Literal["exact", "bloom", "rbloom"]

GENERATIONS = 4
"""With a recrawl window W, DONE fingerprints live in generations of W / GENERATIONS: a URL
may be crawled again between W and W * (1 + 1 / GENERATIONS) after it was done."""
BUCKET_FILL = 320
"""Exact mode: the most fingerprints a bucket of a level holds; once the level holds that
many per bucket, the next level (twice the buckets) starts. Well under Redis's default
set-max-intset-entries (512): the fullest of 2^24 buckets of 320 on average exceeds 512
with a probability of about 4e-16."""
DEFAULT_INTSET_ENTRIES = 512
"""Redis's default set-max-intset-entries."""
LEGACY_BUCKET_FILL = 2048
"""Exact mode, crawls created before levels (spec without a fill): fingerprints per
bucket at the planned capacity."""
INTSET_HEADROOM = 2.5
"""Exact mode, legacy plan: buckets must stay intsets up to this many times their planned
fill."""
MAX_BUCKET_BITS = 24
"""Exact mode: buckets are picked by the first 3 bytes of a fingerprint."""
SEGMENT_BITS = 25
"""Own Bloom filter: bitmap keys hold 2^SEGMENT_BITS - 512 bits (just under 4 MiB)."""
SHARD_CAPACITY = 1 << 24
"""RedisBloom: planned fingerprints per shard (one BF key each)."""


@dataclass(frozen=True, slots=True)
class DedupeSpec:
    """How a crawl's DONE fingerprints are stored; fixed when the crawl is created."""

    mode: Mode
    capacity: int
    error_rate: float = 0.01
    bucket_bits: int = 0
    shards: int = 1
    gen_ms: int = 0
    gens: int = 0
    segment_bits: int = SEGMENT_BITS
    bucket_fill: int = 0
    """Exact mode: the most fingerprints per bucket of a level (0: a legacy plan, one
    level of unbounded buckets)."""

    def encode(self) -> str:
        """The spec string the Lua preludes read."""
        if self.mode == "exact":
            legacy = f"exact {self.bucket_bits} {self.gen_ms} {self.gens}"
            return f"{legacy} {self.bucket_fill}" if self.bucket_fill else legacy
        p = repr(self.error_rate / max(1, self.gens + 1 if self.gen_ms else 1))
        if self.mode == "bloom":
            return f"bloom {self.capacity} {p} {self.gen_ms} {self.gens} {self.segment_bits}"
        cap = -(-self.capacity // self.shards)
        return f"rbloom {self.shards} {cap} {p} {self.gen_ms} {self.gens}"

    @property
    def width_bits(self) -> int:
        """Exact mode: the bits a fingerprint keeps (63-bit member + bucket index) in
        level 0 (later levels keep more)."""
        return 63 + self.bucket_bits

    @property
    def intset_entries_needed(self) -> int:
        """Exact mode: the set-max-intset-entries that keeps buckets compact: Redis's
        default with levels; for a legacy plan, what keeps them intsets up to
        INTSET_HEADROOM times the planned capacity."""
        if self.bucket_fill:
            return max(DEFAULT_INTSET_ENTRIES, self.bucket_fill)
        fill = self.capacity / 2 ** self.bucket_bits
        return int(2 ** math.ceil(math.log2(max(128.0, fill * INTSET_HEADROOM))))

    def level_buckets(self, level: int) -> int:
        """Exact mode: buckets of ``level`` (as lua/exact.lua's dd_nb)."""
        if level == 0 or not self.bucket_fill:
            return 1 << self.bucket_bits
        return 1 << min(MAX_BUCKET_BITS, self.bucket_bits + level)

    def level_of(self, count: int) -> int:
        """Exact mode: the level being filled once ``count`` fingerprints were added
        (as lua/exact.lua's dd_level_of; always 0 for a legacy plan)."""
        if not self.bucket_fill:
            return 0
        level, total = 0, self.bucket_fill * self.level_buckets(0)
        while count >= total:
            level += 1
            total += self.bucket_fill * self.level_buckets(level)
        return level

    @property
    def level_capacity(self) -> int:
        """Exact mode: fingerprints level 0 holds (at least ``capacity``)."""
        return self.bucket_fill * 2 ** self.bucket_bits if self.bucket_fill else self.capacity

    def collision_probability(self, urls: float) -> float:
        """Exact mode: chance that any two of ``urls`` distinct URLs share a stored value
        (the birthday bound n^2 / 2^(w+1)), i.e. that one new URL is ever wrongly skipped."""
        return min(1.0, urls * urls / 2.0 ** (self.width_bits + 1))


def bucket_bits_for(capacity: int, fill: int = BUCKET_FILL) -> int:
    """Exact mode: the fewest bits b such that 2^b buckets of ``fill`` fingerprints hold
    ``capacity`` (between 4 and 24)."""
    return max(4, min(MAX_BUCKET_BITS, math.ceil(math.log2(max(1.0, capacity / fill)))))


def exact_spec(capacity: int, gen_ms: int = 0, gens: int = 0, *,
               legacy: bool = False) -> DedupeSpec:
    """The exact filter's plan for ``capacity`` URLs: levels of buckets of at most
    BUCKET_FILL, or (``legacy``) the plan of crawls created before levels."""
    if legacy:
        return DedupeSpec("exact", capacity, bucket_bits=bucket_bits_for(
            capacity, LEGACY_BUCKET_FILL), gen_ms=gen_ms, gens=gens)
    return DedupeSpec("exact", capacity, bucket_bits=bucket_bits_for(capacity),
                      gen_ms=gen_ms, gens=gens, bucket_fill=BUCKET_FILL)


def has_redisbloom(client: Any, probe_key: str = "redcrawl:probe") -> bool:
    """Whether the server has RedisBloom's BF.* commands (BF.EXISTS on a key that does not
    exist: 0 with the module, an unknown-command error without)."""
    try:
        client.execute_command("BF.EXISTS", probe_key, "x")
    except redis.exceptions.ResponseError:
        return False
    return True


def resolve_spec(settings: Settings, *, client: Any = None,
                 created: str | None = None) -> DedupeSpec:
    """The dedupe spec for these settings. ``created`` is the spec string a crawl was
    created with (if it exists): with ``bloom_backend=auto`` it decides between RedisBloom
    and the own filter, so every worker keeps using what the crawl started with; in exact
    mode, a crawl created with the legacy plan (no levels) for these settings keeps it."""
    gen_ms, gens = 0, 0
    if settings.recrawl_after > 0:
        gens = GENERATIONS
        gen_ms = max(1, math.ceil(settings.recrawl_after * 1000 / gens))
    capacity = settings.dedupe_capacity
    if settings.dedupe == "exact":
        legacy = exact_spec(capacity, gen_ms, gens, legacy=True)
        return legacy if created == legacy.encode() else exact_spec(capacity, gen_ms, gens)
    spec = DedupeSpec("bloom", capacity, settings.dedupe_error_rate, gen_ms=gen_ms, gens=gens)
    rbloom = replace(spec, mode="rbloom",
                     shards=2 ** math.ceil(math.log2(max(1, capacity / SHARD_CAPACITY))))
    backend = settings.bloom_backend
    if backend == "auto":
        if created is not None and created.split(" ", 1)[0] in ("bloom", "rbloom"):
            return rbloom if created.startswith("rbloom") else spec
        return rbloom if client is not None and has_redisbloom(client) else spec
    if backend == "redisbloom":
        if client is not None and not has_redisbloom(client):
            raise ConfigError("REDCRAWL_BLOOM_BACKEND", "redisbloom is asked for but the "
                              "server has no BF.* commands; load the RedisBloom module "
                              "(--loadmodule redisbloom.so) or use lua or auto")
        return rbloom
    return spec


def prelude(mode: Mode) -> tuple[str, ...]:
    """The Lua files defining ``dd_done_flags`` and ``dd_mark_done`` for ``mode`` (paths
    for :func:`redcrawl.scripts.source`)."""
    return ("dedupe/lua/common.lua", f"dedupe/lua/{mode}.lua")


def _filter_files(mode: Mode) -> tuple[str, ...]:
    return (scripts.BASE, "dedupe/lua/header.lua", *prelude(mode), "dedupe/lua/filter.lua")


def split(fp: bytes, bucket_bits: int) -> tuple[int, int]:
    """Exact mode, as ``lua/exact.lua`` does it: (bucket, 63-bit member) of a fingerprint
    among 2^bucket_bits buckets (level i of a spec has ``spec.level_buckets(i)``)."""
    if len(fp) != 20:
        raise ValueError(f"a fingerprint is 20 bytes, not {len(fp)}")
    bucket = int.from_bytes(fp[:3], "big") % (1 << bucket_bits)
    return bucket, int.from_bytes(fp[8:16], "big") & ((1 << 63) - 1)


def bucket_key(base: str, level: int, bucket: int) -> str:
    """Exact mode: the key of a bucket (``base`` includes the generation, if any)."""
    return f"{base}:{bucket}" if level == 0 else f"{base}:L{level}:{bucket}"


class Filter:
    """A dedupe filter used directly: ``check`` and ``add`` batches of 20-byte
    fingerprints in one round trip each. The frontier embeds the same Lua in its scripts;
    this class serves the standalone DupeFilter, ``import-dupefilter``, health checks and
    benchmarks. ``clock`` (ms) replaces the server clock for generations (tests)."""

    def __init__(self, client: Any, spec: DedupeSpec, base: str, *,
                 clock: Callable[[], int] | None = None) -> None:
        self.client = client
        self.spec = spec
        self.base = base
        self._clock = clock
        self._scripts = scripts.Scripts(client, {"filter": _filter_files(spec.mode)})

    def _run(self, op: str, fps: Sequence[bytes]) -> list[bool]:
        if not fps:
            return []
        bad = [fp for fp in fps if len(fp) != 20]
        if bad:
            raise ValueError(f"a fingerprint is 20 bytes, not {len(bad[0])}")
        now = "" if self._clock is None else str(int(self._clock()))
        out: list[bool] = []
        for i in range(0, len(fps), 10_000):
            flags = self._scripts.run("filter", [self.base],
                                      [self.spec.encode(), now, op, *fps[i:i + 10_000]],
                                      what=f"dedupe {op}")
            out += [c == ord("1") for c in bytes(flags)]
        return out

    def contains(self, fps: Sequence[bytes]) -> list[bool]:
        """For each fingerprint: is it in the filter (Bloom: probably)?"""
        return self._run("check", fps)

    def add(self, fps: Sequence[bytes]) -> list[bool]:
        """Add fingerprints; for each, True if it was new (not in the filter before, nor
        earlier in this batch)."""
        return self._run("add", fps)

    def redis_keys(self, count: int | None = None) -> list[bytes]:
        """Keys holding this filter (SCAN; up to ``count``)."""
        out: list[bytes] = []
        for key in self.client.scan_iter(match=f"{self.base}:*", count=1000):
            out.append(key)
            if count is not None and len(out) >= count:
                break
        return out

    def memory(self) -> int:
        """Bytes of Redis memory the filter's keys use (MEMORY USAGE, every key)."""
        total = 0
        keys = self.redis_keys()
        for i in range(0, len(keys), 1000):
            pipe = self.client.pipeline(transaction=False)
            for key in keys[i:i + 1000]:
                pipe.memory_usage(key, samples=0)
            total += sum(int(x or 0) for x in pipe.execute())
        return total

    def clear(self) -> int:
        """Delete the filter's keys; returns how many."""
        keys = self.redis_keys()
        for i in range(0, len(keys), 1000):
            self.client.unlink(*keys[i:i + 1000])
        return len(keys)

    def intset_limit(self) -> int | None:
        """The server's set-max-intset-entries, or None if CONFIG GET is not allowed."""
        try:
            raw = self.client.config_get("set-max-intset-entries")
        except redis.exceptions.ResponseError:
            return None
        value = raw.get("set-max-intset-entries") or raw.get(b"set-max-intset-entries")
        return int(value) if value is not None else None

    def configure(self) -> str | None:
        """Exact mode: raise the server's set-max-intset-entries to what the buckets need.
        Returns a warning if the server's limit is too low and could not be raised."""
        if self.spec.mode != "exact":
            return None
        need = self.spec.intset_entries_needed
        limit = self.intset_limit()
        if limit is not None and limit >= need:
            return None
        try:
            self.client.config_set("set-max-intset-entries", need)
            return None
        except redis.exceptions.ResponseError as exc:
            have = "unknown" if limit is None else str(limit)
            return (f"the exact dedupe filter needs set-max-intset-entries >= {need} (the "
                    f"server has {have}) and CONFIG SET was refused ({exc}); buckets beyond "
                    f"the limit silently become hash tables (about 7x the memory). Raise it "
                    f"in redis.conf (a CONFIG SET is lost at a restart)"
                    + ("" if self.spec.bucket_fill else
                       ", or start a new crawl: crawls created by this redcrawl version "
                       "keep their buckets under Redis's default (512)"))

    def health(self, sample: int = 64) -> list[str]:
        """Problems a running filter has: exact buckets that fell back from intset to
        hash-table encoding (sampled), or a server limit below what the buckets need."""
        if self.spec.mode != "exact":
            return []
        problems: list[str] = []
        need = self.spec.intset_entries_needed
        limit = self.intset_limit()
        if limit is not None and limit < need:
            problems.append(
                f"set-max-intset-entries is {limit}, below the {need} the exact filter's "
                f"buckets need at REDCRAWL_DEDUPE_CAPACITY={self.spec.capacity}; buckets "
                f"that outgrow {limit} become hash tables (about 7x the memory): CONFIG SET "
                f"set-max-intset-entries {need}")
        # random buckets of the current generation, named as lua/exact.lua names them
        # (no SCAN: that would walk the whole keyspace to find a new crawl's few buckets)
        base = self.base
        if self.spec.gen_ms:
            if self._clock is not None:
                now_ms = int(self._clock())
            else:
                sec, usec = self.client.time()
                now_ms = int(sec) * 1000 + int(usec) // 1000
            base = f"{base}:{now_ms // self.spec.gen_ms}"
        levels = [0]
        if self.spec.bucket_fill:  # and the level being filled
            raw = self.client.get(f"{base}:n")
            top = self.spec.level_of(int(raw)) if raw and raw.isdigit() else 0
            levels += [top] if top else []
        picked: list[str] = []
        for level in levels:
            buckets = self.spec.level_buckets(level)
            picked += [bucket_key(base, level, b)
                       for b in random.sample(range(buckets), min(sample, buckets))]
        pipe = self.client.pipeline(transaction=False)
        for key in picked:
            pipe.object("encoding", key)
        encodings = pipe.execute()
        fallen = [k for k, e in zip(picked, encodings, strict=True)
                  if e not in (b"intset", "intset", None)]
        if fallen:
            problems.append(
                f"{len(fallen)} of {len(picked)} sampled dedupe buckets are no longer "
                f"intsets (e.g. {fallen[0]}): they use about 7x the memory. "
                f"Raise the limit (CONFIG SET set-max-intset-entries {need}) so no more "
                f"buckets convert (Redis never converts a set back)"
                + ("" if self.spec.bucket_fill else
                   "; crawls created by this redcrawl version keep their buckets under "
                   "Redis's default (512)"))
        return problems


@dataclass(frozen=True, slots=True)
class ImportResult:
    read: int
    added: int
    """New in the filter (the rest were there already)."""
    invalid: int
    """Members that are not 40 hex digits (skipped)."""
    example: str | None = None
    """One invalid member, for the message."""


def import_hex_set(source: Any, key: str, target: Filter, *, batch: int = 10_000,
                   progress: Callable[[int], None] | None = None) -> ImportResult:
    """Stream a scrapy-redis dupefilter (a SET of 40-digit hex SHA-1 fingerprints) into
    ``target`` with SSCAN, one round trip per ``batch``. Safe on a live set and safe to
    repeat: SSCAN returns every member present for the whole scan, and re-adding is a no-op
    (members added meanwhile are picked up by running it again after switching over)."""
    kind = source.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind == "none":
        raise ConfigError("import-dupefilter", f"key {key!r} does not exist on the source "
                          "Redis; scrapy-redis names it '<spider>:dupefilter'")
    if kind != "set":
        raise ConfigError("import-dupefilter", f"key {key!r} is a {kind}, not the set of hex "
                          "fingerprints a scrapy-redis dupefilter is")
    read = added = invalid = 0
    example: str | None = None
    pending: list[bytes] = []

    def flush() -> None:
        nonlocal added
        added += sum(target.add(pending))
        pending.clear()

    for member in source.sscan_iter(key, count=batch):
        read += 1
        text = member.decode("ascii", "replace") if isinstance(member, bytes) else str(member)
        try:
            if len(text) != 40:
                raise ValueError
            pending.append(bytes.fromhex(text))
        except ValueError:
            invalid += 1
            example = example or text[:80]
            continue
        if len(pending) >= batch:
            flush()
            if progress is not None:
                progress(read)
    if pending:
        flush()
    return ImportResult(read, added, invalid, example)
