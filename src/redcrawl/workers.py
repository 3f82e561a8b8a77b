# Over 450 lines on purpose: command, spider check, supervisor, runner: one unit all callers share.
"""Run and supervise N local Scrapy worker processes on one crawl.

The library side of ``redcrawl crawl`` (and of ``redcrawl demo``, the test harness and
the crawl benchmark): :func:`worker_command` is the one place a worker's command line is
built; :class:`Fleet` starts the processes and supervises them; :func:`run_workers` opens
the crawl's frontier, runs a fleet on it and reports progress through a callback.

What the supervisor guarantees:

* **Output is always drained.** Each worker's stdout and stderr go to its own log file
  (``<log_dir>/w<i>.log``; a restarted worker appends to its file), or to this process's
  own stdout/stderr when no folder is given. A pipe nobody reads would block a worker in
  a write once it is full (Scrapy's default ``LOG_LEVEL`` is DEBUG).
* **Signals.** The first SIGINT, SIGTERM or SIGHUP sends SIGINT to every worker (Scrapy
  closes cleanly: what it holds is finished or given back); a second one SIGKILLs every
  worker's process group. Workers run in their own sessions (a terminal's Ctrl-C reaches
  only the supervisor, which forwards it once), and on Linux they get SIGTERM if the
  supervisor itself dies (``PR_SET_PDEATHSIG``), so none is left orphaned. A signal the
  process was started ignoring stays ignored (SIGHUP under ``nohup``).
* **Restarts.** A worker that exits non-zero while the crawl is unfinished (work pending,
  or nothing pushed yet) or another worker still runs is restarted
  after ``backoff * 2**k`` seconds (k = restarts so far), at most ``max_restarts`` times;
  each exit and restart is reported as a :class:`WorkerEvent`. After every exit, whatever
  its status, what the gone worker still holds is given back (``on_crash``), so its
  requests need not wait for their leases to expire (a worker SIGINTed just as its
  spider opens exits 0 without closing it). A worker that closed with a redcrawl
  failure reason that is not transient (:data:`NOT_TRANSIENT`: the reason it wrote to
  its failure file, :data:`FAILURE_FILE_ENV`, whatever the log mode), that exited with
  Scrapy's usage error (2), or that exited 1 on a traceback of code that does not load
  (:data:`FATAL_AT_START`: a syntax error in the spider, a missing module) is not
  restarted: it would fail the same way. Without a log folder a worker's stderr is
  copied to this process's stderr by a thread that keeps its start and end, so that its
  run is read in both modes.
* **Said, not only logged.** The CRITICAL lines (and the ERROR lines naming redcrawl) of
  a worker's last run travel with the event of its exit (:attr:`WorkerEvent.problems`),
  and a worker that exits 0 while the crawl is unfinished (stopped by a signal of its
  own, a CLOSESPIDER_* limit) is reported: it is not restarted, the others go on. When
  every worker ends so while the crawl is unfinished, :func:`run_workers`'s result says
  so (:attr:`ExitCode.UNFINISHED`), not success.

The live display fed by :func:`run_workers`'s ``progress`` callback is
:class:`redcrawl.progress.ProgressDisplay`.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import dataclasses
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Literal

from redcrawl.errors import ConfigError, RedcrawlError, UnknownSpider
from redcrawl.failure_file import FAILURE_FILE_ENV
from redcrawl.feeds import WORKER_TOKEN, per_worker
from redcrawl.transport import WORKER_ADVICE

if TYPE_CHECKING:
    from redcrawl.frontier import Counts
    from redcrawl.settings import Settings

__all__ = [
    "ExitCode",
    "Fleet",
    "FleetResult",
    "Tick",
    "UnknownSpider",
    "WorkerEvent",
    "check_spider",
    "claim_log_dir",
    "run_workers",
    "spider_name",
    "spider_settings",
    "worker_command",
]

REDCRAWL_COMPONENTS = (
    "SCHEDULER=redcrawl.scrapy.Scheduler",
    "DUPEFILTER_CLASS=redcrawl.scrapy.DupeFilter",
)
"""The two settings that put a Scrapy project on redcrawl."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_signals() -> list[signal.Signals]:
    """The stop signals this process takes: not one it was started ignoring (``nohup``
    ignores SIGHUP, so a nohup'd crawl goes on when its terminal hangs up)."""
    return [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]


STOPS_RECEIVED: list[int] = []
"""Stop signals received by :func:`stop_on_signals`'s handler (outside a fleet's run): a
fleet that starts after one starts no worker (the KeyboardInterrupt of a Ctrl-C may have
been raised in a ``__del__``, where Python ignores it)."""


class Stopped(SystemExit):
    """SIGTERM or SIGHUP outside a fleet's run (:func:`stop_on_signals`): the command
    unwinds as on an error (``with`` blocks and atexit run: the embedded Redis it started
    is stopped, not orphaned) and exits 128 + N."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _stop_now(signum: int, frame: FrameType | None) -> None:
    STOPS_RECEIVED.append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """For a whole command that starts an embedded Redis or a fleet (``redcrawl crawl``,
    ``demo``): a stop signal before or after the fleet runs unwinds the command instead
    of ending it by the signal's default action (SIGTERM and SIGHUP skip atexit, so an
    embedded Redis started by the command was left running). The fleet's own handlers
    take over while it runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    STOPS_RECEIVED.clear()
    previous = {s: signal.signal(s, _stop_now) for s in _stop_signals()}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


PROGRESS_TIMEOUT = 2.0
"""Seconds a progress read of :func:`run_workers` may wait for Redis (no retries)."""

NOT_TRANSIENT = frozenset(
    {"config_error", "layout_mismatch", "unstorable_request", "crawl_vanished"}
)
"""redcrawl failure reasons (stat ``redcrawl/failure``, the reason of the worker's CRITICAL
line) that a restart cannot cure: a wrong setting, settings that change the crawl's
layout, a request the spider makes that cannot be stored, a crawl whose state is gone.
``redis_unavailable`` and ``redis_error`` are transient: the worker is restarted."""

SCRAPY_USAGE_ERROR = 2
"""The exit status of a ``scrapy`` command given wrong arguments (``UsageError``, e.g. "No
spider found in file"): not restarted either."""

_CLOSED = re.compile(r"Spider closed \(([^)]*)\)")
_RECEIVED = re.compile(r"Received (SIG[A-Z0-9]+)")
_TRACEBACK = "Traceback (most recent call last):"
_OPENED = "Spider opened"
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
FATAL_AT_START = frozenset(
    {"SyntaxError", "IndentationError", "TabError", "ImportError", "ModuleNotFoundError"}
)
"""Exceptions of a worker's last traceback that make its exit deterministic: its code (the
spider, the project's modules, a component named in a setting) does not load, and will not
load on a restart either; only when raised before the spider opened (an ImportError in a
callback is restarted). Any other exception raised by a module's code as it is imported
(:attr:`RunLog.import_failure`) may be transient (a service not up yet): it is restarted
as any crash is, its restarts saying the exception and where it was raised."""
_PROBLEM = re.compile(r"\] CRITICAL: |\[redcrawl[\w.]*\] ERROR: |\] ERROR: redcrawl")
"""A CRITICAL line, or an ERROR line of redcrawl's loggers or saying ``redcrawl: ...``
(not the spider's own errors, shown by Scrapy as ``Spider error processing``)."""


class ExitCode(IntEnum):
    """Exit codes of ``redcrawl crawl`` (and of the other commands where they apply). A
    crawl stopped by a signal exits with 128 + the signal's number (130 for SIGINT, 143
    for SIGTERM, 129 for SIGHUP)."""

    OK = 0
    FAILED = 1
    """A worker failed (after its restarts), or a command failed."""
    USAGE = 2
    """Bad usage or configuration (an unknown spider, a malformed setting)."""
    REDIS = 3
    """Redis unreachable, or no crawl state where an inspection command looked."""
    DEAD_LETTERS = 4
    """``crawl --fail-on-dead``: the crawl finished with dead letters."""
    UNFINISHED = 5
    """Every worker stopped (exit 0) before the crawl finished: each was stopped by a
    signal sent to it alone (``pkill -f "scrapy crawl"``) or a ``CLOSESPIDER_*`` limit.
    Nothing failed; the same command resumes the crawl."""


# --- commands ------------------------------------------------------------------------


def _pairs(values: Iterable[str] | Mapping[str, object]) -> list[str]:
    if isinstance(values, Mapping):
        return [f"{k}={v}" for k, v in values.items()]
    return list(values)


def worker_command(
    spider: str | Path,
    *,
    settings: Iterable[str] | Mapping[str, object] = (),
    spider_args: Iterable[str] | Mapping[str, object] = (),
    redcrawl: bool = True,
    python_args: Sequence[str] = (),
    outputs: Sequence[str] = (),
) -> list[str]:
    """The command line of one Scrapy worker: ``scrapy runspider FILE`` for a ``.py``
    path, else ``scrapy crawl NAME``, on redcrawl's scheduler and dupefilter (unless
    ``redcrawl`` is off, for comparisons), with ``-s NAME=VALUE`` for each setting,
    ``-a NAME=VALUE`` for each spider argument and ``-o FILE`` for each of ``outputs``
    (feeds, appended to). ``python_args`` go to the interpreter before ``-m scrapy``
    (e.g. ``["-m", "cProfile", "-o", "out.prof"]``)."""
    spider = str(spider)
    verb = "runspider" if spider.endswith(".py") else "crawl"
    cmd = [sys.executable, *python_args, "-m", "scrapy", verb, spider]
    for item in (*(REDCRAWL_COMPONENTS if redcrawl else ()), *_pairs(settings)):
        cmd += ["-s", item]
    if redcrawl:  # each item of a local feed in its file before its request is done
        from redcrawl.scrapy.feed_storage import FEED_STORAGES_BASE  # (imports Scrapy)

        cmd += ["-s", f"FEED_STORAGES_BASE={json.dumps(FEED_STORAGES_BASE)}"]
    for item in _pairs(spider_args):
        cmd += ["-a", item]
    for output in outputs:
        cmd += ["-o", output]
    return cmd


def spider_name(spider: str) -> str:
    """The spider's name: from a file's ``name = "..."``, else the argument itself."""
    if spider.endswith(".py"):
        import re

        text = Path(spider).read_text(encoding="utf-8")
        found = re.search(r"""^\s+name\s*=\s*["']([^"']+)["']""", text, re.M)
        return found.group(1) if found else Path(spider).stem
    return spider


def in_scrapy_project() -> bool:
    """Whether this process runs inside a Scrapy project (a ``scrapy.cfg`` here or in a
    parent folder, or ``SCRAPY_SETTINGS_MODULE`` set), as ``scrapy crawl`` decides it."""
    from scrapy.utils.conf import closest_scrapy_cfg

    return bool(closest_scrapy_cfg() or os.environ.get("SCRAPY_SETTINGS_MODULE"))


def project_spiders() -> list[str]:
    """The spider names of the Scrapy project this process runs in (empty outside one)."""
    if not in_scrapy_project():
        return []
    from scrapy.spiderloader import get_spider_loader

    settings = project_settings()
    try:
        return sorted(get_spider_loader(settings).list())
    except Exception as exc:  # the user's code: `scrapy crawl` fails the same way
        raise UnknownSpider(f"{UNLOADABLE}: {describe_error(exc)}") from None


UNLOADABLE = (
    "this Scrapy project cannot be loaded (its settings and every spider module, as "
    "`scrapy crawl` loads them)"
)


def project_settings() -> Any:
    """The Scrapy project's settings (``get_project_settings``), or :class:`UnknownSpider`
    saying what is broken when its settings module does not import: every worker
    would fail the same way."""
    from scrapy.utils.project import get_project_settings

    try:
        return get_project_settings()
    except Exception as exc:  # the user's code
        raise UnknownSpider(f"{UNLOADABLE}: {describe_error(exc)}") from None


def describe_error(exc: BaseException) -> str:
    """``Type: message (file, line N)``: an error in the user's code, in one line."""
    import traceback

    said = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    line = said[-1] if said else type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{line} ({exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    # the innermost frame of the user's code: not Python's nor an installed package's
    import sysconfig

    paths = sysconfig.get_paths()
    libraries = tuple({paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]})
    own = [f for f in frames if not f.filename.startswith(("<", *libraries))]
    if own or frames:
        where = (own or frames)[-1]
        return f"{line} ({where.filename}, line {where.lineno})"
    return line


def check_spider(spider: str) -> str:
    """The name of ``spider`` (a ``.py`` file, or a spider of the current Scrapy
    project), or :class:`UnknownSpider` before any worker starts."""
    if spider.endswith(".py"):
        if not Path(spider).is_file():
            raise UnknownSpider(f"spider file {spider} does not exist")
        return spider_name(spider)
    if not in_scrapy_project():
        raise UnknownSpider(
            f"{spider!r} is not a .py file and this is not a Scrapy project (no scrapy.cfg "
            "in this folder or above): run from the project's folder, or give the path of "
            "the spider's file"
        )
    names = project_spiders()
    if spider not in names:
        listed = ", ".join(names) if names else "none"
        raise UnknownSpider(
            f"no spider named {spider!r} in this Scrapy project; its spiders: {listed}", names
        )
    return spider


def spider_settings(spider: str) -> dict[str, Any]:
    """The ``custom_settings`` of ``spider`` (a spider of the current project, or the
    spider class of a ``.py`` file, imported as ``scrapy runspider`` does): they beat the
    project's settings in the workers, so the command reads them too. Empty when the
    spider cannot be loaded here (its workers will say why)."""
    try:
        if spider.endswith(".py"):
            import importlib.util

            from scrapy.utils.spider import iter_spider_classes

            spec = importlib.util.spec_from_file_location("_redcrawl_spider", spider)
            if spec is None or spec.loader is None:
                return {}
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # (dataclasses look their module up there)
            try:
                spec.loader.exec_module(module)
            finally:
                sys.modules.pop(spec.name, None)
            classes = list(iter_spider_classes(module))
            cls = classes[0] if len(classes) == 1 else None
        else:
            from scrapy.spiderloader import get_spider_loader
            from scrapy.utils.project import get_project_settings

            cls = get_spider_loader(get_project_settings()).load(spider)
    except Exception:  # the user's code: its workers report its errors
        return {}
    custom = getattr(cls, "custom_settings", None)
    return dict(custom) if isinstance(custom, Mapping) else {}


# --- supervision ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerEvent:
    """Something that happened to a worker, for the terminal."""

    kind: Literal["exited", "restarting", "failed", "stopping", "killing", "released", "warning"]
    worker: str
    """``w<i>``, or ``all`` for the fleet."""
    message: str
    returncode: int | None = None
    log_tail: str = ""
    """The end of the worker's log (``failed`` and ``restarting``)."""
    problems: str = ""
    """The CRITICAL lines, and the ERROR lines naming redcrawl, of the worker's last run
    (a worker's log says why it failed there, before its closing stats dump)."""
    failure: str | None = None
    """The redcrawl failure reason of the worker's last run (``redcrawl/failure``)."""


class _Capture:
    """A worker's stderr when it has no log file (``--logs -``): copied to this process's
    stderr as it comes, its first HEAD and last TAIL bytes kept to read its run from."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.cut = False
        self.fd = stream.fileno()
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream: IO[bytes]) -> None:
        with stream:
            while chunk := os.read(stream.fileno(), 65536):
                view = memoryview(chunk)
                while view:
                    try:
                        view = view[os.write(2, view) :]
                    except OSError:
                        break  # our stderr is gone: keep draining the worker
                room = HEAD - len(self.head)
                self.head += chunk[:room]
                self.tail += chunk[room:] if room > 0 else chunk
                if len(self.tail) > TAIL:
                    del self.tail[: len(self.tail) - TAIL]
                    self.cut = True

    def text(self) -> str:
        """What it captured, once the worker has exited. Its output is in the pipe
        already: waited for up to 0.3 s, longer (at most 2 s) only while the pipe still
        has unread bytes. A child of the worker (a browser) may hold the pipe open for
        long: the supervisor does not wait for it, the thread (a daemon) goes on
        copying what it writes."""
        self.thread.join(0.3)
        deadline = time.monotonic() + 2.0
        while self.thread.is_alive() and self._unread() and time.monotonic() < deadline:
            self.thread.join(0.02)
        return (bytes(self.head) + (b"\n" if self.cut else b"") + bytes(self.tail)).decode(
            errors="replace"
        )

    def _unread(self) -> bool:
        """Bytes in the pipe that the thread has not read yet."""
        count = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, count)
        except OSError:  # closed: the thread has read it all
            return False
        return count[0] > 0


@dataclass(slots=True)
class _Worker:
    index: int
    log: Path | None
    proc: subprocess.Popen[bytes] | None = None
    failure_file: Path | None = None
    """Where its current run writes its redcrawl failure reason (:data:`FAILURE_FILE_ENV`)."""
    capture: _Capture | None = None
    restarts: int = 0
    restart_at: float | None = None
    log_start: int = 0
    """Where its current run's output starts in its log."""
    returncode: int | None = None
    """Its final exit status, once it will not run again."""

    @property
    def name(self) -> str:
        return f"w{self.index}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass(frozen=True, slots=True)
class FleetResult:
    """How a fleet ended."""

    returncodes: list[int | None]
    """Each worker's final exit status (negative: killed by that signal)."""
    restarts: int
    signal: int | None
    """The first stop signal received, if any."""
    logs: list[Path]
    unfinished: bool = False
    """No signal, no failure, but the crawl is not finished: every worker was stopped
    from outside (:attr:`ExitCode.UNFINISHED`). Set by :func:`run_workers`."""

    @property
    def failed(self) -> list[int]:
        return [i for i, rc in enumerate(self.returncodes) if rc != 0]

    @property
    def code(self) -> int:
        if self.signal is not None:
            return 128 + self.signal
        if self.failed:
            return ExitCode.FAILED
        return ExitCode.UNFINISHED if self.unfinished else ExitCode.OK


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def log_tail(path: Path | None, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    if path is None:
        return ""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True, slots=True)
class RunLog:
    """What a worker's log says about its last run."""

    problems: list[str]
    """Its CRITICAL lines and the ERROR lines naming redcrawl (at most 10)."""
    finish: str | None
    """Scrapy's finish reason (``Spider closed (...)``)."""
    signal: str | None
    """The signal Scrapy said it received (``Received SIGTERM``)."""
    exception: str | None = None
    """The last line of its last Python traceback (``SyntaxError: expected ':'``)."""
    traceback: list[str] = dataclasses.field(default_factory=list)
    """The end of its last traceback (where the error is, and the error)."""
    importing: bool = False
    """Its last traceback went through Python's import machinery: the exception was
    raised by a module's own code as it was imported (a spider reading a variable that
    is not set, connecting to a service that is not up, ...)."""
    at_start: bool = True
    """Its last traceback came before Scrapy's first ``Spider opened`` line."""

    @property
    def fatal(self) -> str | None:
        """The exception of its last traceback when it is one of :data:`FATAL_AT_START`
        and came before the spider opened: its code does not load."""
        if self.exception is None or not self.at_start:
            return None
        kind = self.exception.split(":", 1)[0].rsplit(".", 1)[-1]
        return self.exception if kind in FATAL_AT_START else None

    @property
    def import_failure(self) -> str | None:
        """The exception of its last traceback when any other exception was raised by a
        module as it was imported, before the spider opened: it may be transient (a
        service not up yet), so it is restarted as any crash is (up to ``max_restarts``),
        each restart saying it with the end of its traceback."""
        if self.exception is None or not self.at_start or not self.importing:
            return None
        return None if self.fatal else self.exception


HEAD, TAIL = 65536, 262144
"""Bytes of a long run's log read from its start (refusals at start) and from its end
(a failure during the crawl, the closing stats)."""


def read_run(path: Path | None, start: int = 0) -> RunLog:
    """What the run of a worker whose output starts at ``start`` in ``path`` said: read
    whole up to HEAD + TAIL bytes, else its first HEAD and its last TAIL bytes."""
    text = ""
    if path is not None:
        try:
            with path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(start)
                if size - start <= HEAD + TAIL:
                    data = f.read()
                else:
                    data = f.read(HEAD) + b"\n"
                    f.seek(size - TAIL)
                    data += f.read()
            text = data.decode(errors="replace")
        except OSError:
            pass
    return parse_run(text)


def parse_run(text: str) -> RunLog:
    """What a worker run's output (its log, or its captured stderr) says."""
    problems: list[str] = []
    finish = received = exception = None
    block: list[str] | None = None  # the last traceback, up to its exception line
    tb: list[str] = []
    importing = through_import = opened = False
    at_start = True
    for line in text.splitlines():
        if not opened and _OPENED in line:
            opened = True
        if _PROBLEM.search(line) and len(problems) < 10:
            problems.append(line)
        if (m := _CLOSED.search(line)) is not None:
            finish = m.group(1)
        if (m := _RECEIVED.search(line)) is not None:
            received = received or m.group(1)
        if line.startswith(_TRACEBACK):
            block, through_import = [], False
        elif block is not None:
            if line[:1] in (" ", "\t"):
                if line.lstrip().startswith('File "<frozen importlib._bootstrap'):
                    through_import = True
                if not line.lstrip().startswith('File "<frozen'):  # Python's own frames
                    block.append(line)
            elif _EXCEPTION.match(line) is not None:
                exception, tb, block = line.strip(), [*block[-6:], line], None
                importing, at_start = through_import, not opened
            else:
                block = None
    return RunLog(problems, finish, received, exception, tb, importing, at_start)


def _prctl() -> Any:
    """libc's ``prctl``, looked up in the parent (a child between fork and exec should
    not load libraries), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: have the kernel send SIGTERM to this process when its parent dies."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Fleet:
    """N copies of ``command``, supervised until each has exited for good.

    ``env`` is every worker's environment; worker *i* also gets
    ``REDCRAWL_WORKER_ID=<worker_id_prefix>w<i>``, and ``w<i>`` in place of
    :data:`redcrawl.feeds.WORKER_TOKEN` in its command (a feed file of its own). With
    ``log_dir`` worker *i*'s output goes to ``log_dir/w<i>.log`` (made anew by :meth:`run`),
    else to this process's stdout/stderr. ``unfinished()`` says whether the crawl still has
    work (a crashed worker is restarted only then, or while another worker runs);
    ``on_crash(worker_id)`` is called each time a worker has exited, whatever its status
    (give back what it still holds);
    ``tick()`` is called about every ``tick_interval`` seconds while workers run, on a
    thread of its own (one at a time, the next once the last returned), so that a tick
    stuck on an unanswering Redis never holds up the signals and exits this loop handles
    (an exception it raises is raised by :meth:`run`); ``on_event`` gets every
    :class:`WorkerEvent`.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        workers: int,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log_dir: Path | None = None,
        worker_id_prefix: str = "",
        max_restarts: int = 5,
        backoff: float = 1.0,
        backoff_max: float = 60.0,
        unfinished: Callable[[], bool] = lambda: True,
        on_crash: Callable[[str], object] | None = None,
        on_event: Callable[[WorkerEvent], object] | None = None,
        tick: Callable[[], object] | None = None,
        tick_interval: float = 0.25,
        stop_timeout: float = 60.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers={workers}: start at least one worker")
        self.command = list(command)
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.log_dir = log_dir
        self.worker_id_prefix = worker_id_prefix
        self.max_restarts = max_restarts
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.unfinished = unfinished
        self.on_crash = on_crash
        self.on_event = on_event or (lambda event: None)
        self.tick = tick or (lambda: None)
        self.tick_interval = tick_interval
        self._ticking: threading.Thread | None = None
        self._tick_error: BaseException | None = None
        self.stop_timeout = stop_timeout
        self.workers = [
            _Worker(i, None if log_dir is None else log_dir / f"w{i}.log") for i in range(workers)
        ]
        self._signals: list[int] = []
        self._handled = 0
        self._failures: str | None = None
        """The folder of the workers' failure files while :meth:`run` runs."""

    @property
    def logs(self) -> list[Path]:
        return [w.log for w in self.workers if w.log is not None]

    def worker_id(self, worker: _Worker) -> str:
        return f"{self.worker_id_prefix}{worker.name}"

    # --- processes ---------------------------------------------------------------------
    def _start(self, worker: _Worker) -> None:
        worker.restart_at = None
        env = {**self.env, "REDCRAWL_WORKER_ID": self.worker_id(worker)}
        if self._failures is not None:
            # made again if a tmp cleaner removed it while the fleet ran
            os.makedirs(self._failures, mode=0o700, exist_ok=True)
            worker.failure_file = Path(self._failures, f"{worker.name}.failure")
            worker.failure_file.unlink(missing_ok=True)
            env[FAILURE_FILE_ENV] = str(worker.failure_file)
        with contextlib.ExitStack() as stack:
            log = None
            if worker.log is not None:
                log = stack.enter_context(worker.log.open("ab" if worker.restarts else "wb"))
                stamp = datetime.now(UTC).isoformat(timespec="seconds")
                what = f"restart {worker.restarts}" if worker.restarts else "start"
                log.write(
                    f"--- redcrawl: worker {worker.name} ({what}) at {stamp}: "
                    f"{' '.join(self.command).replace(WORKER_TOKEN, worker.name)}\n".encode()
                )
                log.flush()
                worker.log_start = log.tell()
            # the child keeps its own copy of the log's descriptor; ours is closed
            worker.proc = subprocess.Popen(
                [part.replace(WORKER_TOKEN, worker.name) for part in self.command],
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_die_with_parent if _PRCTL is not None else None,
            )
            worker.capture = None
            if log is None and worker.proc.stderr is not None:
                worker.capture = _Capture(worker.proc.stderr)

    def _send(self, sig: int, *, group: bool = False) -> None:
        for w in self.workers:
            if w.proc is not None and w.running():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if group:
                        os.killpg(w.proc.pid, sig)
                    else:
                        w.proc.send_signal(sig)

    def _others(self, worker: _Worker) -> str:
        """What goes on without ``worker``: 'the other N go on' or 'no worker is left'."""
        n = sum(1 for w in self.workers if w is not worker and (w.running() or w.restart_at))
        if not n:
            return "no worker is left"
        return "the other one goes on" if n == 1 else f"the other {n} go on"

    def _failure(self, worker: _Worker) -> str | None:
        """The redcrawl failure reason its last run wrote to its failure file, if any."""
        if worker.failure_file is None:
            return None
        try:
            reason = worker.failure_file.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return None
        return reason[:100] or None

    def _goes_on(self, worker: _Worker) -> bool:
        """Whether the crawl goes on without ``worker``, so that it is restarted after a
        crash: the crawl is unfinished, or another worker still runs (a RedisSpider fleet
        waiting for start URLs has a finished crawl for as long as the lull lasts)."""
        others = any(w is not worker and w.running() for w in self.workers)
        return others or self.unfinished()

    def _finished_meanwhile(self, worker: _Worker) -> None:
        """A restart is due, but the crawl finished during its backoff and no other
        worker runs: a restart would only start and close again (or, once the last worker
        removed the state with SCHEDULER_PERSIST = False, crawl it all over)."""
        worker.restart_at = None
        worker.returncode = 0
        self.on_event(
            WorkerEvent(
                "exited",
                worker.name,
                f"worker {worker.name} not restarted: the crawl finished meanwhile",
                0,
            )
        )

    def _exited(self, worker: _Worker, rc: int, stopping: bool) -> None:
        worker.proc = None
        if worker.capture is not None:
            run = parse_run(worker.capture.text())
            worker.capture = None
        else:
            run = read_run(worker.log, worker.log_start)
        failure = self._failure(worker)
        problems = "\n".join(run.problems)
        # whatever its status: a worker SIGINTed as its spider opened exits 0 without
        # closing it (Scrapy 2.19), its leases and heartbeat left behind
        if self.on_crash is not None:
            try:
                released = self.on_crash(self.worker_id(worker))
                if isinstance(released, int) and released > 0:
                    self.on_event(
                        WorkerEvent(
                            "released",
                            worker.name,
                            f"worker {worker.name} exited holding {released:,} request(s) "
                            "it had not given back; given back now",
                        )
                    )
            except RedcrawlError as exc:
                self.on_event(
                    WorkerEvent(
                        "released",
                        worker.name,
                        f"worker {worker.name}: could not give its leases "
                        f"back ({exc}); they return when they expire",
                    )
                )
        if rc == 0 and not stopping:
            worker.returncode = rc
            # a worker closes by itself only once the crawl is finished: anything else
            # (a signal of its own, a CLOSESPIDER_* limit) is said, it is not restarted
            if run.signal is not None or (run.finish != "finished" and self.unfinished()):
                how = f"was stopped by {run.signal}" if run.signal else "exited with status 0"
                why = f", finish reason {run.finish!r}" if run.finish else ""
                self.on_event(
                    WorkerEvent(
                        "exited",
                        worker.name,
                        f"worker {worker.name} {how} before the crawl finished{why}; it is "
                        f"not restarted, {self._others(worker)}",
                        rc,
                        problems=problems,
                    )
                )
            return
        if rc == 0 or stopping:
            worker.returncode = rc
            if rc != 0:
                self.on_event(
                    WorkerEvent(
                        "exited",
                        worker.name,
                        f"worker {worker.name} {describe_exit(rc)}",
                        rc,
                        problems=problems,
                        failure=failure,
                    )
                )
            return
        tail = log_tail(worker.log)
        fatal = run.fatal if rc == 1 and failure is None else None
        # an exception at import that may be transient (a service not up yet): restarted
        # as any crash is (a slow service must not stop the fleet), said with its traceback
        at_import = run.import_failure if rc == 1 and failure is None else None
        if failure in NOT_TRANSIENT or rc == SCRAPY_USAGE_ERROR or fatal:
            worker.returncode = rc
            if failure in NOT_TRANSIENT:
                what = f": redcrawl failure {failure!r}"
            elif fatal:
                what = f": failed at start ({fatal})"
                # where it is: the end of the traceback (a log's own lines come after it)
                problems = "\n".join([*run.traceback, *run.problems])
            else:
                what = " (Scrapy's usage error)"
            self.on_event(
                WorkerEvent(
                    "failed",
                    worker.name,
                    f"worker {worker.name} {describe_exit(rc)}{what}, not restarted (it would "
                    f"fail the same way); {self._others(worker)}",
                    rc,
                    tail,
                    problems,
                    failure,
                )
            )
            return
        at = ""
        if at_import is not None:  # said with where it is, as a failure at start
            at = f" at start ({at_import})"
            problems = "\n".join([*run.traceback, *run.problems])
        if worker.restarts < self.max_restarts and self._goes_on(worker):
            delay = min(self.backoff_max, self.backoff * 2.0**worker.restarts)
            worker.restarts += 1
            worker.restart_at = time.monotonic() + delay
            self.on_event(
                WorkerEvent(
                    "restarting",
                    worker.name,
                    f"worker {worker.name} {describe_exit(rc)}{at}; restarting it in {delay:g} s "
                    f"(restart {worker.restarts} of at most {self.max_restarts})",
                    rc,
                    tail,
                    problems,
                    failure,
                )
            )
            return
        worker.returncode = rc
        why = (
            "after its restarts"
            if worker.restarts >= self.max_restarts and self.max_restarts
            else ""
        )
        self.on_event(
            WorkerEvent(
                "failed",
                worker.name,
                f"worker {worker.name} {describe_exit(rc)}{at} {why}".strip(),
                rc,
                tail,
                problems,
                failure,
            )
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _handle_signals(self) -> None:
        while self._handled < len(self._signals):
            signum = self._signals[self._handled]
            self._handled += 1
            name = signal.Signals(signum).name
            if self._handled == 1:
                self.on_event(
                    WorkerEvent(
                        "stopping",
                        "all",
                        f"{name}: stopping the workers cleanly (send it again to kill them now)",
                    )
                )
                for w in self.workers:
                    w.restart_at = None
                self._send(signal.SIGINT)
            else:
                self.on_event(WorkerEvent("killing", "all", f"{name} again: killing the workers"))
                self._send(signal.SIGKILL, group=True)

    @contextlib.contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in _stop_signals()}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _shutdown(self) -> None:
        """Stop whatever still runs (this process is leaving on an error): SIGINT, then
        SIGKILL after ``stop_timeout``."""
        self._send(signal.SIGINT)
        deadline = time.monotonic() + self.stop_timeout
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait()

    def _tick_aside(self) -> None:
        """``tick()`` on a daemon thread, unless the last one still runs; raises what an
        earlier one raised."""
        if self._tick_error is not None:
            error, self._tick_error = self._tick_error, None
            raise error
        if self._ticking is not None and self._ticking.is_alive():
            return

        def tick() -> None:
            try:
                self.tick()
            except BaseException as exc:  # (raised again by the loop, on its thread)
                self._tick_error = exc

        self._ticking = threading.Thread(target=tick, name="redcrawl-fleet-tick", daemon=True)
        self._ticking.start()

    def run(self) -> FleetResult:
        """Start every worker and supervise them until none will run again."""
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        if STOPS_RECEIVED:  # stopped before it started (its KeyboardInterrupt was lost)
            return FleetResult([None for _ in self.workers], 0, STOPS_RECEIVED[0], self.logs)
        done = False
        self._failures = tempfile.mkdtemp(prefix="redcrawl-fleet-")
        with self._signal_handlers():
            try:
                for w in self.workers:
                    self._start(w)
                next_tick = 0.0
                while True:
                    self._handle_signals()
                    stopping = bool(self._signals)
                    for w in self.workers:
                        if w.proc is not None and (rc := w.proc.poll()) is not None:
                            self._exited(w, rc, stopping)
                    now = time.monotonic()
                    for w in self.workers:
                        if w.restart_at is not None and now >= w.restart_at and not stopping:
                            if self._goes_on(w):
                                self._start(w)
                            else:
                                self._finished_meanwhile(w)
                    if all(w.proc is None and w.restart_at is None for w in self.workers):
                        break
                    if now >= next_tick:
                        self._tick_aside()
                        next_tick = now + self.tick_interval
                    time.sleep(min(0.1, self.tick_interval))
                done = True
            finally:
                if not done:
                    self._shutdown()
                for w in self.workers:
                    if w.capture is not None:
                        w.capture.text()  # (its thread, a daemon, ends with the pipe)
                shutil.rmtree(self._failures, ignore_errors=True)
                self._failures = None
        return FleetResult(
            returncodes=[w.returncode for w in self.workers],
            restarts=sum(w.restarts for w in self.workers),
            signal=self._signals[0] if self._signals else None,
            logs=self.logs,
        )


def claim_log_dir(folder: Path, *, or_next: bool = True) -> tuple[Path, IO[bytes]]:
    """Take ``folder`` for one fleet's logs: a lock (``.lock`` inside, ``flock``) held
    until the returned file is closed, so a second ``redcrawl crawl`` of the same crawl in
    the same folder never makes a running fleet's ``w<i>.log`` anew under its workers.
    When another process holds it: with ``or_next``, the first free of ``folder.2``,
    ``folder.3``, ...; without, a :class:`ConfigError` (a folder given by the user)."""
    for n in range(1, 1000):
        here = folder if n == 1 else folder.with_name(f"{folder.name}.{n}")
        here.mkdir(parents=True, exist_ok=True)
        lock = (here / ".lock").open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            if not or_next:
                raise ConfigError(
                    "--logs",
                    f"{folder} holds the logs of another running redcrawl crawl; give "
                    "another folder",
                ) from None
            continue
        return here, lock
    raise ConfigError("--logs", f"{folder}.2 to {folder}.999 are all in use; give --logs")


# --- a crawl -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    """A crawl's progress, as :func:`run_workers` passes it to its ``progress`` callback."""

    counts: Counts
    stats: dict[str, int]
    elapsed: float
    running: int
    """Worker processes running now."""


class _Watch:
    """The supervisor's reads of a crawl (the progress line, whether a crashed worker is
    restarted) on a client that fails fast: the loop that forwards signals must not sit
    in redis-py's ~30 s of retries, and a Redis outage the workers outlive (up to
    ``outage_limit``) must not end the command: it pauses the progress line, once said."""

    def __init__(
        self,
        frontier: Any,
        outage_limit: float,
        on_event: Callable[[WorkerEvent], object] | None,
    ) -> None:
        self.frontier = frontier
        self.outage_limit = outage_limit
        self.on_event = on_event or (lambda event: None)
        self.down = False
        self.seen_work = False
        """Whether a read ever found something accepted."""

    def _reachable(self, exc: RedcrawlError | None) -> None:
        if exc is not None and not self.down:
            self.on_event(
                WorkerEvent(
                    "warning",
                    "all",
                    # (without the advice a worker's own error carries: they go on)
                    f"warning: Redis unreachable ({str(exc).replace(WORKER_ADVICE, '')}); "
                    "the workers go on with what they "
                    "hold and wait for it up to REDCRAWL_REDIS_OUTAGE_LIMIT "
                    f"({self.outage_limit:g} s)",
                )
            )
        elif exc is None and self.down:
            self.on_event(WorkerEvent("warning", "all", "Redis is reachable again"))
        self.down = exc is not None

    def read(self) -> tuple[Counts, dict[str, int]] | None:
        """The crawl's counts and stats, or None while Redis is unreachable."""
        try:
            got = self.frontier.counts(), self.frontier.stats()
        except RedcrawlError as exc:
            self._reachable(exc)
            return None
        self._reachable(None)
        if got[0].accepted:
            self.seen_work = True
        return got

    def unfinished(self) -> bool:
        """Unknown (Redis unreachable: restart, it waits for Redis), work pending, or
        nothing pushed yet (its workers are still starting) all read as unfinished; a
        crawl with nothing accepted after work was seen was removed by its last worker
        (SCHEDULER_PERSIST = False): finished."""
        read = self.read()
        if read is None:
            return True
        return not read[0].finished or (read[0].accepted == 0 and not self.seen_work)


def worker_id_prefix(crawl: str) -> str:
    """``host:crawl:pid:random:``, the prefix of the ids of one supervisor's workers.
    Another ``redcrawl crawl`` of the same crawl names its workers w0, w1, ... as well,
    and a supervisor gives back what its gone workers hold by id: it must never match
    another's. The pid tells apart two on one machine, the random part two in
    containers that share a hostname and both run as pid 1 (``--network host``)."""
    return f"{socket.gethostname()}:{crawl}:{os.getpid()}:{secrets.token_hex(4)}:"


def run_workers(
    spider: str,
    *,
    workers: int,
    settings: Settings,
    crawl: str,
    settings_args: Iterable[str] = (),
    spider_args: Iterable[str] = (),
    outputs: Sequence[str] = (),
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    progress: Callable[[Tick], object] | None = None,
    on_event: Callable[[WorkerEvent], object] | None = None,
    max_restarts: int = 5,
    restart_backoff: float = 1.0,
) -> FleetResult:
    """Run ``spider`` in ``workers`` Scrapy processes on the frontier of ``crawl`` (in the
    Redis ``settings`` name, the embedded one started if need be) until every worker has
    exited for good; see :class:`Fleet`. Each of ``outputs`` (``-o FILE``) becomes a feed
    file per worker (:mod:`redcrawl.feeds`). Worker output goes to ``log_dir`` (None: this
    process's stdout/stderr). ``progress`` is called about twice a second."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from redcrawl.cluster import is_cluster_url
    from redcrawl.connection import connect, resolve_url
    from redcrawl.frontier import open_frontier
    from redcrawl.guard import check_server

    url = resolve_url(settings)  # starts the embedded Redis if that is what is configured
    frontier = open_frontier(connect(settings, url=url), settings, crawl)
    try:
        warnings = check_server(frontier)  # an evicting server: refused here, once
    except ConfigError:
        frontier.client.close()
        raise
    for warning in warnings:
        if on_event is not None:
            on_event(WorkerEvent("warning", "all", f"warning: {warning}"))
    prefix = worker_id_prefix(crawl)

    def release(worker_id: str) -> int:
        """Give back the leases of a worker process that exited (its scheduler adds a
        random suffix to the id it was given): how many. On the fail-fast client: this
        runs on the loop that handles signals, which must never sit in redis-py's ~30 s
        of retries per gone worker (Redis gone: the leases come back when they expire)."""
        released = 0
        for name in watch.frontier.workers():
            if name == worker_id or name.startswith(worker_id + ":"):
                released += watch.frontier.release_worker(name)
                watch.frontier.forget_worker(name)
        return released

    started = time.monotonic()
    watch = _Watch(
        open_frontier(
            connect(
                settings,
                url=url,
                check=False,
                retry=Retry(NoBackoff(), 0),
                socket_timeout=PROGRESS_TIMEOUT,
                socket_connect_timeout=PROGRESS_TIMEOUT,
                # (a cluster client waits out trouble itself, whatever its retry says)
                **({"outage": PROGRESS_TIMEOUT} if is_cluster_url(url) else {}),
            ),
            settings,
            crawl,
        ),
        settings.redis_outage_limit,
        on_event,
    )

    def tick() -> None:
        read = watch.read()  # (also without a progress line: watch.seen_work)
        if progress is None or read is None:
            return
        running = sum(w.running() for w in fleet.workers)
        progress(Tick(*read, time.monotonic() - started, running))

    fleet = Fleet(
        # the crawl as -s too: a worker's -s beats its environment, so a --set
        # SCHEDULER_QUEUE_KEY=... must not move the workers to another crawl
        worker_command(
            spider,
            settings=[*settings_args, f"REDCRAWL_CRAWL={crawl}"],
            spider_args=spider_args,
            outputs=[per_worker(output) for output in outputs],
        ),
        workers=workers,
        cwd=cwd,
        log_dir=log_dir,
        worker_id_prefix=prefix,
        env={**os.environ, **(env or {}), "REDCRAWL_REDIS_URL": url, "REDCRAWL_CRAWL": crawl},
        max_restarts=max_restarts,
        backoff=restart_backoff,
        unfinished=watch.unfinished,
        on_crash=release,
        on_event=on_event,
        tick=tick,
        tick_interval=0.5,
    )
    try:
        result = fleet.run()
        tick()
        if result.signal is None and not result.failed:
            # every worker exited 0: each closed by itself once the crawl was finished, or
            # was stopped from outside (said for each); the latter is not a success
            read = watch.read()
            if read is not None and not read[0].finished:
                result = dataclasses.replace(result, unfinished=True)
        return result
    finally:
        frontier.client.close()
        watch.frontier.client.close()
