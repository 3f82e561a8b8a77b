"""Redis clients: from a URL, or an embedded Redis server when no URL is configured.

:func:`connect` is the one client factory. Every client retries connection errors with
exponential backoff (a brief Redis outage during a crawl stalls it instead of failing),
and a server that does not answer at start is a :class:`~redcrawl.errors.RedisUnavailable`
naming the URL.

Without a URL, the embedded default Redis (:mod:`redcrawl.embedded`: a real
``redis-server`` on a unix socket, its append-only file on, shared by the processes of a
machine) is started or joined; :func:`redis_cli_hint` says how to look inside with
``redis-cli``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.exceptions
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from redcrawl.embedded import EmbeddedRedis, redis_server_binary, resolve_url, stop_embedded
from redcrawl.errors import ConfigError, RedisUnavailable
from redcrawl.settings import Settings

__all__ = [
    "EmbeddedRedis",  # re-exported from redcrawl.embedded, as are the next two
    "connect",
    "redact",
    "redis_cli_hint",
    "redis_server_binary",
    "resolve_url",
    "stop_embedded",
]

SOCKET_TIMEOUT = 30.0
"""Seconds a Redis reply may take (longer than any frontier script) before a retry."""

RETRIES = 12
"""Retries of a failed command: with backoff capped at 5 s, about 30 s of outage."""


_QUERY_SECRET = re.compile(r"(?i)((?:^|&)password=)[^&]*")


def redact(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages and logs). Never
    raises, whatever the URL."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"//[^@/]*@", "//***@", url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{hostport}" if ":" in userinfo else netloc
    query = _QUERY_SECRET.sub(r"\1***", parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redis_cli_hint(settings: Settings) -> str:
    """The redis-cli command for the crawl's Redis: ``redis-cli -s SOCKET`` for the
    embedded server, ``redis-cli -u URL`` (password hidden) otherwise. Starts nothing."""
    from redcrawl.cluster import cluster_nodes, is_cluster_url

    if settings.redis_url and is_cluster_url(settings.redis_url):
        plain = cluster_nodes(settings.redis_url)[0]
        return f"redis-cli -c -u {shlex.quote(redact(plain))}"
    if settings.redis_url:
        return f"redis-cli -u {shlex.quote(redact(settings.redis_url))}"
    return EmbeddedRedis(settings.embedded_dir).cli_hint


def connect(
    settings: Settings, *, url: str | None = None, check: bool = True, **overrides: Any
) -> redis.Redis:
    """A redis-py client for ``url`` (default: :func:`resolve_url`), retrying with backoff.

    A ``redis+cluster://`` or ``rediss+cluster://`` URL gives a
    :class:`~redcrawl.cluster.ClusterClient` (a redis-py ``RedisCluster``; see
    :func:`~redcrawl.cluster.is_cluster_url`), typed as ``redis.Redis`` like the other
    clients: every command of ``redis.Redis`` redcrawl uses works on it.

    ``check`` pings the server now and raises :class:`RedisUnavailable` if it does not
    answer. ``settings.redis_params`` and ``overrides`` go to redis-py.
    """
    url = url or resolve_url(settings)
    from redcrawl.cluster import connect_cluster, is_cluster_url

    if is_cluster_url(url):
        return cast(redis.Redis, connect_cluster(settings, url, check=check, **overrides))
    params: dict[str, Any] = {
        "retry": Retry(ExponentialBackoff(cap=5.0, base=0.05), RETRIES),
        "retry_on_error": [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
        "health_check_interval": 30,
        # never wait forever on a silent network (a partition without RST)
        "socket_timeout": SOCKET_TIMEOUT,
        **(
            {}
            if url.startswith("unix:")
            else {"socket_keepalive": True, "socket_connect_timeout": 10}
        ),
        **settings.redis_params,
        # as scrapy-redis: REDIS_DB for a URL that names no database (the URL's wins)
        **({} if settings.redis_db is None else {"db": settings.redis_db}),
        **overrides,
    }
    try:
        client = redis.Redis.from_url(url, **params)
    except ValueError as exc:
        raise ConfigError("REDCRAWL_REDIS_URL", f"{redact(url)}: {exc}") from None
    if check:
        probe = redis.Redis.from_url(
            url,
            **{
                **params,
                "retry": Retry(NoBackoff(), 0),
                "socket_connect_timeout": 5,
                "socket_timeout": 5,
            },
        )
        try:
            probe.ping()
            enabled = _cluster_enabled(probe)
        except redis.exceptions.AuthenticationError as exc:
            raise RedisUnavailable(redact(url), f"authentication failed: {exc}") from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise RedisUnavailable(redact(url), exc) from None
        finally:
            probe.close()
        if enabled:
            client.close()
            raise ConfigError(
                "REDCRAWL_REDIS_URL",
                f"{redact(url)} is a Redis Cluster node: a single-server client would fail on "
                "every key of another node (MOVED); write the URL as "
                f"{_as_cluster(url)} (docs/cluster.md)",
            )
    return client


def _cluster_enabled(client: redis.Redis) -> bool:
    """Whether the server says ``cluster_enabled:1`` (False if INFO is not allowed)."""
    try:
        info = client.info("cluster")
    except redis.exceptions.ResponseError:  # e.g. an ACL user without INFO
        return False
    return bool(int(info.get("cluster_enabled", 0) or 0))


def _as_cluster(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}+cluster{sep}{rest}" if scheme in ("redis", "rediss") else url


def __getattr__(name: str) -> Any:
    """The cluster names this module had before :mod:`redcrawl.cluster` (it imports this
    module, so they are looked up there on first use)."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from redcrawl import cluster

    if name in cluster.__all__:
        return getattr(cluster, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
