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
import socket
from typing import Any, cast
from urllib.parse import unquote, urlsplit, urlunsplit

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
    "connect_bounded",
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


def _userinfo(url: str) -> str | None:
    """What stands between ``//`` and the URL's last ``@``, when the URL parser would not
    find it all in the netloc: a password holding ``/``, ``#`` or ``?`` unencoded ends the
    netloc early, and the rest of it lands in the path, query or fragment. Told apart
    from an ``@`` in a query value (``client_name=me@host``) by where it is: in the path
    (a database number never holds one), or after a netloc that is no host list."""
    _, sep, rest = url.partition("//")
    end = re.search(r"[/#?]", rest)
    netloc = rest[: end.start()] if end else rest
    if not (sep and netloc) or "@" not in rest or "@" in netloc:
        return None  # (no @; in the netloc: the parser finds it)
    path = re.split(r"[?#]", rest[end.start() :], maxsplit=1)[0] if end else ""
    if "@" in path or not _HOSTS.fullmatch(netloc):
        return rest.rpartition("@")[0]
    return None  # (after a host list, in the query or fragment)


_HOST = r"(?:\[[0-9A-Fa-f:.]+(?:%25[^\]]+)?\]|[^:@\[\],]+)(?::\d*)?"
_HOSTS = re.compile(rf"{_HOST}(?:,{_HOST})*")
"""One host[:port] or more (a cluster URL's), as a URL's netloc without a user (IPv6
literals with a zone id too)."""


def redact(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages and logs). Never
    raises, whatever the URL."""
    if (info := _userinfo(url)) is not None:
        head, _, rest = url.partition("//")
        return f"{head}//***@{rest[len(info) + 1 :]}"
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


def scrub(text: str, url: str) -> str:
    """``text`` (e.g. a URL parser's complaint) with every part of ``url``'s user and
    password replaced by ``***``."""
    info = _userinfo(url)
    if info is None:
        try:
            parts = urlsplit(url)
            info = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else None
        except ValueError:
            info = None
    secret = (info or "").partition(":")[2]  # (the user name is no secret)
    for piece in sorted(re.split(r"[:/#?]", secret), key=len, reverse=True):
        if len(piece) >= 3:
            text = text.replace(piece, "***")
    return text


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
    check_userinfo(url)
    _check_database_path(url)
    if check:
        refuse_tls_at_plain(url)
    try:
        client = redis.Redis.from_url(url, **params)
    except ValueError as exc:
        more = (
            "; or redis+cluster://host:port,... (rediss+cluster:// with TLS) for a Redis Cluster"
            if "scheme" in str(exc)
            else ""
        )
        raise ConfigError(
            "REDCRAWL_REDIS_URL", f"{redact(url)}: {scrub(str(exc), url)}{more}"
        ) from None
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
            raise login_refused(url, exc) from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise RedisUnavailable(redact(url), exc, fix=_tls_fix(url, exc)) from None
        except redis.exceptions.InvalidResponse as exc:  # e.g. an HTTP port
            raise RedisUnavailable(
                redact(url),
                exc,
                problem="no Redis server answers (the server there speaks another protocol)",
                fix="Check the host and port in REDCRAWL_REDIS_URL / REDIS_URL: they name "
                "another kind of server.",
            ) from None
        except redis.exceptions.ResponseError as exc:
            db = client.connection_pool.connection_kwargs.get("db", 0)
            if "DB index is out of range" in str(exc):
                raise ConfigError(
                    "REDCRAWL_REDIS_URL",
                    f"{redact(url)}: the server has no database {db} ({exc}): name a database "
                    "below the server's `databases` setting (16 by default: 0 to 15) in "
                    "REDCRAWL_REDIS_URL / REDIS_URL (redis://host:port/N) or REDIS_DB",
                ) from None
            raise RedisUnavailable(
                redact(url),
                exc,
                problem="Redis refused this client's first command",
                fix="Check the server's configuration and the user's rights (ACL) for PING.",
            ) from None
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


def connect_bounded(
    settings: Settings,
    *,
    url: str | None = None,
    socket_timeout: float,
    connect_timeout: float,
    retries: int,
) -> redis.Redis:
    """A client for the tools that must answer while Redis is hung or down (the API, the
    exporter), not wait it out as a worker does: each command fails after ``1 + retries``
    attempts of at most ``connect_timeout + socket_timeout`` seconds each, with a short
    backoff between them (a refused connection: well under a second). A cluster client
    waits for no failover either (the caller's next call asks again). Nothing is checked
    at start: a Redis that is down answers at the first call."""
    url = url or resolve_url(settings)
    from redcrawl.cluster import is_cluster_url

    return connect(
        settings,
        url=url,
        check=False,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries),
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        **({"outage": 0.0} if is_cluster_url(url) else {}),
    )


def check_userinfo(url: str) -> None:
    """:class:`ConfigError` (the password not shown) for a URL whose user or password
    holds ``/``, ``#`` or ``?`` unencoded: the URL parser would take the rest of it for
    the host, path or query, and say so quoting it."""
    if _userinfo(url) is not None:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: its user or password holds '/', '#' or '?', which end the "
            "address part of a URL: percent-encode them (/ as %2F, # as %23, ? as %3F)",
        )


_DATABASE_PATH = re.compile(r"(/\d*)?/?")


def _check_database_path(url: str) -> None:
    """A ``redis://`` / ``rediss://`` URL's path must be empty or a database number:
    redis-py takes ``/abc`` as database 0 and ``/1/2`` as database 12 without a word."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return  # (redis-py says what is wrong with it)
    if parts.scheme not in ("redis", "rediss"):
        return
    path = unquote(parts.path)
    if _DATABASE_PATH.fullmatch(path) is None:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: its path {path!r} is not a database number; write "
            "redis://host:port/N for database N (no path: database 0), or set REDIS_DB",
        )


def login_refused(url: str, exc: Exception) -> RedisUnavailable:
    """The server refused the client's login (no password given, a wrong one, or one
    given to a server that has none)."""
    if "without any password configured" in str(exc):
        return RedisUnavailable(
            redact(url),
            f"authentication failed: {exc}",
            problem="the URL gives a password but Redis has no password configured",
            fix=(
                "Remove the password from REDCRAWL_REDIS_URL / REDIS_URL (and "
                "REDIS_PARAMS), or configure it on the server (requirepass, or an ACL "
                "user)."
            ),
        )
    needed = "required" in str(exc).lower()
    return RedisUnavailable(
        redact(url),
        f"authentication failed: {exc}",
        problem=(
            "Redis requires a password and none was given"
            if needed
            else "Redis refused the user name or password"
        ),
        fix=(
            "Put the password in the URL (redis://:PASSWORD@host:port/0, or "
            "redis://USER:PASSWORD@host:port/0 for an ACL user; percent-encode any @ : / in "
            "it) in REDCRAWL_REDIS_URL / REDIS_URL, or give it as REDIS_PARAMS = "
            "{'password': ...}."
        ),
    )


_TLS_LOOKING = ("ssl", "tls", "certificate", "handshake", "timeout", "timed out", "eof")
"""Words of a failed connection that TLS may explain (a plain server given a TLS
handshake waits for a command that never comes: the connect times out)."""


def refuse_tls_at_plain(url: str, node: tuple[str, int] | None = None) -> None:
    """For a TLS URL: :class:`RedisUnavailable` at once if its server (``node``: the
    cluster node to ask) answers a plain ``PING`` (a server without TLS: the TLS
    handshake would only time out there, for every retry and, on a cluster, every node:
    90 s). Anything else (no answer, TLS, nothing listening, a malformed URL) is left to
    the connection, which says what it finds."""
    if not url.startswith(("rediss:", "rediss+")):
        return
    if node is None:
        try:
            where = urlsplit(url)
            node = (where.hostname or "", where.port or 6379)
        except ValueError:
            return
    host, port = node
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(16)
    except OSError:
        return
    if reply[:1] in (b"+", b"-"):  # a RESP reply: plain Redis
        tls, plain = _schemes(url)
        raise RedisUnavailable(
            redact(url),
            f"{host}:{port} answered a plain PING",
            problem="the server does not use TLS",
            fix=f"The URL asks for TLS ({tls}): write {plain} instead, or give the port "
            "where the server listens with TLS (its tls-port).",
        )


def _schemes(url: str) -> tuple[str, str]:
    """The TLS scheme of ``url`` and its plain counterpart."""
    if url.startswith("rediss+"):
        return "rediss+cluster://", "redis+cluster://"
    return "rediss://", "redis://"


def _tls_fix(url: str, exc: BaseException) -> str | None:
    """For a ``rediss://`` URL that could not connect in a way TLS may explain: the
    likely reason (not for e.g. a connection refused: nothing listens there)."""
    if not url.startswith(("rediss:", "rediss+")):
        return None
    text = f"{type(exc).__name__} {exc}".lower()
    if not any(word in text for word in _TLS_LOOKING):
        return None
    tls, plain = _schemes(url)
    return (
        f"The URL asks for TLS ({tls}): if the server does not use TLS, write {plain} "
        "instead; if it does, check the port and the certificates (REDIS_PARAMS ssl_*). "
        + RedisUnavailable.DEFAULT_FIX
    )


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
