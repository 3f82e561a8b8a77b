"""The dedupe spec of a crawl (:class:`DedupeSpec`: mode and sizes, fixed when the crawl is
created, one string for the Lua preludes), the plan math behind it (buckets and levels of
the exact filter, Bloom shards, recrawl generations) and :func:`resolve_spec`, which picks
it from the settings and what the crawl was created with.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from typing import Any, Literal

import redis.exceptions

from redcrawl.errors import ConfigError
from redcrawl.settings import Settings

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

    def hint(self, fp: bytes, base: bytes) -> bytes:
        """A fingerprint (or request id) as the frontier's ack takes it: with its member
        and level-0 bucket in exact mode (:func:`hinted`), as it is otherwise. ``base``:
        the filter's key base (``CrawlKeys.fp_done``), see :meth:`hints`."""
        if self.mode != "exact":
            return fp
        return hinted(fp, self.bucket_bits, b"" if self.gen_ms else base)

    def hints(self, fp: bytes, base: bytes) -> tuple[bytes, bytes]:
        """A pushed fingerprint's last two fields in the frontier scripts' ARGV: in exact
        mode its member and level-0 bucket (:func:`member_bucket`), the bucket as its key
        (``<base>:<bucket>``, so that Lua builds no key name) if the spec has no
        generations, as its number otherwise; ``b""`` twice in other modes."""
        if self.mode != "exact" or len(fp) != 20:
            return b"", b""
        member, bucket = member_bucket(fp, self.bucket_bits)
        return member, bucket if self.gen_ms else b"%s:%s" % (base, bucket)

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
        fill = self.capacity / 2**self.bucket_bits
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
        return self.bucket_fill * 2**self.bucket_bits if self.bucket_fill else self.capacity

    def collision_probability(self, urls: float) -> float:
        """Exact mode: chance that any two of ``urls`` distinct URLs share a stored value
        (the birthday bound n^2 / 2^(w+1)), i.e. that one new URL is ever wrongly skipped."""
        return min(1.0, urls * urls / 2.0 ** (self.width_bits + 1))


def bucket_bits_for(capacity: int, fill: int = BUCKET_FILL) -> int:
    """Exact mode: the fewest bits b such that 2^b buckets of ``fill`` fingerprints hold
    ``capacity`` (between 4 and 24)."""
    return max(4, min(MAX_BUCKET_BITS, math.ceil(math.log2(max(1.0, capacity / fill)))))


def exact_spec(
    capacity: int, gen_ms: int = 0, gens: int = 0, *, legacy: bool = False
) -> DedupeSpec:
    """The exact filter's plan for ``capacity`` URLs: levels of buckets of at most
    BUCKET_FILL, or (``legacy``) the plan of crawls created before levels."""
    if legacy:
        return DedupeSpec(
            "exact",
            capacity,
            bucket_bits=bucket_bits_for(capacity, LEGACY_BUCKET_FILL),
            gen_ms=gen_ms,
            gens=gens,
        )
    return DedupeSpec(
        "exact",
        capacity,
        bucket_bits=bucket_bits_for(capacity),
        gen_ms=gen_ms,
        gens=gens,
        bucket_fill=BUCKET_FILL,
    )


def has_redisbloom(client: Any, probe_key: str = "redcrawl:probe") -> bool:
    """Whether the server has RedisBloom's BF.* commands (BF.EXISTS on a key that does not
    exist: 0 with the module, an unknown-command error without). A Redis Cluster client
    refuses a command its nodes' COMMAND table lacks before sending it: no module either."""
    try:
        client.execute_command("BF.EXISTS", probe_key, "x")
    except redis.exceptions.ResponseError:
        return False
    except redis.exceptions.RedisError as exc:
        if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            raise
        return False  # (redis-py's cluster client: "BF.EXISTS command doesn't exist")
    return True


def resolve_spec(
    settings: Settings, *, client: Any = None, created: str | None = None
) -> DedupeSpec:
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
    rbloom = replace(
        spec, mode="rbloom", shards=2 ** math.ceil(math.log2(max(1, capacity / SHARD_CAPACITY)))
    )
    backend = settings.bloom_backend
    if backend == "auto":
        if created is not None and created.split(" ", 1)[0] in ("bloom", "rbloom"):
            return rbloom if created.startswith("rbloom") else spec
        return rbloom if client is not None and has_redisbloom(client) else spec
    if backend == "redisbloom":
        if client is not None and not has_redisbloom(client):
            raise ConfigError(
                "REDCRAWL_BLOOM_BACKEND",
                "redisbloom is asked for but the "
                "server has no BF.* commands; load the RedisBloom module "
                "(--loadmodule redisbloom.so) or use lua or auto",
            )
        return rbloom
    return spec


def split(fp: bytes, bucket_bits: int) -> tuple[int, int]:
    """Exact mode, as ``lua/exact.lua`` does it: (bucket, 63-bit member) of a fingerprint
    among 2^bucket_bits buckets (level i of a spec has ``spec.level_buckets(i)``)."""
    if len(fp) != 20:
        raise ValueError(f"a fingerprint is 20 bytes, not {len(fp)}")
    bucket = int.from_bytes(fp[:3], "big") % (1 << bucket_bits)
    return bucket, int.from_bytes(fp[8:16], "big") & ((1 << 63) - 1)


_MEMBER_MASK = (1 << 63) - 1


_HEAD_MEMBER = struct.Struct(">I4xQ")
"""A fingerprint's first 4 bytes (the bucket is their first 3) and bytes 8..16 (the
member), in one unpack: two slices and two ``int.from_bytes`` cost half as much again."""


def hinted(fp: bytes, bucket_bits: int, base: bytes = b"") -> bytes:
    """Exact mode: a fingerprint as the frontier's ack takes it from a client that knows
    the crawl's plan: the 20 bytes, one byte (the member's length), the member and the
    level-0 bucket of :func:`split` as decimal text (``dd_unhint`` in
    ``lua/common.lua``), so that Lua neither computes nor formats them (that cost
    ~1.3 us of Redis CPU per fingerprint per push or ack); with ``base`` (a spec without
    generations: the filter's key base), the bucket as its key ``<base>:<bucket>``.
    Anything not 20 bytes long (ids of requests without a fingerprint) is returned as it
    is."""
    if len(fp) != 20:
        return fp
    head, low = _HEAD_MEMBER.unpack_from(fp)
    member = b"%d" % (low & _MEMBER_MASK)
    bucket = (head >> 8) & ((1 << bucket_bits) - 1)
    if base:
        return b"%s%c%s%s:%d" % (fp, len(member), member, base, bucket)
    return b"%s%c%s%d" % (fp, len(member), member, bucket)


def member_bucket(fp: bytes, bucket_bits: int) -> tuple[bytes, bytes]:
    """Exact mode: the member and level-0 bucket of :func:`split` as decimal text, as a
    push sends them beside a 20-byte fingerprint (``op_push`` in
    ``frontier/lua/ops.lua``), so that Lua neither computes, formats nor cuts them out."""
    head, low = _HEAD_MEMBER.unpack_from(fp)
    return b"%d" % (low & _MEMBER_MASK), b"%d" % ((head >> 8) & ((1 << bucket_bits) - 1))


def bucket_key(base: str, level: int, bucket: int) -> str:
    """Exact mode: the key of a bucket (``base`` includes the generation, if any)."""
    return f"{base}:{bucket}" if level == 0 else f"{base}:L{level}:{bucket}"
