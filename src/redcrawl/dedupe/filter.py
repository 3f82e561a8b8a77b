"""The dedupe :class:`Filter` used directly from Python, and the Lua files that implement
each mode (:func:`prelude`, loaded through the :mod:`redcrawl.scripts` registry; the
frontier prepends the same files to its own scripts).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import redis.exceptions

from redcrawl import scripts
from redcrawl.dedupe.spec import DedupeSpec, Mode, bucket_key
from redcrawl.transport import redis_errors


def prelude(mode: Mode) -> tuple[str, ...]:
    """The Lua files defining ``dd_done_flags`` and ``dd_mark_done`` for ``mode`` (paths
    for :func:`redcrawl.scripts.source`)."""
    return ("dedupe/lua/common.lua", f"dedupe/lua/{mode}.lua")


def _filter_files(mode: Mode) -> tuple[str, ...]:
    return (scripts.BASE, "dedupe/lua/header.lua", *prelude(mode), "dedupe/lua/filter.lua")


class Filter:
    """A dedupe filter used directly: ``check`` and ``add`` batches of 20-byte
    fingerprints in one round trip each. The frontier embeds the same Lua in its scripts;
    this class serves the standalone DupeFilter, ``import-dupefilter``, health checks and
    benchmarks. ``clock`` (ms) replaces the server clock for generations (tests)."""

    def __init__(
        self, client: Any, spec: DedupeSpec, base: str, *, clock: Callable[[], int] | None = None
    ) -> None:
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
            flags = self._scripts.run(
                "filter",
                [self.base],
                [self.spec.encode(), now, op, *fps[i : i + 10_000]],
                what=f"dedupe {op}",
            )
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
        with redis_errors("listing the dedupe filter's keys"):
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
            for key in keys[i : i + 1000]:
                pipe.memory_usage(key, samples=0)
            with redis_errors("measuring the dedupe filter"):
                total += sum(int(x or 0) for x in pipe.execute())
        return total

    def clear(self) -> int:
        """Delete the filter's keys; returns how many."""
        keys = self.redis_keys()
        with redis_errors("deleting the dedupe filter"):
            for i in range(0, len(keys), 1000):
                self.client.unlink(*keys[i : i + 1000])
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
            return (
                f"the exact dedupe filter needs set-max-intset-entries >= {need} (the "
                f"server has {have}) and CONFIG SET was refused ({exc}); buckets beyond "
                f"the limit silently become hash tables (about 7x the memory). Raise it "
                f"in redis.conf (a CONFIG SET is lost at a restart)"
                + (
                    ""
                    if self.spec.bucket_fill
                    else ", or start a new crawl: crawls created by this redcrawl version "
                    "keep their buckets under Redis's default (512)"
                )
            )

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
                f"set-max-intset-entries {need}"
            )
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
            picked += [
                bucket_key(base, level, b)
                for b in random.sample(range(buckets), min(sample, buckets))
            ]
        pipe = self.client.pipeline(transaction=False)
        for key in picked:
            pipe.object("encoding", key)
        encodings = pipe.execute()
        fallen = [
            k
            for k, e in zip(picked, encodings, strict=True)
            if e not in (b"intset", "intset", None)
        ]
        if fallen:
            problems.append(
                f"{len(fallen)} of {len(picked)} sampled dedupe buckets are no longer "
                f"intsets (e.g. {fallen[0]}): they use about 7x the memory. "
                f"Raise the limit (CONFIG SET set-max-intset-entries {need}) so no more "
                f"buckets convert (Redis never converts a set back)"
                + (
                    ""
                    if self.spec.bucket_fill
                    else "; crawls created by this redcrawl version keep their buckets under "
                    "Redis's default (512)"
                )
            )
        return problems
