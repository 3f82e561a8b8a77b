"""The :class:`Settings` object: typed fields with their defaults, validation, and loading
from setting names, the environment and Scrapy settings, in precedence order.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from redcrawl.errors import ConfigError
from redcrawl.keys import validate_crawl_name
from redcrawl.settings.table import BY_NAME, DROPPED_PARAMS, SPECS, Ordering

if TYPE_CHECKING:
    from redcrawl.politeness.backoff import BackoffPolicy


COMMAND_ENV = frozenset({"REDCRAWL_MIGRATE_TO", "REDCRAWL_SOURCE_URL"})
"""``REDCRAWL_*`` names that are not settings but a command's option (``redcrawl migrate
--to``, ``--source-url``: a URL with a password is better kept out of the process list),
so not unknown settings either (docs/cli.md)."""


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
    partitions: int = 1
    ordering: Ordering = "fifo"
    tier_weights: tuple[int, ...] = (5, 3, 2)
    tier_bounds: tuple[int, ...] = (1, 0)
    lease_ttl: float = 60.0
    heartbeat_interval: float | None = None
    max_attempts: int = 3
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0
    batch_size: int = 500
    prefetch: int = 16
    lookahead: int = 2
    poll_interval: float = 0.5
    redis_outage_limit: float = 60.0
    wait_replicas: int = 0
    wait_timeout: float = 1.0
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
    robots_shared: bool = True
    robots_ttl: float = 86400.0
    robots_error_ttl: float = 600.0
    robots_lock_ttl: float = 30.0
    robots_max_crawl_delay: float = 30.0
    robots_max_body: int = 500 * 1024
    robots_cache_max_bytes: int = 64 * 1024 * 1024
    api_host: str = "127.0.0.1"
    api_port: int = 8700
    api_tokens: tuple[str, ...] = ()
    api_admin_tokens: tuple[str, ...] = ()
    api_max_batch: int = 1000
    api_max_body: int = 16 * 1024 * 1024
    api_allowed_hosts: tuple[str, ...] = ()
    max_idle_time: float = 0.0
    politeness: bool = True
    politeness_key: Literal["host", "domain"] = "host"
    politeness_concurrency: int = 8
    politeness_concurrency_per_ip: int = 0
    politeness_delay: float = 0.0
    politeness_randomize: bool = True
    politeness_jitter: float = 0.5
    politeness_slots: dict[str, Any] = field(default_factory=dict)
    autothrottle_enabled: bool = False
    autothrottle_shared: bool = True
    autothrottle_start_delay: float = 5.0
    autothrottle_max_delay: float = 60.0
    autothrottle_target_concurrency: float = 1.0
    autothrottle_debug: bool = False
    defer_http_codes: tuple[int, ...] = (429, 503)
    max_deferrals: int = 20
    retry_after_cap: float = 3600.0
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    backoff_jitter: float = 0.5
    backoff_forgive_after: int = 10
    politeness_start_window: float = 0.03

    def __post_init__(self) -> None:
        # Every field goes through its setting's parser, however the object was built.
        for spec in SPECS:
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
        if self.backoff_cap < self.backoff_base:
            raise ConfigError(
                "REDCRAWL_BACKOFF_CAP",
                f"{self.backoff_cap}s is below REDCRAWL_BACKOFF_BASE ({self.backoff_base}s); "
                "raise the cap or lower the base",
            )
        if self.heartbeat_interval is not None and self.heartbeat_interval >= self.lease_ttl:
            raise ConfigError(
                "REDCRAWL_HEARTBEAT_INTERVAL",
                f"{self.heartbeat_interval}s is not shorter than REDCRAWL_LEASE_TTL "
                f"({self.lease_ttl}s); a heartbeat must come before the lease runs out",
            )

    # --- builders ------------------------------------------------------------------
    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], *, base: Settings | None = None, strict_prefix: bool = True
    ) -> Settings:
        """Build from setting names (canonical or scrapy-redis aliases) to values.

        Names outside redcrawl's and scrapy-redis's are ignored, except unknown
        ``REDCRAWL_*`` names, which are an error (a typo must not pass silently).
        """
        changes: dict[str, Any] = {}
        values = _jitter_alias(values)
        for name, value in values.items():
            spec = BY_NAME.get(name)
            if spec is None:
                if strict_prefix and name.startswith("REDCRAWL_") and name not in COMMAND_ENV:
                    known = [n for n in BY_NAME if n.startswith("REDCRAWL_")]
                    near = difflib.get_close_matches(name, known, n=2)
                    hint = f"did you mean {' or '.join(near)}? " if near else ""
                    raise ConfigError(
                        name, f"unknown setting; {hint}every setting is listed in docs/settings.md"
                    )
                continue
            if spec.field == "redis_url" and value == "":
                value = None  # as scrapy-redis: an empty URL is none (host and port count)
            if value is None and spec.field not in changes:
                continue
            # The canonical name wins over an alias when both are given.
            if spec.field in changes and name != spec.name:
                continue
            changes[spec.field] = spec.parse(name, value)
        base = base or cls()
        _connection_from_params(changes)
        if (
            "redis_url" not in changes
            and {"redis_host", "redis_port", "redis_db"} & set(changes)
            and (base.redis_url is None or base.redis_url == base._host_url())
        ):
            # as scrapy-redis: host, port or db alone select a server (default
            # localhost:6379), unless a URL is set (here or at a lower level)
            changes["redis_url"] = base.replace(**changes)._host_url()
        return base.replace(**changes)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, base: Settings | None = None
    ) -> Settings:
        """Overlay ``REDCRAWL_*`` environment variables on ``base`` (or the defaults)."""
        env = os.environ if environ is None else environ
        return cls.from_mapping(
            {k: v for k, v in env.items() if k.startswith("REDCRAWL_")}, base=base
        )

    @classmethod
    def from_scrapy(cls, settings: Any, *, environ: Mapping[str, str] | None = None) -> Settings:
        """From a Scrapy ``Settings`` object (or a dict) and the environment.

        Precedence, highest first: Scrapy's command line (``scrapy crawl -s``, priority
        ``cmdline``), then ``REDCRAWL_*`` environment variables, then the rest of the Scrapy
        settings (the spider's ``custom_settings``, the project's ``settings.py``). A plain
        dict counts as project settings.
        """
        project, cmdline = scrapy_layers(settings)
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

    @property
    def backoff_policy(self) -> BackoffPolicy:
        """The 429/503 backoff of fleet-wide politeness (REDCRAWL_BACKOFF_*,
        REDCRAWL_RETRY_AFTER_CAP), as the frontier applies it."""
        from redcrawl.politeness.backoff import BackoffPolicy

        return BackoffPolicy(
            base=self.backoff_base,
            cap=self.backoff_cap,
            jitter=self.backoff_jitter,
            forgive_after=self.backoff_forgive_after,
            retry_after_cap=self.retry_after_cap,
        )

    def retry_delay(self, attempts: int) -> float:
        """Exponential backoff: ``retry_backoff * 2**(attempts-1)``, capped."""
        if self.retry_backoff <= 0:
            return 0.0
        return float(min(self.retry_backoff_max, self.retry_backoff * 2.0 ** max(0, attempts - 1)))


_CONNECTION_PARAMS = (
    ("url", "redis_url"),
    ("host", "redis_host"),
    ("port", "redis_port"),
    ("db", "redis_db"),
)


def _connection_from_params(changes: dict[str, Any]) -> None:
    """Move REDIS_PARAMS' url/host/port/db to their settings (scrapy-redis reads them from
    either place; the named settings win), so they never reach redis-py twice."""
    params = changes.get("redis_params")
    moved = [key for key, _ in _CONNECTION_PARAMS] + list(DROPPED_PARAMS)
    if not params or not any(key in params for key in moved):
        return
    params = {k: v for k, v in params.items() if k not in DROPPED_PARAMS}
    for key, name in _CONNECTION_PARAMS:
        if key in params:
            value = params.pop(key)
            if name not in changes and value is not None:
                changes[name] = BY_NAME[f"REDCRAWL_{name.upper()}"].parse(
                    f"REDIS_PARAMS['{key}']", value
                )
    changes["redis_params"] = params


CMDLINE_PRIORITY = 40
"""Scrapy's priority of ``-s`` settings (``SETTINGS_PRIORITIES['cmdline']``)."""


def scrapy_layers(settings: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The redcrawl and scrapy-redis settings in ``settings``: (below the command line,
    from the command line)."""
    names = [*BY_NAME, *(k for k in _keys(settings) if str(k).startswith("REDCRAWL_"))]
    getpriority = getattr(settings, "getpriority", None)
    project: dict[str, Any] = {}
    cmdline: dict[str, Any] = {}
    for name in dict.fromkeys(names):
        value = settings.get(name)
        if value is None:
            continue
        priority = getpriority(name) if getpriority is not None else None
        (cmdline if (priority or 0) >= CMDLINE_PRIORITY else project)[name] = value
    _jitter(settings, project, cmdline)
    return project, cmdline


def _jitter_alias(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """``DOWNLOAD_DELAY_JITTER`` in a plain mapping (``--set``, a dict): read as Scrapy
    2.19 reads it at the same priority, over ``RANDOMIZE_DOWNLOAD_DELAY``."""
    if values.get("DOWNLOAD_DELAY_JITTER") is None:
        return values
    project: dict[str, Any] = {}
    _jitter(values, project, project)
    rest = {k: v for k, v in values.items() if k != "RANDOMIZE_DOWNLOAD_DELAY"}
    return {**rest, **project}


def _jitter(settings: Any, project: dict[str, Any], cmdline: dict[str, Any]) -> None:
    """Scrapy 2.19's ``DOWNLOAD_DELAY_JITTER`` (the delay's random variation, 0 for none)
    replaces ``RANDOMIZE_DOWNLOAD_DELAY``, which wins only when set at a higher priority
    (Scrapy's ``_default_jitter``). The frontier varies a delay by ±50% or not at all: a
    jitter other than 0 turns it on."""
    jitter = settings.get("DOWNLOAD_DELAY_JITTER")
    if jitter is None:
        return
    getpriority = getattr(settings, "getpriority", None)

    def priority(name: str) -> int:
        if getpriority is not None:
            return int(getpriority(name) or 0)
        return 20 if settings.get(name) is not None else -1  # a dict: project settings

    old, new = priority("RANDOMIZE_DOWNLOAD_DELAY"), priority("DOWNLOAD_DELAY_JITTER")
    if old > 0 and old > new:
        # RANDOMIZE_DOWNLOAD_DELAY, as read above, with Scrapy's range (0.5)
        project.pop("DOWNLOAD_DELAY_JITTER", None)
        cmdline.pop("DOWNLOAD_DELAY_JITTER", None)
        return
    try:
        randomize = float(jitter) != 0
    except (TypeError, ValueError):
        raise ConfigError(
            "DOWNLOAD_DELAY_JITTER", f"{jitter!r} is not a number; give e.g. 0.5, or 0 for none"
        ) from None
    project.pop("RANDOMIZE_DOWNLOAD_DELAY", None)
    cmdline.pop("RANDOMIZE_DOWNLOAD_DELAY", None)
    layer = cmdline if new >= CMDLINE_PRIORITY else project
    layer["RANDOMIZE_DOWNLOAD_DELAY"] = randomize


def _keys(settings: Any) -> Iterable[Any]:
    try:
        return list(cast(Iterable[Any], settings))
    except TypeError:
        return []
