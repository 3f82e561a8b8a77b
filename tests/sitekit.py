"""A multi-site test server that watches politeness from the sites' side.

:class:`MultiSite` serves ``n`` small sites, each on its own loopback address
(``127.0.0.2``, ``127.0.0.3``, ...; every 127/8 address reaches loopback on Linux) and
its own port, so each is a different host for Scrapy's downloader and for redcrawl's
politeness key, and nothing listens beyond loopback. One
:class:`~http.server.ThreadingHTTPServer` per site (HTTP/1.1 keep-alive with
``Content-Length``), all recording into one :class:`Recorder` with one clock
(``time.monotonic()`` of this process), per host:

* every fetch (:class:`Fetch`): its start (when the request's first bytes reached the
  site's socket, by the kernel's clock: see :class:`_Handler`), the
  moment its response was written, its path and status;
* the number of requests in progress (started, response not yet written) and the most
  ever seen at once;
* robots.txt fetches.

Each site's pages (a pure function of the path and its :class:`SiteSpec`):

``/``
    Links to every page ``/p/0 .. /p/{pages-1}`` and, with ``cross_links``, to the other
    sites' roots (so a crawl started at any root reaches every page of every site).
``/p/<i>``
    Links to ``links`` other pages of the same site (``i+1 .. i+links``, wrapping) and
    to ``/``.
``/robots.txt``
    ``SiteSpec.robots`` when set, else 404; after ``SiteSpec.robots_delay`` more seconds.

Every response waits ``SiteSpec.delay`` seconds first. ``SiteSpec.faults`` maps a path to
a :class:`Fault` (a status, an optional ``Retry-After``, for the first ``times`` fetches
of that path or for all). Other paths answer 404.

A crawl of it: ``scrapy runspider tests/sitekit.py -a urls=ROOT1,ROOT2,...`` runs
:class:`SiteKitSpider` (follows every link). Read the results with
:meth:`MultiSite.max_in_progress`, :meth:`MultiSite.min_gap`, :meth:`MultiSite.summary`.
"""

from __future__ import annotations

import contextlib
import html
import itertools
import json
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.http import Response

__all__ = [
    "SITEKIT_FILE",
    "Fault",
    "Fetch",
    "Handover",
    "HostSummary",
    "MultiSite",
    "Recorder",
    "SiteKitSpider",
    "SiteSpec",
    "format_summary",
    "read_handovers",
    "serving",
]

SITEKIT_FILE = Path(__file__).resolve()
"""This file: ``scrapy runspider SITEKIT_FILE`` runs :class:`SiteKitSpider`."""

FIRST_ADDRESS = 2
"""Sites live on 127.0.0.2, 127.0.0.3, ... (127.0.0.1 is left to everything else)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """Answer ``status`` (with ``Retry-After: retry_after`` when set) to the first
    ``times`` fetches of a path, or to every fetch when ``times`` is None. Status 0:
    close the connection without an answer (a network error for the client)."""

    status: int
    retry_after: str | None = None
    times: int | None = None


@dataclass(frozen=True, slots=True)
class SiteSpec:
    """One site: its pages, how slowly it answers, its robots.txt and its faults."""

    pages: int = 10
    links: int = 3
    delay: float = 0.0
    robots: str | None = None
    faults: dict[str, Fault] = field(default_factory=dict)
    cross_links: bool = True
    robots_delay: float = 0.0
    """Seconds robots.txt waits on top of ``delay`` (to have requests pile up behind it)."""


@dataclass(frozen=True, slots=True)
class HostSummary:
    host: str
    fetches: int
    max_in_progress: int
    min_gap: float | None
    robots_fetches: int


@dataclass(slots=True)
class Fetch:
    """One request as a site saw it: when it started (its first bytes received), when its response
    was written (None while in progress), its path and status."""

    start: float
    path: str
    end: float | None = None
    status: int | None = None


@dataclass(frozen=True, slots=True)
class Handover:
    """One request a worker's scheduler handed to Scrapy (``SiteKitSpider(handovers=...)``):
    its URL, when (``time.monotonic()``, the same clock as :attr:`Fetch.start`), and when
    the frontier granted it (None: unknown, e.g. not redcrawl's scheduler)."""

    url: str
    at: float
    granted: float | None


def read_handovers(paths: Sequence[Path]) -> list[Handover]:
    """Every hand-over the workers wrote to ``paths`` (missing files: none; a partly
    written last line, from a killed worker: left out), in order of time."""
    seen: list[Handover] = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError), path.open() as lines:
            for line in lines:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                seen.append(Handover(r["url"], r["at"], r["granted"]))
    return sorted(seen, key=lambda h: h.at)


class Recorder:
    """What the sites saw, per host, under one lock, on one clock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: dict[str, list[Fetch]] = {}
        self.in_progress: Counter[str] = Counter()
        self.max_in_progress: Counter[str] = Counter()
        self.robots: Counter[str] = Counter()
        self.path_fetches: Counter[tuple[str, str]] = Counter()

    def begin(self, host: str, path: str, arrived: float | None = None) -> tuple[Fetch, int]:
        """A fetch of ``path`` starts (``arrived``: when its first bytes reached the site's
        socket, else now): its record, and how many fetches of the path came before it."""
        now = time.monotonic()
        with self.lock:
            fetch = Fetch(now if arrived is None else min(arrived, now), path)
            self.log.setdefault(host, []).append(fetch)
            self.in_progress[host] += 1
            self.max_in_progress[host] = max(self.max_in_progress[host], self.in_progress[host])
            if path == "/robots.txt":
                self.robots[host] += 1
            before = self.path_fetches[(host, path)]
            self.path_fetches[(host, path)] += 1
            return fetch, before

    def end(self, host: str, fetch: Fetch, status: int | None) -> None:
        now = time.monotonic()
        with self.lock:
            fetch.end, fetch.status = now, status
            self.in_progress[host] -= 1

    def reset(self) -> None:
        with self.lock:
            self.log.clear()
            self.in_progress.clear()
            self.max_in_progress.clear()
            self.robots.clear()
            self.path_fetches.clear()


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # (Linux; not in every Python)
_TIMESPEC = struct.Struct("@qq")


class _Handler(BaseHTTPRequestHandler):
    """A fetch starts when its request's first bytes reached the site's socket: the
    kernel's receive time of them (``SO_TIMESTAMPNS``, read with a ``MSG_PEEK`` before the
    request is parsed), not when this thread got round to reading them. On a loaded
    machine the site's threads, in the test process, wait for a CPU like the workers do;
    a site on another machine would not, and the gaps it records are the network's."""

    protocol_version = "HTTP/1.1"
    rbufsize = 0  # unbuffered: the next request's bytes stay in the socket, to be peeked
    server: _SiteServer
    arrived: float | None = None

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)

    def handle_one_request(self) -> None:
        self.arrived = self._arrival()
        super().handle_one_request()

    def _arrival(self) -> float | None:
        """The kernel's receive time of the next bytes waiting (blocks until some come),
        on this process's monotonic clock; None when the peer closed or none was given."""
        try:
            data, ancillary, _, _ = self.connection.recvmsg(
                1, socket.CMSG_SPACE(_TIMESPEC.size), socket.MSG_PEEK
            )
        except OSError:
            return None
        for level, kind, value in ancillary:
            if data and level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = cast(tuple[int, int], _TIMESPEC.unpack(value[: _TIMESPEC.size]))
                return sec + nsec / 1e9 - (time.time() - time.monotonic())
        return None

    def do_GET(self) -> None:
        site = self.server
        path = self.path.split("?", 1)[0]
        fetch, before = site.recorder.begin(site.host, path, self.arrived)
        status: int | None = None
        try:
            if site.spec.delay:
                time.sleep(site.spec.delay)
            if path == "/robots.txt" and site.spec.robots_delay:
                time.sleep(site.spec.robots_delay)
            status, headers, body = site.page(path, before)
            if status == 0:  # Fault(0): hang up without answering
                self.close_connection = True
                return
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        finally:
            site.recorder.end(site.host, fetch, status)


class _SiteServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str, spec: SiteSpec, recorder: Recorder, kit: MultiSite) -> None:
        super().__init__((host, 0), _Handler)
        self.host = host
        self.spec = spec
        self.recorder = recorder
        self.kit = kit

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.server_address[1]}/"

    def page(self, path: str, before: int) -> tuple[int, list[tuple[str, str]], bytes]:
        fault = self.spec.faults.get(path)
        if fault is not None and (fault.times is None or before < fault.times):
            headers = [("Retry-After", fault.retry_after)] if fault.retry_after else []
            return fault.status, headers, f"fault {fault.status}\n".encode()
        if path == "/robots.txt":
            if self.spec.robots is None:
                return 404, [], b"no robots.txt\n"
            return 200, [("Content-Type", "text/plain")], self.spec.robots.encode()
        n = self.spec.pages
        if path == "/":
            links = [f"/p/{i}" for i in range(n)]
            if self.spec.cross_links:
                links += [r for r in self.kit.roots if r != self.root]
        elif path.startswith("/p/") and path[3:].isdigit() and int(path[3:]) < n:
            i = int(path[3:])
            links = [f"/p/{(i + k) % n}" for k in range(1, self.spec.links + 1)] + ["/"]
        else:
            return 404, [], b"not found\n"
        body = "".join(f'<a href="{html.escape(link)}">{html.escape(link)}</a>\n' for link in links)
        page = f"<html><body><h1>{html.escape(self.host + path)}</h1>\n{body}</body></html>\n"
        return 200, [("Content-Type", "text/html; charset=utf-8")], page.encode()


class MultiSite:
    """``sites`` loopback sites (a count of default sites, or one spec each)."""

    def __init__(self, sites: int | Sequence[SiteSpec]) -> None:
        specs = [SiteSpec() for _ in range(sites)] if isinstance(sites, int) else list(sites)
        if not 1 <= len(specs) <= 250:
            raise ValueError(f"{len(specs)} sites: give 1 to 250")
        self.recorder = Recorder()
        self.hosts = [f"127.0.0.{FIRST_ADDRESS + i}" for i in range(len(specs))]
        self._servers = [
            _SiteServer(h, s, self.recorder, self) for h, s in zip(self.hosts, specs, strict=True)
        ]
        self.roots = [s.root for s in self._servers]
        self._threads: list[threading.Thread] = []

    def start(self) -> MultiSite:
        for s in self._servers:
            t = threading.Thread(
                target=s.serve_forever,
                kwargs={"poll_interval": 0.05},
                daemon=True,
                name=f"site-{s.host}",
            )
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> MultiSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what the sites saw ---------------------------------------------------------
    def pages(self, host: str) -> set[str]:
        """Every page path of ``host``'s site (what a complete crawl fetches)."""
        spec = self._servers[self.hosts.index(host)].spec
        return {"/"} | {f"/p/{i}" for i in range(spec.pages)}

    def fetches(self, host: str) -> list[Fetch]:
        """Every fetch at ``host``, in order of start (copies)."""
        with self.recorder.lock:
            seen = [
                Fetch(f.start, f.path, f.end, f.status) for f in self.recorder.log.get(host, [])
            ]
        return sorted(seen, key=lambda f: f.start)

    def starts(self, host: str, *, robots: bool = True) -> list[float]:
        """Fetch start times at ``host`` (monotonic seconds), in order."""
        return [f.start for f in self.fetches(host) if robots or f.path != "/robots.txt"]

    def fetched(self, host: str) -> Counter[str]:
        """Fetches per path at ``host``."""
        with self.recorder.lock:
            return Counter({p: n for (h, p), n in self.recorder.path_fetches.items() if h == host})

    def max_in_progress(self, host: str) -> int:
        """The most requests ``host`` ever had in progress at once."""
        with self.recorder.lock:
            return self.recorder.max_in_progress[host]

    def min_gap(self, host: str) -> float | None:
        """The smallest gap between two consecutive fetch starts at ``host`` (None with
        fewer than two fetches)."""
        times = self.starts(host)
        return min((b - a for a, b in itertools.pairwise(times)), default=None)

    def robots_fetches(self, host: str) -> int:
        with self.recorder.lock:
            return self.recorder.robots[host]

    def summary(self) -> list[HostSummary]:
        return [
            HostSummary(
                h,
                len(self.starts(h)),
                self.max_in_progress(h),
                self.min_gap(h),
                self.robots_fetches(h),
            )
            for h in self.hosts
        ]

    def reset(self) -> None:
        self.recorder.reset()


def format_summary(rows: Sequence[HostSummary]) -> str:
    """One line per host, for assertion messages and the bench."""
    return "\n".join(
        f"{r.host:<12} fetches {r.fetches:>4}  max in progress {r.max_in_progress:>2}  "
        f"min gap {'-' if r.min_gap is None else f'{r.min_gap:.3f}s'}  robots {r.robots_fetches}"
        for r in rows
    )


# --- the spider ----------------------------------------------------------------------


class SiteKitSpider(scrapy.Spider):
    """Crawls every page of a :class:`MultiSite`: starts at ``urls`` (comma-separated
    roots) and follows every link.

    ``idle_grace`` (seconds, default 0): keep an idle spider open until it has seen no
    response and no queued request for that long, asking its scheduler every 50 ms. For
    scrapy-redis fleets only, whose scheduler knows nothing of requests in flight at
    other workers and would close a worker that finds the shared queue momentarily empty
    (see bench/crawl_spider.py); redcrawl keeps its workers open by itself.

    ``handovers`` (a file path, default none): append one JSON line per request the
    scheduler hands to Scrapy (:class:`Handover`: its URL, when ``next_request`` returned
    it, and, on redcrawl's scheduler, when the frontier granted it, ``Lease.granted``), on
    the machine's monotonic clock like the sites' stamps. Read with
    :func:`read_handovers`: it tells a request that was handed over late from one that
    was handed over on time and reached its site late."""

    name = "sitekit"

    def __init__(
        self, urls: str = "", idle_grace: str | float = 0, handovers: str = "", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.roots = [u for u in urls.split(",") if u]
        self.idle_grace = float(idle_grace)
        self.last_busy = time.monotonic()
        self._poll: Any = None
        self.handovers = handovers

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> SiteKitSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._on_response, signals.response_received)
        crawler.signals.connect(spider._on_idle, signals.spider_idle)
        if spider.handovers:
            crawler.signals.connect(spider._record_handovers, signals.spider_opened)
        return spider

    def _record_handovers(self, spider: Any) -> None:
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
        scheduler = getattr(slot, "scheduler", None)
        if scheduler is None:
            return
        out = open(self.handovers, "a", buffering=1)  # noqa: SIM115 (a line each, till exit)
        lease_of = getattr(scheduler, "lease_of", None)
        plain = scheduler.next_request

        def next_request() -> Any:
            request = plain()
            if request is not None:
                lease = lease_of(request) if lease_of is not None else None
                granted = getattr(lease, "granted", 0.0) or None
                line = {"url": request.url, "at": time.monotonic(), "granted": granted}
                out.write(json.dumps(line) + "\n")  # before the download: a kill keeps it
            return request

        scheduler.next_request = next_request

    async def start(self) -> AsyncIterator[Any]:
        # dont_filter=False: every worker yields the same roots, one of them fetches each
        for url in self.roots:
            yield scrapy.Request(url, callback=self.parse, dont_filter=False)

    def parse(self, response: Response) -> Iterator[scrapy.Request]:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def _on_response(self, response: Response, request: Any, spider: Any) -> None:
        self.last_busy = time.monotonic()

    def _on_idle(self, spider: Any) -> None:
        if self.idle_grace <= 0:
            return
        now = time.monotonic()
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
        scheduler = getattr(slot, "scheduler", None)
        if scheduler is not None and scheduler.has_pending_requests():
            self.last_busy = now
        if now - self.last_busy < self.idle_grace:
            self._wake_soon(slot)
            raise DontCloseSpider

    def _wake_soon(self, slot: Any) -> None:
        from twisted.internet import reactor

        if slot is None or (self._poll is not None and self._poll.active()):
            return

        def wake() -> None:
            if getattr(slot, "closing", None) is None:
                slot.nextcall.schedule()

        self._poll = cast(Any, reactor).callLater(0.05, wake)


@contextlib.contextmanager
def serving(sites: int | Sequence[SiteSpec]) -> Iterator[MultiSite]:
    """``with serving(6) as kit: ...``"""
    kit = MultiSite(sites).start()
    try:
        yield kit
    finally:
        kit.stop()
