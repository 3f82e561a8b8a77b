# Over 450 lines on purpose: data, one row per setting (parsers in model.py, notes in notes.py).
"""The table of settings: every setting's name, parser, documentation and scrapy-redis
aliases (:data:`SPECS`), the scrapy-redis names redcrawl ignores and why, and the value
parsers. ``docs/settings.md`` is generated from this table (with the defaults, which are the
fields of :class:`~redcrawl.settings.Settings`) by ``scripts/gen_settings_doc.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from redcrawl.errors import ConfigError

Ordering = Literal["fifo", "lifo", "priority"]

# scrapy-redis 0.9.1's queue classes (scrapy_redis.queue) and what they mean here.
_SCRAPY_REDIS_QUEUES: dict[str, Ordering] = {
    "PriorityQueue": "priority",
    "SpiderPriorityQueue": "priority",
    "FifoQueue": "fifo",
    "SpiderQueue": "fifo",
    "LifoQueue": "lifo",
    "SpiderStack": "lifo",
}
ORDER_NAMES: dict[Ordering, str] = {"priority": "strict priority", "fifo": "fifo", "lifo": "lifo"}
QUEUE_CLASSES: dict[str, Ordering] = {
    # SCHEDULER_QUEUE_CLASS values (scrapy-redis's classes and our own names) -> ordering
    **{f"scrapy_redis.queue.{name}": order for name, order in _SCRAPY_REDIS_QUEUES.items()},
    "fifo": "fifo",
    "lifo": "lifo",
    "priority": "priority",
}

PRIORITY_LIMIT = 1_000_000
"""Request priorities must lie in [-PRIORITY_LIMIT, PRIORITY_LIMIT]."""


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(name, f"{v!r} is not a boolean; use true/false, 1/0, yes/no")


def _number(
    kind: type[int] | type[float], low: float, high: float | None = None
) -> Callable[[str, Any], Any]:
    def parse(name: str, v: Any) -> Any:
        if isinstance(v, bool):
            raise ConfigError(name, f"{v!r} is not a number")
        try:
            n = kind(v) if kind is float or isinstance(v, int) else int(str(v).strip(), 10)
        except (TypeError, ValueError):
            raise ConfigError(name, f"{v!r} is not {'an integer' if kind is int else 'a number'}")
        if not math.isfinite(n) or n < low or (high is not None and n > high):
            bound = f">= {low}" if high is None else f"between {low} and {high}"
            raise ConfigError(name, f"{n} is out of range; use a value {bound}")
        return n

    return parse


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ConfigError(name, f"{v!r} is not a string")
    return v


def _opt_str(name: str, v: Any) -> str | None:
    return None if v is None or v == "" else _str(name, v)


def _int_tuple(name: str, v: Any) -> tuple[int, ...]:
    items: Iterable[Any] = v.split(",") if isinstance(v, str) else v
    try:
        return tuple(int(str(x).strip()) for x in items)
    except (TypeError, ValueError):
        raise ConfigError(name, f"{v!r} is not a comma-separated list of integers")


def _status_tuple(name: str, v: Any) -> tuple[int, ...]:
    """HTTP statuses, comma-separated (empty: none)."""
    items: Iterable[Any] = v.split(",") if isinstance(v, str) else v
    codes = _int_tuple(name, [x for x in items if str(x).strip()])
    if any(not 100 <= c <= 599 for c in codes):
        raise ConfigError(name, f"{v!r}: give HTTP statuses (100 to 599)")
    return codes


def _str_tuple(name: str, v: Any) -> tuple[str, ...]:
    items: Iterable[Any] = v.split(",") if isinstance(v, str) else v
    return tuple(s for s in (str(x).strip() for x in items) if s)


def _tokens(name: str, v: Any) -> tuple[str, ...]:
    """A token list: set but naming no token (``,,,``) is a mistake, not "no auth"."""
    tokens = _str_tuple(name, v)
    if not tokens and isinstance(v, str) and v.strip():
        raise ConfigError(
            name,
            f"{v!r} names no token; give comma-separated tokens (at least 16 characters "
            "each), or leave it empty for none",
        )
    return tokens


def parse_dict(name: str, v: Any) -> dict[str, Any]:
    if isinstance(v, str):
        try:
            v = json.loads(v) if v.strip() else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(name, f"not valid JSON ({exc}); give a JSON object")
    if not isinstance(v, Mapping):
        raise ConfigError(name, f"{v!r} is not a mapping")
    return dict(v)


_SLOT_NUMBERS: dict[str, tuple[type, float]] = {"concurrency": (int, 1), "delay": (float, 0.0)}


def _slots(name: str, v: Any) -> dict[str, Any]:
    """DOWNLOAD_SLOTS: key -> {concurrency, delay, randomize_delay or jitter}, as Scrapy
    reads them. Every entry is checked here, before a worker starts (the frontier would
    silently use the defaults for a value it cannot read). Scrapy 2.19's ``jitter`` (a
    magnitude, 0 for none) becomes ``randomize_delay``, which the frontier reads."""
    slots = parse_dict(name, v)
    out: dict[str, Any] = {}
    for key, entry in slots.items():
        example = 'like {"concurrency": 1, "delay": 2.0}'
        if not isinstance(entry, Mapping):
            raise ConfigError(name, f"the entry {key!r} is {entry!r}; give a mapping {example}")
        entry = dict(entry)
        for field, (kind, low) in _SLOT_NUMBERS.items():
            value = entry.get(field)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if value is not None and (
                not ok or value < low or (kind is int and value != int(value))
            ):
                want = "a whole number of at least 1" if kind is int else "seconds, at least 0"
                raise ConfigError(name, f"{key!r}: {field} is {value!r}; give {want}")
        if "randomize_delay" in entry and not isinstance(entry["randomize_delay"], bool):
            raise ConfigError(
                name, f"{key!r}: randomize_delay is {entry['randomize_delay']!r}; give true/false"
            )
        if "jitter" in entry:
            jitter = entry.pop("jitter")
            if isinstance(jitter, bool) or not isinstance(jitter, int | float) or jitter < 0:
                raise ConfigError(name, f"{key!r}: jitter is {jitter!r}; give 0 or more")
            entry["randomize_delay"] = bool(jitter)  # it wins, as in Scrapy
            if jitter:
                entry["jitter"] = float(jitter)  # its range
        out[str(key)] = entry
    return out


def _ordering(name: str, v: Any) -> Ordering:
    if isinstance(v, type):
        v = f"{v.__module__}.{v.__qualname__}"
    s = str(v).strip()
    if s in QUEUE_CLASSES:
        return QUEUE_CLASSES[s]
    known = ", ".join(_SCRAPY_REDIS_QUEUES)
    if s.startswith("scrapy_redis."):
        raise ConfigError(
            name,
            f"{s!r} is not a queue class of scrapy-redis 0.9.1 (those "
            f"are {known}, in scrapy_redis.queue, and redcrawl maps each "
            "onto an ordering); name one of them, or remove the setting "
            "and set REDCRAWL_ORDERING to fifo, lifo or priority",
        )
    if "." in s:
        raise ConfigError(
            name,
            f"{s!r}: redcrawl keeps requests in its own frontier and "
            "cannot use another queue class; remove the setting and set "
            "REDCRAWL_ORDERING to fifo, lifo or priority (scrapy-redis's "
            f"classes {known} are mapped onto these)",
        )
    raise ConfigError(name, f"{s!r} is not an ordering; use fifo, lifo or priority")


def _choice(*options: str) -> Callable[[str, Any], str]:
    def parse(name: str, v: Any) -> str:
        s = str(v).strip().lower()
        if s not in options:
            raise ConfigError(name, f"{v!r} is not one of {', '.join(options)}")
        return s

    return parse


def _opt_choice(*options: str) -> Callable[[str, Any], str | None]:
    strict = _choice(*options)

    def parse(name: str, v: Any) -> str | None:
        return None if v is None or str(v).strip() == "" else strict(name, v)

    return parse


def _path(name: str, v: Any) -> Path:
    return Path(str(v)).expanduser()


@dataclass(frozen=True, slots=True)
class Spec:
    field: str
    parse: Callable[[str, Any], Any]
    doc: str
    aliases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"REDCRAWL_{self.field.upper()}"


SPECS: tuple[Spec, ...] = (
    Spec(
        "redis_url",
        _opt_str,
        "Redis URL (redis://, rediss:// for TLS, user:password@ for "
        "ACL, unix://; redis+cluster://host:port[,host:port...] or rediss+cluster:// for a "
        "Redis Cluster, see docs/cluster.md). Unset: an embedded Redis is started with its "
        "data in EMBEDDED_DIR.",
        ("REDIS_URL",),
    ),
    Spec(
        "redis_host",
        _opt_str,
        "Host, used when no URL is set (as in scrapy-redis, "
        "REDIS_HOST, REDIS_PORT or REDIS_DB alone select a server: localhost:6379 when "
        "not given).",
        ("REDIS_HOST",),
    ),
    Spec(
        "redis_port",
        _number(int, 1, 65535),
        "Port, used when no URL is set (with REDIS_HOST, or alone: localhost, as in scrapy-redis).",
        ("REDIS_PORT",),
    ),
    Spec(
        "redis_db",
        _number(int, 0, 1 << 20),
        "Database number: used with REDIS_HOST / "
        "REDIS_PORT, or with a URL that names none (as in scrapy-redis).",
        ("REDIS_DB",),
    ),
    Spec(
        "redis_params",
        parse_dict,
        "Extra keyword arguments for the redis-py client (JSON). "
        "Its url, host, port and db keys count as REDIS_URL, REDIS_HOST, REDIS_PORT and "
        "REDIS_DB (which win over them), as in scrapy-redis.",
        ("REDIS_PARAMS",),
    ),
    Spec("embedded_dir", _path, "Folder of the embedded Redis (data, AOF, socket)."),
    Spec(
        "crawl",
        _opt_str,
        "Crawl name: the frontier shared by workers. Default: the "
        "spider's name (scrapy-redis's SCHEDULER_QUEUE_KEY template is honoured).",
        ("SCHEDULER_QUEUE_KEY",),
    ),
    Spec(
        "key_prefix",
        _str,
        "Prefix of every Redis key (no braces, glob characters `* ? [ ] \\` or control "
        "characters).",
    ),
    Spec(
        "backend",
        _choice("lists", "streams"),
        "Frontier backend: lists (tiered Redis "
        "lists, weighted fair tiers, fifo/lifo/priority) or streams (Redis Streams sharded by "
        "domain, consumer groups, high/low priority streams; needs Redis 6.2+ and ordering "
        "fifo). Fixed per crawl; see docs/streams.md.",
    ),
    Spec(
        "shards",
        _number(int, 1, 1024),
        "Streams backend: number of shards (a request goes "
        "to the shard of a hash of its URL's host). Fixed per crawl.",
    ),
    Spec(
        "partitions",
        _number(int, 1, 1024),
        "Partitions of a crawl, each with its own Redis Cluster hash tag "
        "(rc:{crawl/p}:...), so that a cluster spreads one crawl over its masters; a "
        "request goes to the partition of a hash of its politeness key (host, or "
        "meta['download_slot']). 1 keeps the one-tag layout (rc:{crawl}:...). Fixed per "
        "crawl; see docs/cluster.md.",
    ),
    Spec(
        "ordering",
        _ordering,
        "fifo, lifo or priority (strict). scrapy-redis queue classes map onto them.",
        ("SCHEDULER_QUEUE_CLASS",),
    ),
    Spec(
        "tier_weights",
        _int_tuple,
        "Weights of the priority tiers, highest first, popped by weighted fair choice (fifo/lifo).",
    ),
    Spec(
        "tier_bounds",
        _int_tuple,
        "Lowest priority of each tier but the last, highest "
        "first: with (1, 0), priority >= 1 is high, 0 is mid, < 0 is low.",
    ),
    Spec(
        "lease_ttl",
        _number(float, 0.05),
        "Seconds a leased request stays owned by its "
        "worker without a heartbeat before it returns to the queue.",
    ),
    Spec(
        "heartbeat_interval",
        _number(float, 0.01),
        "Seconds between worker heartbeats (default: a third of LEASE_TTL).",
    ),
    Spec(
        "max_attempts",
        _number(int, 1, 1000),
        "Deliveries before a failing request is dead-lettered.",
    ),
    Spec(
        "retry_backoff", _number(float, 0.0), "Base retry delay in seconds (doubles per attempt)."
    ),
    Spec("retry_backoff_max", _number(float, 0.0), "Upper bound of the retry delay."),
    Spec("batch_size", _number(int, 1, 10_000), "Requests per push/lease/ack round trip."),
    Spec(
        "prefetch",
        _number(int, 1, 10_000),
        "Requests a worker leases ahead of Scrapy's demand (its local buffer).",
    ),
    Spec(
        "lookahead",
        _number(int, 0, 8),
        "Batches of PREFETCH leased requests a worker's "
        "I/O thread keeps ready ahead of Scrapy's demand while the crawl has ready work, "
        "so that Scrapy never waits for a lease. 0: lease only when the local buffer is "
        "empty.",
    ),
    Spec(
        "poll_interval",
        _number(float, 0.01),
        "Seconds between lease attempts while the frontier has nothing ready for this worker.",
    ),
    Spec(
        "redis_outage_limit",
        _number(float, 1.0),
        "Seconds a worker goes on without "
        "Redis (downloading and parsing what it holds, its calls retried on a thread of "
        "their own) before it closes with reason redis_unavailable and a non-zero exit "
        "code; its leases come back to the crawl when they expire.",
    ),
    Spec(
        "wait_replicas",
        _number(int, 0, 16),
        "Replicas that must have received each state change of a worker (push, lease, "
        "settle, nack, release) before the call returns: a Redis WAIT on the crawl's "
        "master, sent with the call. 0: off (Redis replicates asynchronously; a failover "
        "can undo a master's last writes, see docs/cluster.md, Durability). Fewer "
        "replicas within WAIT_TIMEOUT is a warning and the stat redcrawl/replicas_short, "
        "not a failure.",
    ),
    Spec(
        "wait_timeout",
        _number(float, 0.001, 10.0),
        "Seconds each WAIT of WAIT_REPLICAS waits for the replicas at most; the call "
        "then goes on with fewer (e.g. a master whose replica died or was promoted away).",
    ),
    Spec(
        "retry_http_codes",
        _int_tuple,
        "HTTP statuses that, still failing after Scrapy's own "
        "retries, send the request back with backoff (then to the dead letters). Default: "
        "Scrapy's RETRY_HTTP_CODES.",
        ("RETRY_HTTP_CODES",),
    ),
    Spec("worker_id", _opt_str, "This worker's id (default: host:pid:random)."),
    Spec("persist", _bool, "Keep the frontier after the crawl closes.", ("SCHEDULER_PERSIST",)),
    Spec(
        "flush_on_start",
        _bool,
        "Empty the crawl's frontier once, when the crawl starts.",
        ("SCHEDULER_FLUSH_ON_START",),
    ),
    Spec(
        "idle_before_close",
        _number(float, 0.0),
        "Seconds the whole crawl must stay finished before workers close.",
        ("SCHEDULER_IDLE_BEFORE_CLOSE",),
    ),
    Spec(
        "dupefilter_key",
        _opt_str,
        "Accepted for scrapy-redis compatibility; the fingerprints live under the crawl's keys.",
        ("SCHEDULER_DUPEFILTER_KEY",),
    ),
    Spec(
        "canonicalize",
        _bool,
        "Canonicalise URLs (drop tracking parameters, normalise) "
        "before fingerprinting. Off: fingerprints equal Scrapy's.",
    ),
    Spec(
        "canonical_drop_params",
        _str_tuple,
        "Query parameters dropped by canonicalisation (glob patterns).",
    ),
    Spec(
        "start_urls_key",
        _str,
        "Key RedisSpider reads start URLs from (a template with "
        "%(name)s, the spider's name; as in scrapy-redis).",
        ("REDIS_START_URLS_KEY",),
    ),
    Spec(
        "start_urls_as_set",
        _bool,
        "Start URLs key is a set (popped with SPOP).",
        ("REDIS_START_URLS_AS_SET",),
    ),
    Spec(
        "start_urls_as_zset",
        _bool,
        "Start URLs key is a sorted set, highest score first (popped with ZPOPMAX).",
        ("REDIS_START_URLS_AS_ZSET",),
    ),
    Spec(
        "start_urls_batch_size",
        _number(int, 1, 100_000),
        "Start URLs read per batch.",
        ("REDIS_START_URLS_BATCH_SIZE",),
    ),
    Spec(
        "items_uri",
        _str,
        "Where UpsertPipeline writes items: sqlite:///path.db or postgresql://user:pass@host/db.",
    ),
    Spec("items_table", _str, "UpsertPipeline's table."),
    Spec("item_key", _str, "The item field that identifies an item (one row per value)."),
    Spec(
        "dedupe",
        _choice("exact", "bloom"),
        "How DONE fingerprints "
        "are remembered: exact (compact integer sets, ~9 B/URL, no false positives) or "
        "bloom (~1.2 B/URL at 1%; may skip that fraction of new URLs). Fixed per crawl.",
    ),
    Spec(
        "dedupe_capacity",
        _number(int, 1000),
        "URLs the crawl is expected to reach: sizes "
        "the exact filter's buckets and the Bloom filter's first layer (both keep working "
        "beyond it). Fixed per crawl.",
    ),
    Spec(
        "dedupe_error_rate",
        _number(float, 1e-9, 0.5),
        "Bloom mode: false-positive rate "
        "of the first layer (later layers are tighter, so the total stays below twice it).",
    ),
    Spec(
        "bloom_backend",
        _choice("auto", "redisbloom", "lua"),
        "Bloom mode: the server's RedisBloom module (BF.*) or redcrawl's own bitmaps in "
        "Lua; auto uses RedisBloom when the server has it loaded.",
    ),
    Spec(
        "recrawl_after",
        _number(float, 0.0),
        "Seconds after which a DONE URL may be "
        "crawled again (0: never). Fingerprints expire by time generations.",
    ),
    Spec(
        "fingerprint_version_meta",
        _opt_str,
        "A meta key whose value joins the "
        "fingerprint (e.g. a content version), so one URL can be crawled once per value.",
    ),
    Spec(
        "fingerprinter",
        _opt_choice("scrapy", "scrapy-redis"),
        "How request "
        "fingerprints are computed, fixed per crawl when it is created: scrapy (Scrapy's "
        "default fingerprinter) or scrapy-redis (scrapy-redis's RFPDupeFilter: the same "
        "method, URL and body without the headers member, so a migrated scrapy-redis "
        "dupefilter matches). Unset: the mode the crawl was created with (scrapy for a new "
        "crawl; `redcrawl import-scrapy-redis` creates crawls in scrapy-redis mode).",
    ),
    Spec(
        "configure_server",
        _bool,
        "At start, raise the server's set-max-intset-entries "
        "when the exact filter needs it (CONFIG SET; skipped with a warning if refused).",
    ),
    Spec(
        "allow_eviction",
        _bool,
        "Start even though the server's maxmemory-policy may "
        "evict frontier keys (requests and fingerprints would be lost silently).",
    ),
    Spec(
        "memory_warn_ratio",
        _number(float, 0.0, 1.0),
        "Warn when the server's used memory crosses this fraction of maxmemory.",
    ),
    Spec(
        "robots_shared",
        _bool,
        "With ROBOTSTXT_OBEY: fetch each site's robots.txt once for "
        "the whole fleet and share it through Redis (redcrawl.scrapy.RobotsTxtMiddleware, "
        "installed by the scheduler in place of Scrapy's RobotsTxtMiddleware); false keeps "
        "Scrapy's, which fetches robots.txt in every worker.",
    ),
    Spec(
        "robots_ttl",
        _number(float, 1.0),
        "Seconds a robots.txt (2xx, or 4xx: allow all) "
        "stays cached for the fleet before it is fetched again.",
    ),
    Spec(
        "robots_error_ttl",
        _number(float, 1.0),
        "Seconds the outcome of a robots.txt that "
        "answered 5xx or failed to download (allow all, as Scrapy does) stays cached.",
    ),
    Spec(
        "robots_lock_ttl",
        _number(float, 0.5),
        "Seconds the worker fetching a robots.txt "
        "for the fleet holds its lock unless renewed (it renews it every third of that "
        "while the download goes on); a worker killed meanwhile holds the others back "
        "that long at most.",
    ),
    Spec(
        "robots_max_crawl_delay",
        _number(float, 0.0),
        "Upper bound, in seconds, of the "
        "per-site delay taken from a robots.txt Crawl-delay (logged once per site when "
        "it bites); 0 ignores Crawl-delay.",
    ),
    Spec(
        "robots_max_body",
        _number(int, 1024, 64 * 1024 * 1024),
        "Bytes of a robots.txt "
        "that are read, parsed and cached (the rest is ignored, as Google does).",
    ),
    Spec(
        "robots_cache_max_bytes",
        _number(int, 0),
        "Bound on the bytes of all cached "
        "robots.txt entries of a crawl in Redis (compressed); past it the entries "
        "closest to expiry are dropped (fetched again when next needed).",
    ),
    Spec(
        "api_host",
        _str,
        "Address `redcrawl serve` binds to. Without API tokens it must be a loopback address.",
    ),
    Spec("api_port", _number(int, 1, 65535), "Port of `redcrawl serve`."),
    Spec(
        "api_tokens",
        _tokens,
        "Bearer tokens of the HTTP API with read access (comma-separated; at least 16 "
        "characters each: `redcrawl serve` refuses shorter ones).",
    ),
    Spec(
        "api_admin_tokens",
        _tokens,
        "Bearer tokens of the HTTP API with admin access: "
        "submit, requeue, reclaim, pause, resume, purge (comma-separated; at least 16 "
        "characters each).",
    ),
    Spec("api_max_batch", _number(int, 1, 100_000), "Most requests in one submit call."),
    Spec(
        "api_max_body",
        _number(int, 1024, 2**31),
        "Largest request body `redcrawl serve` "
        "reads, in bytes; a larger one is refused with 413 before it is read.",
    ),
    Spec(
        "api_allowed_hosts",
        _str_tuple,
        "Extra `Host` names the HTTP API answers "
        "(comma-separated; `*`: any), e.g. the name clients use behind a proxy. By default "
        "only the bound address (and localhost on loopback): DNS rebinding protection. "
        "Other names (and `*`) need API tokens: an open API accepts only loopback names.",
    ),
    Spec(
        "politeness",
        _bool,
        "Fleet-wide politeness (both backends): the frontier grants a "
        "lease only while the request's politeness key (its download slot: host, or "
        "meta download_slot) has fewer requests in flight than its concurrency and its "
        "delay has passed since its last grant, for every worker at once. Fixed per crawl "
        "when it is created (older crawls keep their layout, without it); off: each worker "
        "limits itself, as Scrapy does. See docs/politeness.md.",
    ),
    Spec(
        "politeness_key",
        _choice("host", "domain"),
        "What a politeness key groups: host "
        "(Scrapy's download slot) or domain (registrable domain, Public Suffix List). "
        "Fixed per crawl.",
    ),
    Spec(
        "politeness_concurrency",
        _number(int, 1, 1_000_000),
        "Requests of one politeness key "
        "in flight at once across the whole fleet (a lease holds its slot from the lease "
        "to the ack).",
        ("CONCURRENT_REQUESTS_PER_DOMAIN",),
    ),
    Spec(
        "politeness_concurrency_per_ip",
        _number(int, 0, 1_000_000),
        "When above 0, used "
        "instead of CONCURRENT_REQUESTS_PER_DOMAIN, as in Scrapy (the key stays the host).",
        ("CONCURRENT_REQUESTS_PER_IP",),
    ),
    Spec(
        "politeness_delay",
        _number(float, 0.0, 86_400.0),
        "Seconds between two lease grants of one politeness key across the whole fleet.",
        ("DOWNLOAD_DELAY",),
    ),
    Spec(
        "politeness_randomize",
        _bool,
        "Each gap is the delay times a random factor in [0.5, 1.5), drawn by the frontier. "
        "Scrapy 2.19's DOWNLOAD_DELAY_JITTER is read too (0: off, any other value: on), and "
        "wins as in Scrapy unless RANDOMIZE_DOWNLOAD_DELAY is set at a higher priority.",
        ("RANDOMIZE_DOWNLOAD_DELAY",),
    ),
    Spec(
        "politeness_jitter",
        _number(float, 0.0, 100.0),
        "The jitter's range, as Scrapy 2.19's DOWNLOAD_DELAY_JITTER: with "
        "RANDOMIZE_DOWNLOAD_DELAY on, each gap is the delay times a random factor in "
        "[1 - jitter, 1 + jitter), floored at 0 (0.5: Scrapy's [0.5, 1.5)); a DOWNLOAD_SLOTS "
        "entry's jitter sets it for its key.",
        ("DOWNLOAD_DELAY_JITTER",),
    ),
    Spec(
        "politeness_slots",
        _slots,
        "Per-key concurrency and delay (JSON object: key -> "
        "{concurrency, delay, randomize_delay or Scrapy 2.19's jitter}), fleet-wide; every "
        "entry is checked at start.",
        ("DOWNLOAD_SLOTS",),
    ),
    Spec(
        "autothrottle_enabled",
        _bool,
        "Scrapy's AutoThrottle. On a crawl with fleet-wide politeness its "
        "delay is one per politeness key for the whole fleet, kept in Redis and adjusted "
        "from every worker's latencies (redcrawl.scrapy.AutoThrottle, installed by the "
        "scheduler in place of Scrapy's); DOWNLOAD_DELAY is its smallest delay. See "
        "docs/politeness.md.",
        ("AUTOTHROTTLE_ENABLED",),
    ),
    Spec(
        "autothrottle_shared",
        _bool,
        "With AUTOTHROTTLE_ENABLED on a crawl with politeness: "
        "one delay per site for the fleet (redcrawl.scrapy.AutoThrottle); false keeps "
        "Scrapy's AutoThrottle, which throttles each worker for itself.",
    ),
    Spec(
        "autothrottle_start_delay",
        _number(float, 0.0, 86_400.0),
        "Seconds between the grants of a site "
        "whose delay AutoThrottle has not adjusted yet (never below DOWNLOAD_DELAY).",
        ("AUTOTHROTTLE_START_DELAY",),
    ),
    Spec(
        "autothrottle_max_delay",
        _number(float, 0.0, 86_400.0),
        "Largest delay AutoThrottle sets, in seconds.",
        ("AUTOTHROTTLE_MAX_DELAY",),
    ),
    Spec(
        "autothrottle_target_concurrency",
        _number(float, 0.0, 1_000_000.0),
        "Requests AutoThrottle aims to "
        "have in progress at each site: the delay tends to latency / this. Fleet-wide, for "
        "all workers together. 0 switches AutoThrottle off, as in Scrapy.",
        ("AUTOTHROTTLE_TARGET_CONCURRENCY",),
    ),
    Spec(
        "autothrottle_debug",
        _bool,
        "Log every AutoThrottle adjustment (site, latency, old and new delay).",
        ("AUTOTHROTTLE_DEBUG",),
    ),
    Spec(
        "politeness_start_window",
        _number(float, 0.0, 60.0),
        "Seconds from a leased request's grant to Scrapy taking it, in a "
        "crawl with fleet-wide politeness (its site's delay was charged when it was "
        "granted): one that took longer (a busy or descheduled worker) is given back, "
        "served next, no attempt spent, rather than started closer than the delay to the "
        "next start at its site; when the worker cannot tell whether its site has a delay, "
        "or its lease reply itself came late, the frontier is asked whether it may start "
        '(docs/politeness.md, "Start window"). 0: off.',
    ),
    Spec(
        "defer_http_codes",
        _status_tuple,
        "HTTP statuses of a site pushing back (fleet-wide politeness): "
        "the request is deferred (back to the front of its site's queue, no attempt "
        "spent) before Scrapy's RetryMiddleware sees the response, and the site is blocked "
        "for every worker until its Retry-After or, without one, for a backoff delay. "
        "Empty: off (Scrapy's retries handle them, per worker).",
    ),
    Spec(
        "max_deferrals",
        _number(int, 0, 1_000_000),
        "Deferrals (defer_http_codes) of one request "
        "before it goes to the dead letters with the reason.",
    ),
    Spec(
        "retry_after_cap",
        _number(float, 1.0, 365 * 86400.0),
        "Longest block, in seconds, a Retry-After "
        "header sets for a site (a longer one is cut to this).",
    ),
    Spec(
        "backoff_base",
        _number(float, 0.001, 86_400.0),
        "Seconds a site is blocked for the fleet after its first 429/503 without a usable "
        "Retry-After (REDCRAWL_DEFER_HTTP_CODES); each further failure in a row doubles "
        "it, up to REDCRAWL_BACKOFF_CAP. The crawl's value is the latest Scrapy "
        "worker's (a change is logged) and counts from the next failure. See "
        "docs/politeness.md.",
    ),
    Spec(
        "backoff_cap",
        _number(float, 0.001, 30 * 86_400.0),
        "The longest backoff block, in seconds (at least REDCRAWL_BACKOFF_BASE).",
    ),
    Spec(
        "backoff_jitter",
        _number(float, 0.0, 1.0),
        "Fraction of a backoff block that is random: a block of d seconds lasts between "
        "d * (1 - jitter) and d (0: exactly d; 1: anywhere up to d).",
    ),
    Spec(
        "backoff_forgive_after",
        _number(int, 1, 1_000_000),
        "Responses in a row that are not 429/503 which take one failure off a site's "
        "backoff count (success forgives slowly: a site that flaps stays slowed).",
    ),
    Spec(
        "max_idle_time",
        _number(float, 0.0),
        "RedisSpider: seconds to wait for new start "
        "URLs once the crawl is finished before closing; 0 waits forever (scrapy-redis's "
        "default).",
        ("MAX_IDLE_TIME_BEFORE_CLOSE",),
    ),
)

BY_NAME: dict[str, Spec] = {}
for _s in SPECS:
    BY_NAME[_s.name] = _s
    for _a in _s.aliases:
        BY_NAME[_a] = _s

# scrapy-redis names that have no meaning here; accepted so old settings files keep working,
# and named in a warning at start (startup_warnings).
IGNORED = {
    "SCHEDULER_SERIALIZER": "redcrawl always stores requests as its own msgpack envelope "
    "(never pickle); no serializer module is used",
    "SCHEDULER_DUPEFILTER_CLASS": "the frontier filters duplicates itself, in the step that "
    "stores a request",
    "REDIS_ENCODING": "redcrawl's keys and envelopes are bytes; RedisSpider reads start "
    "entries as UTF-8 (a make_request_from_data of your own finds it as "
    "self.redis_encoding, as on scrapy-redis)",
    "REDIS_DECODE_RESPONSES": "redcrawl needs Redis's replies as bytes and never decodes them",
    "DUPEFILTER_KEY": "fingerprints live under the crawl's keys",
    "REDIS_CLUSTER_NODES": "not read: name a Redis Cluster's nodes in the URL, "
    "REDIS_URL=redis+cluster://host:port,host:port (docs/cluster.md)",
}

# keys of REDIS_PARAMS that redcrawl drops (they would break its client), and why
DROPPED_PARAMS = {
    "redis_cls": "redcrawl builds its own redis-py client (retries, timeouts, binary replies)",
    "decode_responses": "redcrawl needs Redis's replies as bytes",
}
