"""The fleet's robots.txt cache in Redis: one download per site for every worker.

Scrapy-free and synchronous (the Scrapy middleware, :mod:`redcrawl.scrapy.robots`, calls
it from a thread of its own). A worker that needs an origin's robots.txt calls
:meth:`RobotsCache.lookup`: it gets the cached entry, or the origin's lock (then it
downloads robots.txt and calls :meth:`RobotsCache.store`, which releases the lock), or
is told to ask again later because another worker holds the lock. Every step is one
Lua script (``politeness/lua/robots_*.lua``), lookups of many origins in one round trip.

Keys (all built by :class:`redcrawl.keys.CrawlKeys`):

=========================  ======  ====================================================
key                        type    holds
=========================  ======  ====================================================
``robots``                 HASH    origin -> entry (below)
``robots:exp``             ZSET    origin -> when its entry expires (ms, server clock)
``robots:bytes``           STRING  the bytes of every entry (bounded by ``max_bytes``)
``robots:lock:<origin>``   STRING  token of the worker fetching it (``SET NX PX``)
``polo``                   HASH    politeness key -> JSON override; ``crawl_delay`` set here
=========================  ======  ====================================================

A partitioned crawl (``REDCRAWL_PARTITIONS`` > 1) keeps the cache and the locks at its
anchor (``{crawl}``): robots.txt is per origin and crawl-wide, read only by workers (no
lease step looks at it), so one copy serves every partition and an origin is fetched once
whatever the partition of its sites. The ``crawl_delay`` goes to the ``polo`` of the
partition that owns the site's politeness key
(:func:`~redcrawl.politeness.autothrottle.owner_keys`), where its lease step reads it: a
second script (``robots_delay.lua``) in the same round as the store.

An entry is msgpack ``[1, status, zlib(body)]``: the HTTP status of the robots.txt
(0: the download failed) and its body (only for 2xx, at most ``REDCRAWL_ROBOTS_MAX_BODY``
bytes). Past ``max_bytes`` the entries closest to expiry are dropped; a dropped origin is
fetched again (once, under its lock) when next needed.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from redcrawl.keys import CrawlKeys
from redcrawl.politeness.autothrottle import CrawlPartitionsOf, owner_keys
from redcrawl.scripts import BASE, Scripts
from redcrawl.transport import redis_errors

__all__ = ["ENTRY_VERSION", "Lookup", "RobotsCache", "RobotsEntry", "Stored"]

ENTRY_VERSION = 1

_SOURCES = {
    "get": (BASE, "politeness/lua/robots_get.lua"),
    "put": (BASE, "politeness/lua/robots_put.lua"),
    "delay": (BASE, "politeness/lua/robots_delay.lua"),
    "renew": (BASE, "politeness/lua/robots_renew.lua"),
}


@dataclass(frozen=True, slots=True)
class RobotsEntry:
    """What a robots.txt download gave: its HTTP ``status`` (0 when the download failed)
    and, for a 2xx, its ``body`` (already cut to the size that is parsed)."""

    status: int
    body: bytes = b""

    @property
    def kind(self) -> Literal["rules", "allow", "error"]:
        """``rules``: parse the body (2xx, 3xx left after redirects); ``allow``: a 4xx,
        nothing is disallowed (as Scrapy and Google do); ``error``: 5xx, 429 (Too Many
        Requests: the site said nothing about its rules) or a failed download, nothing is
        disallowed (Scrapy's behaviour), cached for a shorter time."""
        if self.status in (0, 429) or self.status >= 500:
            return "error"
        if 400 <= self.status < 500:
            return "allow"
        return "rules"

    def encode(self) -> bytes:
        return bytes(msgpack.packb([ENTRY_VERSION, self.status, zlib.compress(self.body)]))

    @classmethod
    def decode(cls, raw: bytes) -> RobotsEntry | None:
        """The entry, or None when ``raw`` is not one this version can read."""
        try:
            version, status, body = msgpack.unpackb(raw)
            if version != ENTRY_VERSION or not isinstance(status, int):
                return None
            return cls(status, zlib.decompress(body))
        except (ValueError, TypeError, zlib.error, msgpack.UnpackException):
            return None


@dataclass(frozen=True, slots=True)
class Lookup:
    """The answer for one origin: ``cached`` (``entry``, valid ``ms_left`` more; ``entry``
    is None when it could not be decoded), ``fetch`` (the caller holds the lock: download
    and :meth:`RobotsCache.store`) or ``wait`` (another worker holds it, ``ms_left``)."""

    origin: str
    state: Literal["cached", "fetch", "wait"]
    entry: RobotsEntry | None = None
    ms_left: int = 0


@dataclass(frozen=True, slots=True)
class Stored:
    """What :meth:`RobotsCache.store` did: the entry ``stored`` (False: larger than the
    whole cache's bound), entries ``evicted`` to make room, the ``override`` written (1),
    unchanged (0) or left alone because it is not a JSON object (-1)."""

    stored: bool
    evicted: int
    override: int


class RobotsCache(CrawlPartitionsOf):
    """One crawl's robots.txt cache on ``client`` (see the module docstring).

    ``token`` identifies this worker's locks (default: random); ``lock_ttl`` is how long
    a lock lasts unless renewed (a worker killed while fetching delays the others that
    long at most); ``partitions``: the crawl's (None: read from its anchor when first
    needed)."""

    def __init__(
        self,
        client: Any,
        keys: CrawlKeys,
        *,
        max_bytes: int,
        lock_ttl: float = 30.0,
        token: str | None = None,
        partitions: int | None = None,
    ) -> None:
        self.client = client
        self._partitions = partitions
        self.keys = keys
        self.max_bytes = max_bytes
        self.lock_ttl_ms = max(1, int(lock_ttl * 1000))
        self.token = token or secrets.token_hex(8)
        self._scripts = Scripts(client, _SOURCES)

    def lookup(self, origins: Sequence[str]) -> list[Lookup]:
        """The cached entry of each origin, or its lock, or "wait": one round trip."""
        if not origins:
            return []
        k = self.keys
        with redis_errors("robots.txt lookup"):
            pipe = self.client.pipeline(transaction=False)
            for origin in origins:
                self._scripts["get"](
                    keys=[k.robots, k.robots_expiry, k.robots_lock(origin)],
                    args=[origin, self.token, self.lock_ttl_ms],
                    client=pipe,
                )
            replies = pipe.execute()
        found = []
        for origin, reply in zip(origins, replies, strict=True):
            code = int(reply[0])
            if code == 1:
                found.append(Lookup(origin, "cached", RobotsEntry.decode(reply[1]), int(reply[2])))
            elif code == 2:
                found.append(Lookup(origin, "fetch"))
            else:
                found.append(Lookup(origin, "wait", ms_left=int(reply[1])))
        return found

    def store(
        self,
        origin: str,
        entry: RobotsEntry,
        *,
        ttl: float,
        politeness_key: str,
        crawl_delay: float | None,
    ) -> Stored:
        """Cache ``entry`` for ``ttl`` seconds, release this worker's lock on ``origin``,
        and set ``crawl_delay`` (seconds, already capped; None removes it) in the override
        of ``politeness_key``, keeping its other fields."""
        k = self.keys
        n = self.partitions
        delay = "" if crawl_delay is None else repr(float(crawl_delay))
        with redis_errors("robots.txt store"):
            pipe = self.client.pipeline(transaction=n == 1)  # (one slot: one MULTI)
            self._scripts["put"](
                keys=[k.robots, k.robots_expiry, k.robots_bytes, k.robots_lock(origin)],
                args=[origin, entry.encode(), max(1, int(ttl * 1000)), self.token, self.max_bytes],
                client=pipe,
            )
            self._scripts["delay"](
                keys=[owner_keys(k, n, politeness_key).pol_override],
                args=[politeness_key, delay],
                client=pipe,
            )
            put, written = pipe.execute()
        return Stored(bool(put[0]), int(put[1]), int(written))

    def renew(self, origins: Sequence[str]) -> int:
        """Extend this worker's locks on ``origins`` (still being fetched); how many were
        still its own."""
        if not origins:
            return 0
        return int(
            self._scripts.run(
                "renew",
                [self.keys.robots_lock(o) for o in origins],
                [self.token, self.lock_ttl_ms],
                what="robots.txt lock renewal",
            )
        )
