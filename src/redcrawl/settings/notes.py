"""What to tell a user coming from scrapy-redis when a crawl starts: :func:`startup_notes`
(INFO: where redcrawl's choices differ from scrapy-redis's) and :func:`startup_warnings`
(WARNING: scrapy-redis settings given that redcrawl ignores, and why).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from redcrawl.errors import ConfigError
from redcrawl.settings.model import Settings, scrapy_layers
from redcrawl.settings.table import BY_NAME, DROPPED_PARAMS, IGNORED, ORDER_NAMES, parse_dict


def ignored_setting_reason(name: str) -> str | None:
    """Why a scrapy-redis setting name has no effect in redcrawl, or None."""
    return IGNORED.get(name)


def _given(scrapy_settings: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """The redcrawl and scrapy-redis settings given in ``scrapy_settings`` or ``environ``."""
    project, cmdline = scrapy_layers(scrapy_settings)
    env = {k: v for k, v in environ.items() if k in BY_NAME and k.startswith("REDCRAWL_")}
    return {**project, **env, **cmdline}


def _class_path(value: Any) -> str:
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def startup_notes(scrapy_settings: Any, *, environ: Mapping[str, str] | None = None) -> list[str]:
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
            "in Redis when the crawl closes (REDCRAWL_PERSIST=true), while Scrapy's own "
            "scheduler forgets it and scrapy-redis's default is False. Running the spider "
            "again resumes the crawl, and a finished crawl fetches nothing new: `redcrawl "
            "purge` starts it over; set SCHEDULER_PERSIST = False to remove the state once "
            "the whole crawl is finished."
        )
    if "REDCRAWL_ORDERING" not in given:
        if "SCHEDULER_QUEUE_CLASS" in given:
            notes.append(
                f"SCHEDULER_QUEUE_CLASS = {_class_path(given['SCHEDULER_QUEUE_CLASS'])}: "
                "redcrawl keeps requests in its own frontier, in this class's order: "
                f"REDCRAWL_ORDERING={settings.ordering} ({ORDER_NAMES[settings.ordering]})."
            )
        elif settings.backend == "streams":
            notes.append(
                "SCHEDULER_QUEUE_CLASS is not set: with REDCRAWL_BACKEND=streams requests are "
                "read in arrival order, high-priority streams first; scrapy-redis's default "
                "PriorityQueue takes the highest priority first, always (the lists backend's "
                "REDCRAWL_ORDERING=priority does that)."
            )
        else:
            weights = ":".join(map(str, settings.tier_weights))
            notes.append(
                "SCHEDULER_QUEUE_CLASS is not set: requests are taken first in, first out "
                f"within priority tiers picked by weighted fair choice ({weights}), so low "
                "priorities are never starved; Scrapy's own scheduler and scrapy-redis's "
                "default PriorityQueue take the highest priority first, always. Set "
                "REDCRAWL_ORDERING=priority (or SCHEDULER_QUEUE_CLASS) for that."
            )
    hosts = [
        n
        for n in ("REDIS_HOST", "REDIS_PORT", "REDCRAWL_REDIS_HOST", "REDCRAWL_REDIS_PORT")
        if n in given
    ]
    if settings.redis_url is None:
        notes.append(
            "no REDIS_URL (nor REDIS_HOST / REDIS_PORT): redcrawl uses an embedded Redis with "
            f"its data in {settings.embedded_dir}, shared by the processes on this machine "
            "(scrapy-redis would connect to localhost:6379). Set REDIS_URL to share the "
            "crawl with other machines."
        )
    elif hosts and settings.redis_url != settings._host_url():
        source = next((n for n in ("REDCRAWL_REDIS_URL", "REDIS_URL") if n in given), "a Redis URL")
        notes.append(
            f"{' and '.join(hosts)} not used: {source} is set "
            f"({_redacted(settings.redis_url)}), and it wins, as in scrapy-redis."
        )
    return notes


def startup_warnings(
    scrapy_settings: Any, *, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Lines to log at WARNING when a crawl starts: each scrapy-redis setting given that
    redcrawl ignores, with why, and scrapy-redis components left in the project that
    write to another Redis than the crawl's. Pure, like :func:`startup_notes`."""
    env = os.environ if environ is None else environ
    given = _given(scrapy_settings, {})
    for name in IGNORED:
        value = scrapy_settings.get(name)
        if value is not None and name not in given:
            given[name] = value
    warnings = [
        f"ignored: {name} = {_class_path(given[name])!r}: {reason}"
        for name, reason in IGNORED.items()
        if name in given
    ]
    params = given.get("REDIS_PARAMS", given.get("REDCRAWL_REDIS_PARAMS"))
    if isinstance(params, str):
        with contextlib.suppress(ConfigError):
            params = parse_dict("REDIS_PARAMS", params)
    if isinstance(params, Mapping):
        warnings += [
            f"ignored: REDIS_PARAMS[{key!r}]: {reason}"
            for key, reason in DROPPED_PARAMS.items()
            if key in params
        ]
    if "SCHEDULER_DUPEFILTER_KEY" in given and "REDCRAWL_DUPEFILTER_KEY" not in given:
        warnings.append(
            f"ignored: SCHEDULER_DUPEFILTER_KEY = {given['SCHEDULER_DUPEFILTER_KEY']!r}: "
            "redcrawl keeps fingerprints under the crawl's own keys; to bring a scrapy-redis "
            "dupefilter set along, use `redcrawl import-dupefilter`"
        )
    dupefilter = _class_path(scrapy_settings.get("DUPEFILTER_CLASS") or "")
    if dupefilter.startswith("scrapy_redis."):
        warnings.append(
            f"DUPEFILTER_CLASS = {dupefilter}: redcrawl's frontier filters duplicates itself; "
            "scrapy-redis's filter would only log them, on its own Redis connection. Set "
            "DUPEFILTER_CLASS = 'redcrawl.scrapy.DupeFilter'."
        )
    warnings += _scrapy_redis_components(scrapy_settings, env)
    return warnings


_SCRAPY_REDIS_REDIS = ("REDIS_URL", "REDIS_HOST", "REDIS_PORT")
"""The settings scrapy-redis's own components (RedisPipeline, RedisStatsCollector) read
to find their Redis (``scrapy_redis.connection.get_redis_from_settings``)."""


def _scrapy_redis_components(scrapy_settings: Any, environ: Mapping[str, str]) -> list[str]:
    """scrapy-redis's RedisPipeline / RedisStatsCollector kept in a migrated project
    write to the Redis scrapy-redis's settings name; with none named, localhost:6379
    (scrapy-redis's default). Said when that is not the crawl's Redis (the embedded one,
    or one named by REDCRAWL_REDIS_URL only): where nothing listens, every item fails and
    its page is retried, then dead-lettered."""
    params = scrapy_settings.get("REDIS_PARAMS") or {}
    if isinstance(params, str):
        try:
            params = parse_dict("REDIS_PARAMS", params)
        except ConfigError:
            params = {}
    if any(scrapy_settings.get(n) for n in _SCRAPY_REDIS_REDIS) or (
        isinstance(params, Mapping) and any(params.get(k) for k in ("url", "host", "port"))
    ):
        return []  # scrapy-redis's components and redcrawl read the same settings
    pipelines = scrapy_settings.getdict("ITEM_PIPELINES") or {}
    found = [_class_path(c) for c in pipelines if _class_path(c).startswith("scrapy_redis.")]
    stats = _class_path(scrapy_settings.get("STATS_CLASS") or "")
    if stats.startswith("scrapy_redis."):
        found.append(f"STATS_CLASS {stats}")
    if not found:
        return []
    try:
        url = Settings.from_scrapy(scrapy_settings, environ=environ).redis_url
    except ConfigError:
        return []  # said as the start's own error
    if url is not None:
        parts = urlsplit(url)
        if (
            parts.scheme == "redis"
            and parts.hostname in ("localhost", "127.0.0.1")
            and (parts.port or 6379) == 6379
            and parts.path in ("", "/", "/0")
        ):
            return []  # the crawl's Redis is scrapy-redis's default one
    crawl = "redcrawl's embedded Redis" if url is None else f"the crawl's Redis ({_redacted(url)})"
    return [
        f"{', '.join(found)}: a scrapy-redis component, which writes to the Redis "
        "scrapy-redis's settings name (REDIS_URL, REDIS_HOST / REDIS_PORT); none is set, "
        f"so it writes to scrapy-redis's default localhost:6379, not to {crawl}. If no "
        "Redis listens there every item fails, and redcrawl retries its page, then "
        "dead-letters it (REDCRAWL_MAX_ATTEMPTS). Set REDIS_URL for both, or remove it "
        "(ITEM_PIPELINES)."
    ]


def _redacted(url: str) -> str:
    from redcrawl.connection import redact  # connection imports this module

    return redact(url)
