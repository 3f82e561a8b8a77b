"""One typed settings object for every redcrawl component.

:class:`Settings` is built from Scrapy settings (:meth:`Settings.from_scrapy`), from
``REDCRAWL_*`` environment variables (:meth:`Settings.from_env`) and from CLI flags
(:meth:`Settings.replace`). Precedence, highest first: CLI flags, Scrapy's command line
(``scrapy crawl -s``), ``REDCRAWL_*`` environment variables, the spider's and project's
Scrapy settings, defaults.

Each setting has one canonical name, ``REDCRAWL_<FIELD>`` in upper case, and
scrapy-redis's names are accepted as aliases (``REDIS_URL``, ``SCHEDULER_PERSIST``, …), so a
scrapy-redis project's ``settings.py`` keeps working. An unknown ``REDCRAWL_*`` name or a
value that does not parse is a :class:`~redcrawl.errors.ConfigError` naming the setting.
:func:`startup_notes` and :func:`startup_warnings` say, at start, where redcrawl's choices
differ from what scrapy-redis would do with the same settings.
The table of every setting is :data:`SETTINGS_DOC`; ``docs/settings.md`` is generated
from it.
"""

from __future__ import annotations

import contextlib
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

__all__ = ["QUEUE_CLASSES", "SETTINGS_DOC", "Ordering", "Settings", "startup_notes",
           "startup_warnings"]

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
_ORDER_NAMES: dict[Ordering, str] = {"priority": "strict priority", "fifo": "fifo",
                                     "lifo": "lifo"}
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
    if s in QUEUE_CLASSES:
        return QUEUE_CLASSES[s]
    known = ", ".join(_SCRAPY_REDIS_QUEUES)
    if s.startswith("scrapy_redis."):
        raise ConfigError(name, f"{s!r} is not a queue class of scrapy-redis 0.9.1 (those "
                                f"are {known}, in scrapy_redis.queue, and redcrawl maps each "
                                "onto an ordering); name one of them, or remove the setting "
                                "and set REDCRAWL_ORDERING to fifo, lifo or priority")
    if "." in s:
        raise ConfigError(name, f"{s!r}: redcrawl keeps requests in its own frontier and "
                                "cannot use another queue class; remove the setting and set "
                                "REDCRAWL_ORDERING to fifo, lifo or priority (scrapy-redis's "
                                f"classes {known} are mapped onto these)")
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
    _Spec("redis_host", _opt_str, "Host, used when no URL is set (as in scrapy-redis, "
          "REDIS_HOST, REDIS_PORT or REDIS_DB alone select a server: localhost:6379 when "
          "not given).", ("REDIS_HOST",)),
    _Spec("redis_port", _number(int, 1, 65535), "Port, used when no URL is set (with "
          "REDIS_HOST, or alone: localhost, as in scrapy-redis).", ("REDIS_PORT",)),
    _Spec("redis_db", _number(int, 0, 1 << 20), "Database number: used with REDIS_HOST / "
          "REDIS_PORT, or with a URL that names none (as in scrapy-redis).", ("REDIS_DB",)),
    _Spec("redis_params", _dict, "Extra keyword arguments for the redis-py client (JSON). "
          "Its url, host, port and db keys count as REDIS_URL, REDIS_HOST, REDIS_PORT and "
          "REDIS_DB (which win over them), as in scrapy-redis.", ("REDIS_PARAMS",)),
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
    _Spec("lookahead", _number(int, 0, 8), "Batches of PREFETCH leased requests a worker's "
          "I/O thread keeps ready ahead of Scrapy's demand while the crawl has ready work, "
          "so that Scrapy never waits for a lease. 0: lease only when the local buffer is "
          "empty."),
    _Spec("poll_interval", _number(float, 0.01), "Seconds between lease attempts while the "
          "frontier has nothing ready for this worker."),
    _Spec("redis_outage_limit", _number(float, 1.0), "Seconds a worker goes on without "
          "Redis (downloading and parsing what it holds, its calls retried on a thread of "
          "their own) before it closes with reason redis_unavailable and a non-zero exit "
          "code; its leases come back to the crawl when they expire."),
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
    _Spec("start_urls_as_set", _bool, "Start URLs key is a set (popped with SPOP).",
          ("REDIS_START_URLS_AS_SET",)),
    _Spec("start_urls_as_zset", _bool, "Start URLs key is a sorted set, highest score "
          "first (popped with ZPOPMAX).", ("REDIS_START_URLS_AS_ZSET",)),
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
    _Spec("fingerprinter", _opt_choice("scrapy", "scrapy-redis"), "How request "
          "fingerprints are computed, fixed per crawl when it is created: scrapy (Scrapy's "
          "default fingerprinter) or scrapy-redis (scrapy-redis's RFPDupeFilter: the same "
          "method, URL and body without the headers member, so a migrated scrapy-redis "
          "dupefilter matches). Unset: the mode the crawl was created with (scrapy for a new "
          "crawl; `redcrawl import-scrapy-redis` creates crawls in scrapy-redis mode)."),
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

# scrapy-redis names that have no meaning here; accepted so old settings files keep working,
# and named in a warning at start (startup_warnings).
_IGNORED = {
    "SCHEDULER_SERIALIZER": "redcrawl always stores requests as its own msgpack envelope "
                            "(never pickle); no serializer module is used",
    "SCHEDULER_DUPEFILTER_CLASS": "the frontier filters duplicates itself, in the step that "
                                  "stores a request",
    "REDIS_ENCODING": "redcrawl's keys and envelopes are bytes; RedisSpider reads start "
                      "entries as UTF-8",
    "REDIS_DECODE_RESPONSES": "redcrawl needs Redis's replies as bytes and never decodes them",
    "DUPEFILTER_KEY": "fingerprints live under the crawl's keys",
    "REDIS_CLUSTER_NODES": "redcrawl connects to one Redis server (REDIS_URL); Redis Cluster "
                           "nodes are not read",
}

# keys of REDIS_PARAMS that redcrawl drops (they would break its client), and why
_DROPPED_PARAMS = {
    "redis_cls": "redcrawl builds its own redis-py client (retries, timeouts, binary replies)",
    "decode_responses": "redcrawl needs Redis's replies as bytes",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every redcrawl setting, typed and validated. Immutable: use :meth:`replace`."""

    redis_url: str | None = None
    redis_host: str | None = None
    redis_port: int = 6379
    redis_db: int | None = None
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
    redis_outage_limit: float = 60.0
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
    start_urls_as_zset: bool = False
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
    fingerprinter: Literal["scrapy", "scrapy-redis"] | None = None
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
        base = base or cls()
        _connection_from_params(changes)
        if "redis_url" not in changes and {"redis_host", "redis_port", "redis_db"} & set(
                changes) and (base.redis_url is None or base.redis_url == base._host_url()):
            # as scrapy-redis: host, port or db alone select a server (default
            # localhost:6379), unless a URL is set (here or at a lower level)
            changes["redis_url"] = base.replace(**changes)._host_url()
        return base.replace(**changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 base: Settings | None = None) -> Settings:
        """Overlay ``REDCRAWL_*`` environment variables on ``base`` (or the defaults)."""
        env = os.environ if environ is None else environ
        return cls.from_mapping({k: v for k, v in env.items() if k.startswith("REDCRAWL_")},
                                base=base)

    @classmethod
    def from_scrapy(cls, settings: Any, *, environ: Mapping[str, str] | None = None) -> Settings:
        """From a Scrapy ``Settings`` object (or a dict) and the environment.

        Precedence, highest first: Scrapy's command line (``scrapy crawl -s``, priority
        ``cmdline``), then ``REDCRAWL_*`` environment variables, then the rest of the Scrapy
        settings (the spider's ``custom_settings``, the project's ``settings.py``). A plain
        dict counts as project settings.
        """
        project, cmdline = _scrapy_layers(settings)
        merged = cls.from_env(environ, base=cls.from_mapping(project))
        return cls.from_mapping(cmdline, base=merged) if cmdline else merged

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (e.g. from CLI flags), validated again."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(", ".join(sorted(unknown)), "unknown setting")
        return dataclasses.replace(self, **changes)

    # --- derived values --------------------------------------------------------------
    def _host_url(self) -> str:
        """The URL scrapy-redis would use for redis_host / redis_port / redis_db."""
        host = self.redis_host or "localhost"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6
        db = "" if self.redis_db is None else f"/{self.redis_db}"
        return f"redis://{host}:{self.redis_port}{db}"

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


_CONNECTION_PARAMS = (("url", "redis_url"), ("host", "redis_host"), ("port", "redis_port"),
                      ("db", "redis_db"))


def _connection_from_params(changes: dict[str, Any]) -> None:
    """Move REDIS_PARAMS' url/host/port/db to their settings (scrapy-redis reads them from
    either place; the named settings win), so they never reach redis-py twice."""
    params = changes.get("redis_params")
    moved = [key for key, _ in _CONNECTION_PARAMS] + list(_DROPPED_PARAMS)
    if not params or not any(key in params for key in moved):
        return
    params = {k: v for k, v in params.items() if k not in _DROPPED_PARAMS}
    for key, name in _CONNECTION_PARAMS:
        if key in params:
            value = params.pop(key)
            if name not in changes and value is not None:
                changes[name] = _BY_NAME[f"REDCRAWL_{name.upper()}"].parse(
                    f"REDIS_PARAMS['{key}']", value)
    changes["redis_params"] = params


CMDLINE_PRIORITY = 40
"""Scrapy's priority of ``-s`` settings (``SETTINGS_PRIORITIES['cmdline']``)."""


def _scrapy_layers(settings: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The redcrawl and scrapy-redis settings in ``settings``: (below the command line,
    from the command line)."""
    names = [*_BY_NAME, *(k for k in _keys(settings) if str(k).startswith("REDCRAWL_"))]
    getpriority = getattr(settings, "getpriority", None)
    project: dict[str, Any] = {}
    cmdline: dict[str, Any] = {}
    for name in dict.fromkeys(names):
        value = settings.get(name)
        if value is None:
            continue
        priority = getpriority(name) if getpriority is not None else None
        (cmdline if (priority or 0) >= CMDLINE_PRIORITY else project)[name] = value
    return project, cmdline


def _keys(settings: Any) -> Iterable[Any]:
    try:
        return list(cast(Iterable[Any], settings))
    except TypeError:
        return []


def ignored_setting_reason(name: str) -> str | None:
    """Why a scrapy-redis setting name has no effect in redcrawl, or None."""
    return _IGNORED.get(name)


def _given(scrapy_settings: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """The redcrawl and scrapy-redis settings given in ``scrapy_settings`` or ``environ``."""
    project, cmdline = _scrapy_layers(scrapy_settings)
    env = {k: v for k, v in environ.items() if k in _BY_NAME and k.startswith("REDCRAWL_")}
    return {**project, **env, **cmdline}


def _class_path(value: Any) -> str:
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def startup_notes(scrapy_settings: Any, *,
                  environ: Mapping[str, str] | None = None) -> list[str]:
    """Lines to log at INFO when a crawl starts, for a user coming from scrapy-redis: what
    redcrawl chose, and why, where a scrapy-redis setting is given (and mapped) or left
    out (and redcrawl's default differs from scrapy-redis's). Empty when nothing would
    surprise. Pure: the caller logs them once per process (the Scheduler, at open)."""
    env = os.environ if environ is None else environ
    given = _given(scrapy_settings, env)
    settings = Settings.from_scrapy(scrapy_settings, environ=env)
    notes: list[str] = []
    if not {"SCHEDULER_PERSIST", "REDCRAWL_PERSIST"} & set(given):
        notes.append(
            "SCHEDULER_PERSIST is not set: the crawl's state (queue, fingerprints) is kept "
            "when the crawl closes (REDCRAWL_PERSIST=true), while scrapy-redis's default is "
            "False. Running the spider again resumes the crawl, and a finished crawl fetches "
            "nothing new: `redcrawl purge` starts it over; set SCHEDULER_PERSIST = False to "
            "remove the state once the whole crawl is finished.")
    if "REDCRAWL_ORDERING" not in given:
        if "SCHEDULER_QUEUE_CLASS" in given:
            notes.append(
                f"SCHEDULER_QUEUE_CLASS = {_class_path(given['SCHEDULER_QUEUE_CLASS'])}: "
                "redcrawl keeps requests in its own frontier, in this class's order: "
                f"REDCRAWL_ORDERING={settings.ordering} ({_ORDER_NAMES[settings.ordering]}).")
        elif settings.backend == "streams":
            notes.append(
                "SCHEDULER_QUEUE_CLASS is not set: with REDCRAWL_BACKEND=streams requests are "
                "read in arrival order, high-priority streams first; scrapy-redis's default "
                "PriorityQueue takes the highest priority first, always (the lists backend's "
                "REDCRAWL_ORDERING=priority does that).")
        else:
            weights = ":".join(map(str, settings.tier_weights))
            notes.append(
                "SCHEDULER_QUEUE_CLASS is not set: requests are taken first in, first out "
                f"within priority tiers picked by weighted fair choice ({weights}), so low "
                "priorities are never starved; scrapy-redis's default PriorityQueue takes "
                "the highest priority first, always. Set REDCRAWL_ORDERING=priority (or "
                "SCHEDULER_QUEUE_CLASS) for that.")
    hosts = [n for n in ("REDIS_HOST", "REDIS_PORT", "REDCRAWL_REDIS_HOST",
                         "REDCRAWL_REDIS_PORT") if n in given]
    if settings.redis_url is None:
        notes.append(
            "no REDIS_URL (nor REDIS_HOST / REDIS_PORT): redcrawl uses an embedded Redis with "
            f"its data in {settings.embedded_dir}, shared by the processes on this machine "
            "(scrapy-redis would connect to localhost:6379). Set REDIS_URL to share the "
            "crawl with other machines.")
    elif hosts and settings.redis_url != settings._host_url():
        source = next((n for n in ("REDCRAWL_REDIS_URL", "REDIS_URL") if n in given),
                      "a Redis URL")
        notes.append(f"{' and '.join(hosts)} not used: {source} is set "
                     f"({_redacted(settings.redis_url)}), and it wins, as in scrapy-redis.")
    return notes


def startup_warnings(scrapy_settings: Any) -> list[str]:
    """Lines to log at WARNING when a crawl starts: each scrapy-redis setting given that
    redcrawl ignores, with why. Pure, like :func:`startup_notes`."""
    given = _given(scrapy_settings, {})
    for name in _IGNORED:
        value = scrapy_settings.get(name)
        if value is not None and name not in given:
            given[name] = value
    warnings = [f"ignored: {name} = {_class_path(given[name])!r}: {reason}"
                for name, reason in _IGNORED.items() if name in given]
    params = given.get("REDIS_PARAMS", given.get("REDCRAWL_REDIS_PARAMS"))
    if isinstance(params, str):
        with contextlib.suppress(ConfigError):
            params = _dict("REDIS_PARAMS", params)
    if isinstance(params, Mapping):
        warnings += [f"ignored: REDIS_PARAMS[{key!r}]: {reason}"
                     for key, reason in _DROPPED_PARAMS.items() if key in params]
    if "SCHEDULER_DUPEFILTER_KEY" in given and "REDCRAWL_DUPEFILTER_KEY" not in given:
        warnings.append(
            f"ignored: SCHEDULER_DUPEFILTER_KEY = {given['SCHEDULER_DUPEFILTER_KEY']!r}: "
            "redcrawl keeps fingerprints under the crawl's own keys; to bring a scrapy-redis "
            "dupefilter set along, use `redcrawl import-dupefilter`")
    dupefilter = _class_path(scrapy_settings.get("DUPEFILTER_CLASS") or "")
    if dupefilter.startswith("scrapy_redis."):
        warnings.append(
            f"DUPEFILTER_CLASS = {dupefilter}: redcrawl's frontier filters duplicates itself; "
            "scrapy-redis's filter would only log them, on its own Redis connection. Set "
            "DUPEFILTER_CLASS = 'redcrawl.scrapy.DupeFilter'.")
    return warnings


def _redacted(url: str) -> str:
    from redcrawl.connection import redact  # connection imports this module

    return redact(url)


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
