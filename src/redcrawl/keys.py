"""The only place that builds Redis key names.

Every key of a crawl carries the crawl's name as a Redis Cluster hash tag —
``{prefix}:{<crawl>}:<part>`` — so that all of a crawl's keys live in one slot and every
multi-key Lua script can run on a cluster. A crawl split into P > 1 partitions
(``REDCRAWL_PARTITIONS``) has one tag per partition, ``{<crawl>/<p>}`` (``/`` is not
allowed in crawl names, so no tag of one crawl is another's), and keeps its crawl-wide
anchor (layout, pause, lock, robots.txt cache, worker counters) under ``{<crawl>}``; a
request's partition is :func:`partition_of` its politeness key. Scripts get their keys through
:meth:`CrawlKeys.script_keys`, one fixed layout shared by every frontier script (the
order is mirrored by ``frontier/lua/lib.lua``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from redcrawl.errors import ConfigError

__all__ = [
    "CRAWL_NAME_PATTERN",
    "FINAL_TTL",
    "HISTORY_MINUTES",
    "HISTORY_TTL",
    "MAX_PARTITIONS",
    "CrawlKeys",
    "crawl_of_stats_key",
    "crawl_registry",
    "partition_of",
    "start_claims",
    "start_refused",
    "stats_key_pattern",
    "validate_crawl_name",
]

CRAWL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
"""What a crawl name may be (it is a Redis Cluster hash tag, so no braces). Match it whole
(``fullmatch``): ``$`` also matches before a final newline."""
_CRAWL_NAME = re.compile(CRAWL_NAME_PATTERN)

HISTORY_MINUTES = 60
"""Samples kept in :attr:`CrawlKeys.history` (one per minute: the last hour)."""
HISTORY_TTL = 2 * 3600
"""Seconds :attr:`CrawlKeys.history` outlives its last write."""
FINAL_TTL = 24 * 3600
"""Seconds :attr:`CrawlKeys.final` lives."""

CALL_SLOTS = 16
"""Slots per worker in the ``calls`` hash: more than the lease/settle calls a worker ever
has on their way at once (``lookahead`` <= 8). Lua's lib.lua has the same number."""


MAX_PARTITIONS = 1024
"""Most partitions a crawl may have (``REDCRAWL_PARTITIONS``)."""


def partition_of(key: str, partitions: int) -> int:
    """The partition of a request whose politeness key is ``key`` (its host, or
    ``meta["download_slot"]``) in a crawl of ``partitions`` partitions: the first 8 bytes
    of BLAKE2b(key) modulo ``partitions``. Part of a crawl's fixed layout: never change it."""
    if partitions <= 1:
        return 0
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def validate_crawl_name(name: str) -> str:
    """Return ``name`` if it is usable as a crawl name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not _CRAWL_NAME.fullmatch(name):
        raise ConfigError(
            "REDCRAWL_CRAWL",
            f"crawl name {name!r} must be 1-128 characters of letters, digits, '_', '.', ':' "
            "or '-', starting with a letter or digit (braces are not allowed: the name is "
            "used as a Redis Cluster hash tag)",
        )
    return name


@dataclass(frozen=True, slots=True)
class CrawlKeys:
    """Key names of one crawl. Build with ``CrawlKeys(crawl, prefix="rc", tiers=3)``;
    ``partition=p`` names partition ``p`` of a partitioned crawl (hash tag
    ``{<crawl>/<p>}``), None the crawl itself (``{<crawl>}``: a crawl of one partition, or
    a partitioned crawl's anchor)."""

    crawl: str
    prefix: str = "rc"
    tiers: int = 3
    partition: int | None = None

    def __post_init__(self) -> None:
        validate_crawl_name(self.crawl)
        if (
            not self.prefix
            or any(c in self.prefix for c in "{}*?[]\\")
            or not self.prefix.isprintable()
        ):
            # (braces: the hash tag; glob characters: a purge's SCAN patterns would match
            # another prefix's keys)
            raise ConfigError(
                "REDCRAWL_KEY_PREFIX",
                f"{self.prefix!r}: give a non-empty prefix without braces, glob characters "
                "(* ? [ ] \\) or control characters",
            )
        if not 1 <= self.tiers <= 16:
            raise ConfigError("REDCRAWL_TIERS", f"{self.tiers} tiers; use 1 to 16")
        if self.partition is not None and not 0 <= self.partition < MAX_PARTITIONS:
            raise ConfigError(
                "REDCRAWL_PARTITIONS", f"partition {self.partition}; use 0 to {MAX_PARTITIONS - 1}"
            )

    @property
    def tag(self) -> str:
        """The hash tag of every key named here: ``<crawl>`` or ``<crawl>/<partition>``."""
        return self.crawl if self.partition is None else f"{self.crawl}/{self.partition}"

    def part(self, partition: int) -> CrawlKeys:
        """The keys of partition ``partition`` of this (partitioned) crawl."""
        return CrawlKeys(self.crawl, self.prefix, self.tiers, partition)

    def _k(self, part: str) -> str:
        return f"{self.prefix}:{{{self.tag}}}:{part}"

    # --- request state -------------------------------------------------------------
    @property
    def req(self) -> str:
        """HASH id -> record ``<priority>|<attempts>|<lease token>|<envelope>``, for every
        request not yet DONE. A request's id is its fingerprint (so the hash is also the
        "queued" side of dedupe), or ``#<seq>``."""
        return self._k("req")

    @property
    def inflight(self) -> str:
        """ZSET lease token -> lease deadline (ms): one entry per ``lease()`` call."""
        return self._k("inflight")

    @property
    def leases(self) -> str:
        """HASH lease token -> msgpack ``[since_ms, worker, id, ...]``."""
        return self._k("leases")

    @property
    def left(self) -> str:
        """HASH lease token -> how many of its requests are still held."""
        return self._k("left")

    @property
    def delayed(self) -> str:
        """ZSET id -> due time (ms)."""
        return self._k("delayed")

    @property
    def dead(self) -> str:
        """ZSET id -> time it died (ms)."""
        return self._k("dead")

    @property
    def err(self) -> str:
        """HASH id -> last error text (retried and dead requests)."""
        return self._k("err")

    @property
    def stats(self) -> str:
        """HASH of counters: seq, leases, inflight, accepted, filtered, done, retried,
        reclaimed, died, requeued."""
        return self._k("stats")

    @property
    def workers(self) -> str:
        """HASH worker id -> heartbeat deadline (ms); a worker is alive until then."""
        return self._k("workers")

    @property
    def control(self) -> str:
        """HASH of crawl-wide switches: ``paused``, ``cursor`` (weighted-fair position),
        ``layout`` and ``layout.copy`` (the layout the crawl was created with, twice; a
        partitioned crawl's anchor holds ``partitioned/<P> - parts`` there, and each
        partition its own layout and a copy of ``paused`` and the politeness defaults),
        ``autothrottle`` (JSON, while the fleet runs AutoThrottle: see
        :mod:`redcrawl.politeness.autothrottle`)."""
        return self._k("control")

    @property
    def fp_done(self) -> str:
        """Key base of the filter of DONE fingerprints: its keys are ``<fp_done>:…``
        (buckets, generations, Bloom layers; see :mod:`redcrawl.dedupe`)."""
        return self._k("fpd")

    @property
    def calls(self) -> str:
        """HASH ``<worker id>#<slot>`` -> one of its last state-changing calls (nonce,
        outcome, what it leased; :data:`CALL_SLOTS` per worker; calls without a worker
        share 256 slots ``#~<n>``), so that a call retried
        after its reply was lost returns the same outcome instead of leasing again (an
        orphaned lease would stay held while its worker lives)."""
        return self._k("calls")

    def call_fields(self, worker: str) -> list[str]:
        """The fields of :attr:`calls` that ``worker``'s calls use."""
        return [f"{worker}#{slot}" for slot in range(CALL_SLOTS)]

    @property
    def fp_seen(self) -> str:
        """Key base of the filter of fingerprints seen by the standalone DupeFilter
        (used with another scheduler)."""
        return self._k("fps")

    def ready(self, tier: int) -> str:
        """LIST (fifo/lifo) or ZSET (priority) of ready request ids in ``tier``."""
        if not 0 <= tier < self.tiers:
            raise IndexError(tier)
        return self._k(f"ready:{tier}")

    def stream(self, shard: int, high: bool) -> str:
        """STREAM of the ready and leased request ids of ``shard`` (streams backend), one for
        high priority and one for the rest; consumer group ``g`` (one per crawl)."""
        if not 0 <= shard < 1024:
            raise IndexError(shard)
        return self._k(f"s:{shard}:{'h' if high else 'l'}")

    def streams(self, shards: int) -> list[str]:
        """Every stream of a crawl with ``shards`` shards: shard 0 high, shard 0 low, ..."""
        return [self.stream(s, h) for s in range(shards) for h in (True, False)]

    def stream_pattern(self) -> str:
        """SCAN pattern of every stream of the crawl, whatever its shard count."""
        return self._k("s:*")

    def lock(self, name: str) -> str:
        """STRING holding the owner token of the crawl-level lock ``name``."""
        return self._k(f"lock:{name}")

    def start_urls(self, name: str) -> str:
        """Key a ``RedisSpider`` reads start URLs from (scrapy-redis's ``%(name)s:start_urls``)."""
        return self._k(f"start:{name}")

    # --- politeness ----------------------------------------------------------------
    @property
    def pol_override(self) -> str:
        """HASH politeness key -> JSON object of what overrides the crawl's defaults for
        that key, every field optional: ``delay`` (seconds), ``concurrency`` (int),
        ``block_until`` (ms, server clock), ``paused`` (bool), set by operators (API, CLI);
        ``crawl_delay`` (seconds, already capped), set by the robots.txt middleware.
        Never expires; bounded by what operators and robots.txt set (AutoThrottle's delay
        is in :attr:`pol_state_base`'s hash, field ``ad``, which expires)."""
        return self._k("polo")

    @property
    def robots(self) -> str:
        """HASH robots.txt origin (``scheme://host:port``) -> the cached robots.txt: a
        msgpack entry (see :mod:`redcrawl.politeness.robots`), shared by the fleet; entries
        end with their time in :attr:`robots_expiry`. Bounded by
        ``REDCRAWL_ROBOTS_CACHE_MAX_BYTES`` (:attr:`robots_bytes`)."""
        return self._k("robots")

    @property
    def robots_expiry(self) -> str:
        """ZSET robots.txt origin -> when its :attr:`robots` entry expires (ms, server
        clock); expired entries are removed by the next store."""
        return self._k("robots:exp")

    @property
    def robots_bytes(self) -> str:
        """STRING: the bytes of every entry in :attr:`robots` (an integer)."""
        return self._k("robots:bytes")

    def robots_lock(self, origin: str) -> str:
        """STRING holding the token of the worker fetching ``origin``'s robots.txt for the
        fleet (``SET NX PX``; renewed while it fetches, deleted when it stores)."""
        return self._k(f"robots:lock:{origin}")

    # --- observation ---------------------------------------------------------------
    @property
    def final(self) -> str:
        """STRING (JSON): a finished crawl's counts and stats, left by the worker that
        removed its state (``SCHEDULER_PERSIST`` off), written after that purge, for
        ``redcrawl crawl`` to report; expires after :data:`FINAL_TTL` seconds."""
        return self._k("final")

    @property
    def history(self) -> str:
        """ZSET epoch minute (score) -> ``<minute>:<done>:<accepted>``: one sample of the
        crawl's counters per minute (the last one read in that minute), the last
        :data:`HISTORY_MINUTES` minutes, written when the dashboard is read; expires
        :data:`HISTORY_TTL` seconds after the last write (a purge deletes it)."""
        return self._k("hist")

    def worker_counters(self, worker: str) -> str:
        """HASH of one worker's counters, added with each of its heartbeats: ``pages``,
        ``ok``, ``failed``, ``bytes``, ``items`` (its totals) and ``pages_per_s``,
        ``success`` (over its last heartbeat interval); expires with its heartbeat
        deadline, so only live workers have one (see :mod:`redcrawl.scrapy.counters`)."""
        return self._k(f"wc:{worker}")

    def open(self, tier: int) -> str:
        """ZSET (lists crawls with politeness) politeness key -> the time (ms) it may next
        be served, for every key with ready requests in ``tier``; a key whose slots are
        all taken is scored 2^52 (it leaves the head until one of its leases ends)."""
        if not 0 <= tier < self.tiers:
            raise IndexError(tier)
        return self._k(f"open:{tier}")

    @property
    def pol_queue_base(self) -> str:
        """Key base of the per-key ready queues (lists crawls with politeness): the ready
        ids of politeness key ``K`` in tier ``t`` are ``<base><t>:<K>``, a LIST (fifo,
        lifo) or ZSET (priority), absent when empty. Built in Lua from this base, in the
        crawl's hash tag."""
        return self._k("pq:")

    @property
    def pol_state_base(self) -> str:
        """Key base of the per-key politeness state: ``<base><K>`` is a HASH ``in``
        (requests of key K in flight whose slot is not yet given back), ``next`` (ms:
        earliest next grant), ``block`` (ms, server clock: blocked until, after a 429/503),
        ``bset`` (ms: when that block was set), ``fail``/``ok`` (backoff state: consecutive
        failures, successes since the last step of forgiveness), ``rdy`` (ms: since
        when the key has had ready work without a grant), ``ad`` (ms: fleet-wide
        AutoThrottle's delay), ``chg`` (ms: the last fetch start charged after a wait,
        ``frontier/lua/charge.lua``) and ``tm`` (the tiers where the key has ready
        requests, a bit per tier; absent: unknown, every tier); it expires once the key is
        idle (nothing in flight, no ready request) and its ``next`` and ``block`` have
        passed."""
        return self._k("pol:")

    @property
    def pol_slots(self) -> str:
        """HASH politeness key -> JSON ``{concurrency, delay, randomize_delay}``: the
        crawl's per-key settings (Scrapy's ``DOWNLOAD_SLOTS``), written by workers at start;
        the field ``""`` -> JSON ``{concurrency, delay, randomize}``: the crawl's defaults
        (``CONCURRENT_REQUESTS_PER_DOMAIN``, ``DOWNLOAD_DELAY``, ``RANDOMIZE_DOWNLOAD_DELAY``),
        kept from the crawl's first worker. Operators' and robots.txt's values go to
        :attr:`pol_override`, which wins."""
        return self._k("pols")

    @property
    def pol_blocked(self) -> str:
        """ZSET politeness key -> blocked until (ms, server clock): the keys a 429/503 has
        blocked (the same time as their state's ``block``), pruned by the lease step as
        blocks end (``ZCOUNT <key> <now> +inf``: keys blocked now)."""
        return self._k("polb")

    @property
    def deferrals(self) -> str:
        """HASH request id -> how many times it was deferred (429/503: back to READY, no
        attempt spent), for requests not yet DONE or DEAD (capped by
        ``REDCRAWL_MAX_DEFERRALS``)."""
        return self._k("defers")

    # --- layouts -------------------------------------------------------------------
    def script_keys(self, shards: int | None = None, *, polite: bool = False) -> list[str]:
        """KEYS of every frontier script, in the order ``lua/lib.lua`` expects: the fixed
        keys, then the ready tiers (lists) or, given ``shards``, the streams (streams).
        ``polite`` (lists): then the ``open`` zset of each tier, the per-key queue base,
        the per-key state base, :attr:`pol_override`, :attr:`pol_slots`,
        :attr:`pol_blocked` and :attr:`deferrals`."""
        if shards is not None:
            return [*self.script_keys()[: -self.tiers], *self.streams(shards)]
        if polite:
            return [*self.script_keys(), *self.politeness_script_keys()]
        return [
            self.req,
            self.inflight,
            self.leases,
            self.left,
            self.delayed,
            self.dead,
            self.err,
            self.stats,
            self.workers,
            self.control,
            self.fp_done,
            self.calls,
            *(self.ready(t) for t in range(self.tiers)),
        ]

    def politeness_script_keys(self) -> list[str]:
        """The politeness keys that end the KEYS of a crawl with politeness (both backends;
        ``lua/polite.lua``): the ``open`` zset of each tier, the per-key queue base, the
        per-key state base, :attr:`pol_override`, :attr:`pol_slots`, :attr:`pol_blocked`
        and :attr:`deferrals`."""
        return [
            *(self.open(t) for t in range(self.tiers)),
            self.pol_queue_base,
            self.pol_state_base,
            self.pol_override,
            self.pol_slots,
            self.pol_blocked,
            self.deferrals,
        ]

    def all_keys(self) -> list[str]:
        """Every fixed-name key of the crawl's state (``purge`` deletes these, then the
        dedupe filters' keys under :attr:`fp_done` and :attr:`fp_seen`), for every
        possible number of tiers: the frontier's, the robots.txt cache and the dashboard
        history. Keys that expire by themselves (a worker's :meth:`worker_counters`, a
        :meth:`robots_lock`) are left to expire."""
        every_tier = CrawlKeys(self.crawl, self.prefix, 16, self.partition)
        return [
            *self.script_keys()[: -self.tiers],
            *(every_tier.ready(t) for t in range(16)),
            *(every_tier.open(t) for t in range(16)),
            self.pol_override,
            self.pol_slots,
            self.pol_blocked,
            self.deferrals,
            self.robots,
            self.robots_expiry,
            self.robots_bytes,
            self.history,
            self.final,
        ]

    def pol_patterns(self) -> list[str]:
        """SCAN patterns of the per-key politeness keys (queues and state): purge."""
        return [self.pol_queue_base + "*", self.pol_state_base + "*"]


def crawl_registry(prefix: str = "rc") -> str:
    """SET of the names of the crawls under ``prefix``: a frontier adds its crawl at its
    first push (readers find crawls there instead of a SCAN: metrics/registry.py), and
    the member ``{complete}`` (no crawl name has braces) once a full SCAN added every
    crawl created before the registry. No hash tag: one key for every crawl."""
    return f"{prefix}:crawls"


def stats_key_pattern(prefix: str = "rc") -> str:
    """SCAN pattern matching the stats hash of every crawl under ``prefix`` (every crawl
    that ever accepted a request has one)."""
    return f"{prefix}:{{*}}:stats"


def crawl_of_stats_key(key: bytes | str, prefix: str = "rc") -> str | None:
    """The crawl name in a key matched by :func:`stats_key_pattern`, or None."""
    text = key.decode() if isinstance(key, bytes) else key
    head, tail = f"{prefix}:{{", "}:stats"
    if not (text.startswith(head) and text.endswith(tail)):
        return None
    name = text[len(head) : -len(tail)]
    return name if _CRAWL_NAME.fullmatch(name) else None


# --- RedisSpider start keys --------------------------------------------------------------
# A spider's start key is named by the project (scrapy-redis's ``%(name)s:start_urls``), not
# by a crawl: the keys kept beside it take its Redis Cluster slot from its name.


def _beside(start_key: str, part: str) -> str:
    """``<start key>:<part>`` in the start key's cluster slot: the start key's own hash tag
    when it has one (``rc:{shop}:start_urls`` -> ``rc:{shop}:start_urls:<part>``), else the
    whole start key name as the tag (``shop:start_urls`` ->
    ``shop:start_urls:{shop:start_urls}:<part>``: Redis hashes a key without a tag whole,
    so a tag of the whole name is the same slot). Either way the name starts with the
    start key's, so an ACL key pattern like ``~rc:*`` that covers the start key covers it
    (except for a name with a ``{`` but no tag: ``{<start key>}:<part>``)."""
    if not start_key:
        raise ConfigError("REDIS_START_URLS_KEY", "the start key name is empty: name one")
    opening = start_key.find("{")
    closing = start_key.find("}", opening + 1) if opening != -1 else -1
    if opening != -1 and closing > opening + 1:
        return f"{start_key}:{part}"  # a hash tag: Redis hashes only it
    if "}" in start_key:
        raise ConfigError(
            "REDIS_START_URLS_KEY",
            f"start key {start_key!r} has a '}}' but no hash tag, so no key beside it can "
            "share its Redis Cluster slot; rename it without braces, or with a tag such "
            "as '{%(name)s}:start_urls'",
        )
    if opening != -1:  # a '{' without a tag: the name must start with the tag's '{'
        return f"{{{start_key}}}:{part}"
    return f"{start_key}:{{{start_key}}}:{part}"


def start_claims(start_key: str) -> str:
    """HASH ``<worker>#<seq>`` -> msgpack array of the entries one batch of a RedisSpider
    took off ``start_key`` (a sorted set's as member, score, member, score, ...), until the
    requests made from them are stored in the frontier; a stopped worker's claims go back
    to the start key (``lua/start_recover.lua``). In the start key's slot (:func:`_beside`)."""
    return _beside(start_key, "claimed")


def start_refused(start_key: str) -> str:
    """LIST of the entries of ``start_key`` a RedisSpider refused (bad JSON, URL, scheme or
    callback), newest first, each a JSON object ``{"entry", "reason", "worker", "time"}``;
    capped (``redcrawl.scrapy.spiders.REFUSED_MAX``). In the start key's slot
    (:func:`_beside`)."""
    return _beside(start_key, "refused")
