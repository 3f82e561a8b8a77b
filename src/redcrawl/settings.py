"""One typed settings object for every redcrawl component.

:class:`Settings` is built from Scrapy settings (:meth:`Settings.from_scrapy`), from
``REDCRAWL_*`` environment variables (:meth:`Settings.from_env`) and from CLI flags
(:meth:`Settings.replace`); precedence is CLI > environment > Scrapy settings > defaults.

Each setting has one canonical name, ``REDCRAWL_<FIELD>`` in upper case, and
scrapy-redis's names are accepted as aliases (``REDIS_URL``, ``SCHEDULER_PERSIST``, …), so a
scrapy-redis project's ``settings.py`` keeps working. An unknown ``REDCRAWL_*`` name or a
value that does not parse is a :class:`~redcrawl.errors.ConfigError` naming the setting.
The table of every setting is :data:`SETTINGS_DOC`; ``docs/settings.md`` is generated
from it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from redcrawl.errors import ConfigError
from redcrawl.keys import validate_crawl_name

__all__ = ["SETTINGS_DOC", "Ordering", "Settings"]

Ordering = Literal["fifo", "lifo", "priority"]

# scrapy-redis queue classes and what they mean here.
_QUEUE_CLASSES: dict[str, Ordering] = {
    "scrapy_redis.queue.PriorityQueue": "priority",
    "scrapy_redis.queue.FifoQueue": "fifo",
    "scrapy_redis.queue.SpiderQueue": "fifo",
    "scrapy_redis.queue.LifoQueue": "lifo",
    "scrapy_redis.queue.SpiderStack": "lifo",
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


def _number(kind: type[int] | type[float], low: float, high: float | None = None) -> Callable[
    [str, Any], Any
]:
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


def _str_tuple(name: str, v: Any) -> tuple[str, ...]:
    items: Iterable[Any] = v.split(",") if isinstance(v, str) else v
    return tuple(s for s in (str(x).strip() for x in items) if s)


def _dict(name: str, v: Any) -> dict[str, Any]:
    if isinstance(v, str):
        try:
            v = json.loads(v) if v.strip() else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(name, f"not valid JSON ({exc}); give a JSON object")
    if not isinstance(v, Mapping):
        raise ConfigError(name, f"{v!r} is not a mapping")
    return dict(v)


def _ordering(name: str, v: Any) -> Ordering:
    if isinstance(v, type):
        v = f"{v.__module__}.{v.__qualname__}"
    s = str(v).strip()
    if s not in _QUEUE_CLASSES:
        raise ConfigError(
            name,
            f"{s!r} is not a known queue; use fifo, lifo, priority or a scrapy_redis.queue class",
        )
    return _QUEUE_CLASSES[s]


def _choice(*options: str) -> Callable[[str, Any], str]:
    def parse(name: str, v: Any) -> str:
        s = str(v).strip().lower()
        if s not in options:
            raise ConfigError(name, f"{v!r} is not one of {', '.join(options)}")
        return s

    return parse


def _path(name: str, v: Any) -> Path:
    return Path(str(v)).expanduser()


@dataclass(frozen=True, slots=True)
class _Spec:
    field: str
    parse: Callable[[str, Any], Any]
    doc: str
    aliases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"REDCRAWL_{self.field.upper()}"


_SPECS: tuple[_Spec, ...] = (
    _Spec("redis_url", _opt_str, "Redis URL (redis://, rediss:// for TLS, user:password@ for "
          "ACL, unix://). Unset: an embedded Redis is started with its data in EMBEDDED_DIR.",
          ("REDIS_URL",)),
    _Spec("redis_host", _opt_str, "Host, used when no URL is set (scrapy-redis compatible).",
          ("REDIS_HOST",)),
    _Spec("redis_port", _number(int, 1, 65535), "Port, used with REDIS_HOST.", ("REDIS_PORT",)),
    _Spec("redis_params", _dict, "Extra keyword arguments for the redis-py client (JSON).",
          ("REDIS_PARAMS",)),
    _Spec("embedded_dir", _path, "Folder of the embedded Redis (data, AOF, socket)."),
    _Spec("crawl", _opt_str, "Crawl name: the frontier shared by workers. Default: the "
          "spider's name (scrapy-redis's SCHEDULER_QUEUE_KEY template is honoured).",
          ("SCHEDULER_QUEUE_KEY",)),
    _Spec("key_prefix", _str, "Prefix of every Redis key."),
    _Spec("backend", _choice("lists", "streams"), "Frontier backend: lists (tiered Redis "
          "lists, weighted fair tiers, fifo/lifo/priority) or streams (Redis Streams sharded by "
          "domain, consumer groups, high/low priority streams; needs Redis 6.2+ and ordering "
          "fifo). Fixed per crawl; see docs/streams.md."),
    _Spec("shards", _number(int, 1, 1024), "Streams backend: number of shards (a request goes "
          "to the shard of a hash of its URL's host). Fixed per crawl."),
    _Spec("ordering", _ordering, "fifo, lifo or priority (strict). scrapy-redis queue "
          "classes map onto them.", ("SCHEDULER_QUEUE_CLASS",)),
    _Spec("tier_weights", _int_tuple, "Weights of the priority tiers, highest first, popped "
          "by weighted fair choice (fifo/lifo)."),
    _Spec("tier_bounds", _int_tuple, "Lowest priority of each tier but the last, highest "
          "first: with (1, 0), priority >= 1 is high, 0 is mid, < 0 is low."),
    _Spec("lease_ttl", _number(float, 0.05), "Seconds a leased request stays owned by its "
          "worker without a heartbeat before it returns to the queue."),
    _Spec("heartbeat_interval", _number(float, 0.01), "Seconds between worker heartbeats "
          "(default: a third of LEASE_TTL)."),
    _Spec("max_attempts", _number(int, 1, 1000), "Deliveries before a failing request is "
          "dead-lettered."),
    _Spec("retry_backoff", _number(float, 0.0), "Base retry delay in seconds (doubles per "
          "attempt)."),
    _Spec("retry_backoff_max", _number(float, 0.0), "Upper bound of the retry delay."),
    _Spec("batch_size", _number(int, 1, 10_000), "Requests per push/lease/ack round trip."),
    _Spec("prefetch", _number(int, 1, 10_000), "Requests a worker leases ahead of Scrapy's "
          "demand (its local buffer)."),
    _Spec("lookahead", _number(int, 0, 8), "Settle round trips (store, ack, lease PREFETCH "
          "more) a worker keeps on their way while the crawl has ready work, so that Redis "
          "works while Scrapy does; they run in order on a connection of their own. 0: "
          "lease only when the local buffer is empty."),
    _Spec("poll_interval", _number(float, 0.01), "Seconds between lease attempts while the "
          "frontier has nothing ready for this worker."),
    _Spec("retry_http_codes", _int_tuple, "HTTP statuses that, still failing after Scrapy's own "
          "retries, send the request back with backoff (then to the dead letters). Default: "
          "Scrapy's RETRY_HTTP_CODES.", ("RETRY_HTTP_CODES",)),
    _Spec("worker_id", _opt_str, "This worker's id (default: host:pid:random)."),
    _Spec("persist", _bool, "Keep the frontier after the crawl closes.", ("SCHEDULER_PERSIST",)),
    _Spec("flush_on_start", _bool, "Empty the crawl's frontier once, when the crawl starts.",
          ("SCHEDULER_FLUSH_ON_START",)),
    _Spec("idle_before_close", _number(float, 0.0), "Seconds the whole crawl must stay "
          "finished before workers close.", ("SCHEDULER_IDLE_BEFORE_CLOSE",)),
    _Spec("dupefilter_key", _opt_str, "Accepted for scrapy-redis compatibility; the "
          "fingerprints live under the crawl's keys.", ("SCHEDULER_DUPEFILTER_KEY",)),
    _Spec("canonicalize", _bool, "Canonicalise URLs (drop tracking parameters, normalise) "
          "before fingerprinting. Off: fingerprints equal Scrapy's."),
    _Spec("canonical_drop_params", _str_tuple, "Query parameters dropped by canonicalisation "
          "(glob patterns)."),
    _Spec("start_urls_key", _str, "Key RedisSpider reads start URLs from (a template with "
          "%(name)s, the spider's name; as in scrapy-redis).", ("REDIS_START_URLS_KEY",)),
    _Spec("start_urls_as_set", _bool, "Start URLs key is a set.", ("REDIS_START_URLS_AS_SET",)),
    _Spec("start_urls_batch_size", _number(int, 1, 100_000), "Start URLs read per batch.",
          ("REDIS_START_URLS_BATCH_SIZE",)),
    _Spec("items_uri", _str, "Where UpsertPipeline writes items: sqlite:///path.db or "
          "postgresql://user:pass@host/db."),
    _Spec("items_table", _str, "UpsertPipeline's table."),
    _Spec("item_key", _str, "The item field that identifies an item (one row per value)."),
    _Spec("dedupe", _choice("exact", "bloom"), "How DONE fingerprints "
          "are remembered: exact (compact integer sets, ~9 B/URL, no false positives) or "
          "bloom (~1.2 B/URL at 1%; may skip that fraction of new URLs). Fixed per crawl."),
    _Spec("dedupe_capacity", _number(int, 1000), "URLs the crawl is expected to reach: sizes "
          "the exact filter's buckets and the Bloom filter's first layer (both keep working "
          "beyond it). Fixed per crawl."),
    _Spec("dedupe_error_rate", _number(float, 1e-9, 0.5), "Bloom mode: false-positive rate "
          "of the first layer (later layers are tighter, so the total stays below twice it)."),
    _Spec("bloom_backend", _choice("auto", "redisbloom", "lua"),
          "Bloom mode: the server's RedisBloom module (BF.*) or redcrawl's own bitmaps in "
          "Lua; auto uses RedisBloom when the server has it loaded."),
    _Spec("recrawl_after", _number(float, 0.0), "Seconds after which a DONE URL may be "
          "crawled again (0: never). Fingerprints expire by time generations."),
    _Spec("fingerprint_version_meta", _opt_str, "A meta key whose value joins the "
          "fingerprint (e.g. a content version), so one URL can be crawled once per value."),
    _Spec("configure_server", _bool, "At start, raise the server's set-max-intset-entries "
          "when the exact filter needs it (CONFIG SET; skipped with a warning if refused)."),
    _Spec("allow_eviction", _bool, "Start even though the server's maxmemory-policy may "
          "evict frontier keys (requests and fingerprints would be lost silently)."),
    _Spec("memory_warn_ratio", _number(float, 0.0, 1.0), "Warn when the server's used memory "
          "crosses this fraction of maxmemory."),
    _Spec("api_host", _str, "Address `redcrawl serve` binds to. Without API tokens it must "
          "be a loopback address."),
    _Spec("api_port", _number(int, 1, 65535), "Port of `redcrawl serve`."),
    _Spec("api_tokens", _str_tuple, "Bearer tokens of the HTTP API with read access "
          "(comma-separated)."),
    _Spec("api_admin_tokens", _str_tuple, "Bearer tokens of the HTTP API with admin access: "
          "submit, requeue, reclaim, pause, resume, purge (comma-separated)."),
    _Spec("api_max_batch", _number(int, 1, 100_000), "Most requests in one submit call."),
    _Spec("api_max_body", _number(int, 1024, 2**31), "Largest request body `redcrawl serve` "
          "reads, in bytes; a larger one is refused with 413 before it is read."),
    _Spec("api_allowed_hosts", _str_tuple, "Extra `Host` names the HTTP API answers "
          "(comma-separated; `*`: any), e.g. the name clients use behind a proxy. By default "
          "only the bound address (and localhost on loopback): DNS rebinding protection."),
    _Spec("max_idle_time", _number(float, 0.0), "RedisSpider: seconds to wait for new start "
          "URLs once the crawl is finished before closing; 0 waits forever (scrapy-redis's "
          "default).", ("MAX_IDLE_TIME_BEFORE_CLOSE",)),
)

_BY_NAME: dict[str, _Spec] = {}
for _s in _SPECS:
    _BY_NAME[_s.name] = _s
    for _a in _s.aliases:
        _BY_NAME[_a] = _s

# scrapy-redis names that have no meaning here; accepted so old settings files keep working.
_IGNORED = {
    "SCHEDULER_SERIALIZER": "redcrawl never pickles: requests are stored as a msgpack envelope",
    "SCHEDULER_DUPEFILTER_CLASS": "dedupe is part of the frontier",
    "REDIS_ENCODING": "keys and envelopes are binary-safe",
    "REDIS_DECODE_RESPONSES": "not needed",
    "DUPEFILTER_KEY": "fingerprints live under the crawl's keys",
    "REDIS_ITEMS_KEY": "use redcrawl's idempotent pipeline",
    "REDIS_ITEMS_SERIALIZER": "use redcrawl's idempotent pipeline",
    "REDIS_CLUSTER_NODES": "give a redis+cluster:// URL instead",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every redcrawl setting, typed and validated. Immutable: use :meth:`replace`."""

    redis_url: str | None = None
    redis_host: str | None = None
    redis_port: int = 6379
    redis_params: dict[str, Any] = field(default_factory=dict)
    embedded_dir: Path = Path(".redcrawl")
    crawl: str | None = None
    key_prefix: str = "rc"
    backend: Literal["lists", "streams"] = "lists"
    shards: int = 8
    ordering: Ordering = "fifo"
    tier_weights: tuple[int, ...] = (5, 3, 2)
    tier_bounds: tuple[int, ...] = (1, 0)
    lease_ttl: float = 60.0
    heartbeat_interval: float | None = None
    max_attempts: int = 3
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0
    batch_size: int = 100
    prefetch: int = 16
    lookahead: int = 2
    poll_interval: float = 0.5
    retry_http_codes: tuple[int, ...] = (500, 502, 503, 504, 522, 524, 408, 429)
    worker_id: str | None = None
    persist: bool = True
    flush_on_start: bool = False
    idle_before_close: float = 0.0
    dupefilter_key: str | None = None
    canonicalize: bool = False
    canonical_drop_params: tuple[str, ...] = ()
    start_urls_key: str = "%(name)s:start_urls"
    start_urls_as_set: bool = False
    start_urls_batch_size: int = 16
    items_uri: str = "sqlite:///items.db"
    items_table: str = "items"
    item_key: str = "url"
    dedupe: Literal["exact", "bloom"] = "exact"
    dedupe_capacity: int = 100_000_000
    dedupe_error_rate: float = 0.01
    bloom_backend: Literal["auto", "redisbloom", "lua"] = "auto"
    recrawl_after: float = 0.0
    fingerprint_version_meta: str | None = None
    configure_server: bool = True
    allow_eviction: bool = False
    memory_warn_ratio: float = 0.9
    api_host: str = "127.0.0.1"
    api_port: int = 8700
    api_tokens: tuple[str, ...] = ()
    api_admin_tokens: tuple[str, ...] = ()
    api_max_batch: int = 1000
    api_max_body: int = 16 * 1024 * 1024
    api_allowed_hosts: tuple[str, ...] = ()
    max_idle_time: float = 0.0

    def __post_init__(self) -> None:
        # Every field goes through its setting's parser, however the object was built.
        for spec in _SPECS:
            value = getattr(self, spec.field)
            if value is not None:
                object.__setattr__(self, spec.field, spec.parse(spec.name, value))
        w, b = self.tier_weights, self.tier_bounds
        if not w or any(x <= 0 for x in w):
            raise ConfigError("REDCRAWL_TIER_WEIGHTS", f"{w}: give one positive weight per tier")
        if len(w) > 16:
            raise ConfigError("REDCRAWL_TIER_WEIGHTS", f"{len(w)} tiers; use at most 16")
        if self.ordering == "priority":
            pass  # one strict-priority queue; tiers unused
        elif len(b) != len(w) - 1:
            raise ConfigError(
                "REDCRAWL_TIER_BOUNDS",
                f"{b} has {len(b)} bounds for {len(w)} tiers; give one fewer bound than weights",
            )
        elif list(b) != sorted(b, reverse=True) or len(set(b)) != len(b):
            raise ConfigError("REDCRAWL_TIER_BOUNDS", f"{b} must be strictly decreasing")
        if self.backend == "streams" and self.ordering != "fifo":
            raise ConfigError(
                "REDCRAWL_ORDERING",
                f"{self.ordering!r} is not available with REDCRAWL_BACKEND=streams: streams are "
                "read in arrival order (high-priority streams first); use ordering fifo or the "
                "lists backend",
            )
        if self.crawl is not None and "%(" not in self.crawl:
            validate_crawl_name(self.crawl)
        if self.heartbeat_interval is not None and self.heartbeat_interval >= self.lease_ttl:
            raise ConfigError(
                "REDCRAWL_HEARTBEAT_INTERVAL",
                f"{self.heartbeat_interval}s is not shorter than REDCRAWL_LEASE_TTL "
                f"({self.lease_ttl}s); a heartbeat must come before the lease runs out",
            )

    # --- builders ------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, base: Settings | None = None,
                     strict_prefix: bool = True) -> Settings:
        """Build from setting names (canonical or scrapy-redis aliases) to values.

        Names outside redcrawl's and scrapy-redis's are ignored, except unknown
        ``REDCRAWL_*`` names, which are an error (a typo must not pass silently).
        """
        changes: dict[str, Any] = {}
        for name, value in values.items():
            spec = _BY_NAME.get(name)
            if spec is None:
                if strict_prefix and name.startswith("REDCRAWL_"):
                    known = [n for n in _BY_NAME if n.startswith("REDCRAWL_")]
                    near = difflib.get_close_matches(name, known, n=2)
                    hint = f"did you mean {' or '.join(near)}? " if near else ""
                    raise ConfigError(name, f"unknown setting; {hint}every setting is listed "
                                            "in docs/settings.md")
                continue
            if value is None and spec.field not in changes:
                continue
            # The canonical name wins over an alias when both are given.
            if spec.field in changes and name != spec.name:
                continue
            changes[spec.field] = spec.parse(name, value)
        if "redis_url" not in changes and "redis_host" in changes and changes["redis_host"]:
            port = changes.get("redis_port", (base or cls()).redis_port)
            changes["redis_url"] = f"redis://{changes['redis_host']}:{port}"
        return (base or cls()).replace(**changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 base: Settings | None = None) -> Settings:
        """Overlay ``REDCRAWL_*`` environment variables on ``base`` (or the defaults)."""
        env = os.environ if environ is None else environ
        return cls.from_mapping({k: v for k, v in env.items() if k.startswith("REDCRAWL_")},
                                base=base)

    @classmethod
    def from_scrapy(cls, settings: Any, *, environ: Mapping[str, str] | None = None) -> Settings:
        """From a Scrapy ``Settings`` object (or a dict), then the environment on top."""
        names = [*_BY_NAME, *(k for k in _keys(settings) if str(k).startswith("REDCRAWL_"))]
        values = {n: settings.get(n) for n in dict.fromkeys(names) if settings.get(n) is not None}
        return cls.from_env(environ, base=cls.from_mapping(values))

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (e.g. from CLI flags), validated again."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(", ".join(sorted(unknown)), "unknown setting")
        return dataclasses.replace(self, **changes)

    # --- derived values --------------------------------------------------------------
    def crawl_name(self, spider_name: str | None = None) -> str:
        """The crawl name, expanding a scrapy-redis key template like ``%(spider)s:requests``."""
        name = self.crawl
        if name is None:
            name = spider_name or "default"
        elif "%(" in name:
            try:
                name = name % {"spider": spider_name or "default"}
            except (KeyError, ValueError, TypeError) as exc:
                raise ConfigError("REDCRAWL_CRAWL", f"template {self.crawl!r}: {exc}")
            name = name.removesuffix(":requests")
        return validate_crawl_name(name)

    @property
    def heartbeat(self) -> float:
        """Seconds between worker heartbeats."""
        return float(self.heartbeat_interval or self.lease_ttl / 3)

    @property
    def tiers(self) -> int:
        return 1 if self.ordering == "priority" else len(self.tier_weights)

    def tier_of(self, priority: int) -> int:
        """Tier index (0 = highest) of a request priority."""
        if self.ordering == "priority":
            return 0
        for i, bound in enumerate(self.tier_bounds):
            if priority >= bound:
                return i
        return len(self.tier_bounds)

    def retry_delay(self, attempts: int) -> float:
        """Exponential backoff: ``retry_backoff * 2**(attempts-1)``, capped."""
        if self.retry_backoff <= 0:
            return 0.0
        return float(min(self.retry_backoff_max, self.retry_backoff * 2.0 ** max(0, attempts - 1)))


def _keys(settings: Any) -> Iterable[Any]:
    try:
        return list(cast(Iterable[Any], settings))
    except TypeError:
        return []


def ignored_setting_reason(name: str) -> str | None:
    """Why a scrapy-redis setting name has no effect in redcrawl, or None."""
    return _IGNORED.get(name)


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, Path | str):
        return str(value)
    return json.dumps(value)


SETTINGS_DOC: list[tuple[str, str, str, str]] = [
    (s.name, ", ".join(s.aliases), _show(getattr(Settings(), s.field)), s.doc) for s in _SPECS
]
"""(name, scrapy-redis aliases, default, description) for every setting."""
