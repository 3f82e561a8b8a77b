# Over 450 lines on purpose: one class, Scrapy's scheduler interface; its Redis side is feeder.py.
"""The Scrapy scheduler on the shared frontier: ``SCHEDULER = "redcrawl.scrapy.Scheduler"``.

How a request moves through one worker:

* Redis is only ever called from the worker's I/O thread (:class:`redcrawl.feeder.Feeder`):
  Scrapy's reactor only touches local buffers, so a slow or absent Redis never stalls
  downloads, callbacks or the heartbeat. When Redis has not answered for
  ``REDCRAWL_REDIS_OUTAGE_LIMIT`` seconds the spider closes with reason
  ``redis_unavailable`` and the process exits with code 1 (see docs/scrapy.md).
* ``enqueue_request`` fingerprints and encodes the request at once and buffers it; the
  I/O thread stores buffered requests before any acknowledgement buffered after them.
  A request that can't be stored closes the spider (reason ``unstorable_request``, exit
  code 1) with an error naming the meta key: never a silent drop.
* ``next_request`` hands out one request from the local buffer of leased requests, which
  the I/O thread keeps filled (``REDCRAWL_PREFETCH``, ``REDCRAWL_LOOKAHEAD``).
* When Scrapy is really done with a request (its callback's output consumed, its children
  passed to ``enqueue_request``, its items through the pipelines: the engine's own
  "request finished" point, see :mod:`redcrawl.scrapy.lifecycle`), the request is
  acknowledged, or sent back for a retry or to the dead letters by its recorded outcome.
  A retry made by Scrapy's RetryMiddleware keeps the original's lease: one request, one
  final state.
* A heartbeat (on the I/O thread) renews all of this worker's leases, so long callbacks
  keep them; a killed worker's leases expire and their requests are handed out again.

Outcomes (see ``docs/scrapy.md``): callback exception -> retry with backoff, then DEAD;
download error still failing after Scrapy's retries -> retry with backoff, then DEAD;
HTTP status in ``REDCRAWL_RETRY_HTTP_CODES`` after Scrapy's retries -> the same;
anything else (2xx, 3xx handled by Scrapy, 404, ``IgnoreRequest``) -> DONE.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from scrapy import signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import DontCloseSpider
from twisted.internet import task

from redcrawl import codec
from redcrawl.connection import connect, redact
from redcrawl.envelope import encode_for_store
from redcrawl.errors import (
    ConfigError,
    ConnectionError_,
    CrawlVanished,
    DecodeError,
    EncodeError,
    LayoutMismatch,
    RedcrawlError,
    RedisOutOfMemory,
    partitions_lost_text,
)
from redcrawl.feeder import Feeder
from redcrawl.fingerprint import Fingerprinter, canonicalizer_for, fingerprinter_for
from redcrawl.frontier import FrontierCore, Lease, open_frontier
from redcrawl.frontier.core import slot_outcome
from redcrawl.frontier.final import COMMAND_PURGES_ENV, purge_if_finished
from redcrawl.frontier.records import stored_layout
from redcrawl.guard import MemoryWatch, check_server
from redcrawl.lock import CrawlLock
from redcrawl.politeness import KeyMode, parse_retry_after, politeness_key
from redcrawl.politeness.describe import fleet_limits
from redcrawl.scrapy import counters, defer, lifecycle, robots
from redcrawl.scrapy.feed_storage import flush_local_feeds
from redcrawl.scrapy.one_off import local_scheduler, one_off_command
from redcrawl.seed import seed as seed
from redcrawl.settings import Settings, startup_notes, startup_warnings
from redcrawl.transport import redis_errors

if TYPE_CHECKING:
    import scrapy
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.python.failure import Failure

    from redcrawl.scrapy.dupefilter import DupeFilter

__all__ = ["Scheduler", "seed"]

log = logging.getLogger(__name__)

TOLD_DEFERRED_MAX = 10_000
"""(site, status) pairs whose first deferral a worker remembers having logged at INFO (the
next ones go at DEBUG); when full, it forgets them all (memory bounded on a broad crawl)."""

LOCAL_SEEN_MAX = 200_000
"""Fingerprints a worker remembers to answer enqueue_request without Redis (~20 MB): the
ones it stored, and the ones it leased (stored by any worker: a duplicate for Redis too,
READY, IN-FLIGHT, DONE or DEAD alike)."""

TICK = 1.0
"""Seconds between reads of the crawl-wide counts by the I/O thread, and flushes of
buffered requests and acks when no lease call carried them since the last tick (they
wait two ticks at most; see :mod:`redcrawl.feeder`)."""

WATCH = 0.25
"""Seconds between the reactor's looks at the I/O thread (counters, Redis outage)."""

OUTAGE_NOTICE = 5.0
"""Seconds without an answer from Redis before the worker logs (once) that it waits for
it; it logs (once) when Redis answers again."""

FLUSH_WAIT = 5.0
"""Seconds flush() waits for the buffered requests to be stored."""

CLOSE_WAIT = 60.0
"""Seconds close() waits for the last flush while Redis answers."""

CLOSE_WAIT_GONE = 2.0
"""... and while Redis does not (the crawl gets it back by lease expiry)."""

MARK = "_redcrawl_handed_out"
"""Meta key numbering the requests this worker handed out (so that a retry made by
Scrapy, whose meta is a copy, is recognised); removed from children that copy it."""

STAT_NAMES = {
    "nack_retried": "retried",
    "nack_dead": "dead",
    "nack_stale": "stale",
    "late_released": "politeness/late_released",
}
"""I/O thread counters with another name in Scrapy's stats (``redcrawl/<name>``)."""


_LAYOUTS = re.compile(r'created with [^"]*"([^"]*)" and this worker uses "([^"]*)"')


def layout_hint(message: str, settings: Settings) -> str:
    """The setting to change, in words, when a layout mismatch ``message`` comes from
    fleet-wide politeness (the lists layout's ``<ordering>/<key mode>``), else ""."""
    found = _LAYOUTS.search(message)
    if found is None:
        return ""
    created, mine = (_key_mode(s.split(" ", 1)[0]) for s in found.groups())
    if created and not mine and not settings.politeness:
        return (
            ": the crawl has fleet-wide politeness and this worker has REDCRAWL_POLITENESS "
            "off; start it without that (or purge the crawl, or use another REDCRAWL_CRAWL, "
            "to crawl without fleet-wide politeness)"
        )
    if created and mine and created != mine:
        return (
            f": the crawl groups politeness keys by {created} and this worker by {mine}; "
            "give every worker the same REDCRAWL_POLITENESS_KEY"
        )
    return ""


def _key_mode(head: str) -> str | None:
    """The politeness key mode of a lists layout's head (``fifo/host``), else None (no
    politeness, or a streams layout: ``streams/<shards>``)."""
    order, _, mode = head.partition("/")
    return mode if order in ("fifo", "lifo", "priority") and mode in ("host", "domain") else None


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Scheduler(BaseScheduler):
    """A Scrapy scheduler whose queue is the crawl's shared frontier in Redis."""

    def __init__(
        self, crawler: Crawler, settings: Settings, dupefilter: DupeFilter | None = None
    ) -> None:
        self.crawler = crawler
        self.settings = settings
        self.stats = crawler.stats
        self.df = dupefilter
        # Unique per process even when an id is configured: a restarted worker must not
        # keep its predecessor's leases alive with its heartbeat.
        self.worker = (
            f"{settings.worker_id}:{secrets.token_hex(3)}"
            if settings.worker_id
            else default_worker_id()
        )
        self.canonicalizer = canonicalizer_for(settings)
        # the project's REQUEST_FINGERPRINTER_CLASS when it is not Scrapy's default
        self.custom_fingerprinter = lifecycle.custom_fingerprinter(crawler)
        self.fingerprinter = Fingerprinter(
            canonicalizer=self.canonicalizer, version_meta_key=settings.fingerprint_version_meta
        )
        self.frontier: FrontierCore | None = None
        self.feeder: Feeder | None = None
        self.spider: scrapy.Spider | None = None
        self._handed_out: dict[int, tuple[scrapy.Request, Lease]] = {}
        self._successors: deque[scrapy.Request] = deque()  # Scrapy's retries, on their lease
        self._spacing: dict[int, scrapy.Request] = {}  # retries waiting for their start
        # handed-out requests whose slot went back with their response (_free_slot)
        self._slot_back: weakref.WeakSet[scrapy.Request] = weakref.WeakSet()
        self._outcomes: dict[int, tuple[bool, str]] = {}  # id(request) -> (retry, error)
        self._marked: dict[int, scrapy.Request] = {}  # meta[MARK] -> handed out
        self._local_seen: set[bytes] = set()
        self._serial = itertools.count(1)
        self._concurrency = crawler.settings.getint("CONCURRENT_REQUESTS", 16)
        self._finished_since: float | None = None
        self._watchdog: task.LoopingCall | None = None
        self._unhook: Any = None
        self._poll_call: Any = None
        self._startup_error: ConfigError | None = None  # a wrong setting, said at open
        self._failure: str | None = None
        self._outage_since: float | None = None  # an outage was logged: since when
        self._told_deferred: set[tuple[str, int]] = set()  # (site, status) logged at INFO
        # reasons of dead-lettered requests already said at WARNING (_first_of)
        self._said: set[str] = set()
        self._shutdown_trigger: Any = None  # the reactor's "before shutdown" trigger
        self._closing = False
        self._polite = False  # the frontier enforces fleet-wide politeness (set at open)
        self._robots: robots.RobotsTxtMiddleware | None = None  # (set at open)
        self._auto_throttled = False  # fleet-wide AutoThrottle on (set at open)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        """This scheduler, or Scrapy's own under a one-off command (``scrapy shell``,
        ``parse``...: :mod:`redcrawl.scrapy.one_off`)."""
        command = one_off_command()
        if command is not None:
            return local_scheduler(crawler, command)
        try:
            settings = Settings.from_scrapy(crawler.settings)
            dupefilter = None
            df_path = crawler.settings.get("DUPEFILTER_CLASS")
            if df_path:
                from scrapy.utils.misc import load_object

                dupefilter = lifecycle.build_component(load_object(df_path), crawler)
        except ConfigError as exc:
            # Raised here, Scrapy 2.19 buries it under tracebacks of its own engine
            # ("Engine slot not assigned"): said at open as one CRITICAL line instead.
            scheduler = cls(crawler, Settings(), None)
            scheduler._startup_error = exc
            return scheduler
        scheduler = cls(crawler, settings, dupefilter)
        if flush_local_feeds(crawler):
            log.debug("redcrawl: local feed files are flushed after each item")
        crawler.signals.connect(scheduler._on_spider_error, signals.spider_error)
        crawler.signals.connect(scheduler._on_response, signals.response_received)
        crawler.signals.connect(scheduler._on_idle, signals.spider_idle)
        crawler.signals.connect(scheduler._on_item, signals.item_scraped)
        crawler.signals.connect(scheduler._on_item_error, signals.item_error)
        return scheduler

    # --- lifecycle -------------------------------------------------------------------
    def open(self, spider: scrapy.Spider) -> None:
        """Start-up checks (on this thread, once), then the I/O thread takes over. A
        worker whose settings change the crawl's layout is refused with one CRITICAL line
        (no traceback) and the process exits 1 (:meth:`_refuse_layout`)."""
        refused = lifecycle.refused(self.crawler)
        if refused is not None:  # the spider could not start (said already)
            self._failure = refused
            return
        try:
            if self._startup_error is not None:
                raise self._startup_error
            self._open(spider)
        except LayoutMismatch as exc:
            self._refuse_layout(exc)
        except CrawlVanished as exc:  # a damaged crawl with nothing else left
            if self.frontier is not None:
                self.frontier.client.close()
            self.frontier = None
            self._fail("crawl_vanished", str(exc), before_start=True)
        except (ConfigError, ConnectionError_) as exc:  # a wrong setting, no Redis
            self._refuse_start(exc)

    def _open(self, spider: scrapy.Spider) -> None:
        self.spider = spider
        crawl = self.settings.crawl_name(spider.name)
        # what a scrapy-redis user would not expect, said once at start
        for line in startup_notes(self.crawler.settings):
            log.info("redcrawl: %s", line)
        for line in startup_warnings(self.crawler.settings):
            log.warning("redcrawl: %s", line)
        # redis-py resends a call (same nonce) until REDCRAWL_REDIS_OUTAGE_LIMIT is over:
        # the I/O thread waits, the reactor doesn't.
        retries = int(self.settings.redis_outage_limit) + 5
        client = connect(
            self.settings, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries)
        )
        self.frontier = open_frontier(client, self.settings, crawl)
        self.frontier.check_vanished = True  # "finished" after a failover to an empty replica
        if not self.settings.flush_on_start:  # (a flush may recreate the crawl)
            self._check_layout()  # before this worker writes anything to the crawl
        counters.install(self.crawler, self.frontier)  # heartbeat counters (docs/metrics.md)
        if self.frontier.politeness is not None:
            self.frontier.store_politeness(worker=True)
            self._frontier_paces_downloads()
        for warning in check_server(self.frontier):
            log.warning("redcrawl: %s", warning)
        memory = MemoryWatch(client, self.settings)
        if self.settings.flush_on_start:
            self._flush_once()
        self.fingerprinter = fingerprinter_for(self.settings, client, self.frontier.keys)
        self._say_crawl_state()
        self.frontier.renew(self.worker)
        self._unhook = lifecycle.on_request_finished(self.crawler, self._on_finished)
        lifecycle.mark_start_requests(self.crawler)
        lifecycle.install_outcome_middleware(self.crawler, self)
        self._robots = robots.install(self.crawler, client, self.frontier.keys)
        from redcrawl.scrapy.autothrottle import install as install_autothrottle

        self._auto_throttled = install_autothrottle(self.crawler, self.frontier) is not None
        self._polite = self.frontier.politeness is not None
        if self._polite:
            defer.install(self.crawler, self)
        from twisted.internet import reactor

        def memory_check() -> None:
            warning = memory.check()
            if warning:
                log.warning("redcrawl: %s", warning)

        self.feeder = Feeder(
            self.frontier,
            self.worker,
            prefetch=self.settings.prefetch,
            lookahead=self.settings.lookahead,
            concurrency=self._concurrency,
            batch_size=self.settings.batch_size,
            heartbeat=self.settings.heartbeat,
            poll_interval=self.settings.poll_interval,
            tick=TICK,
            on_ready=lambda: cast(Any, reactor).callFromThread(self._wake),
            on_tick=memory_check,
            polite=self.frontier.politeness is not None,
        )
        self.feeder.start()
        self._shutdown_trigger = cast(Any, reactor).addSystemEventTrigger(
            "before", "shutdown", self._on_forced_shutdown
        )
        self._watchdog = task.LoopingCall(self._watch)
        self._watchdog.start(WATCH, now=False)
        log.info("redcrawl: worker %s on crawl %r (%s)", self.worker, crawl, self._redis_name())

    def _check_layout(self) -> None:
        """Raise the frontier's layout mismatch error now if this worker's settings
        (backend, ordering, dedupe, politeness, ...) differ from the ones the existing
        crawl was created with (a new crawl is left for the first push to create)."""
        assert self.frontier is not None
        with redis_errors("reading the crawl layout"):
            control = self.frontier.client.hgetall(self.frontier.keys.control)
        if stored_layout(cast(dict[bytes, bytes], control)) is not None:
            self.frontier.maintain()  # its script checks the layout first

    def _refuse_start(self, exc: ConfigError | ConnectionError_) -> None:
        """A wrong setting or an unreachable Redis at start: one CRITICAL line that says
        what to do (the error's own message), exit 1, nothing written to the crawl."""
        if self.frontier is not None:
            self.frontier.client.close()
        self.frontier = None
        reason = "config_error" if isinstance(exc, ConfigError) else "redis_unavailable"
        self._fail(reason, str(exc), before_start=True)

    def _refuse_layout(self, exc: LayoutMismatch) -> None:
        """This worker's settings change the crawl's layout: say what to do in one
        CRITICAL line, make the process exit 1, and leave the crawl as it is."""
        crawl = (
            self.frontier.crawl
            if self.frontier is not None
            else self.settings.crawl_name(self.spider.name if self.spider else "?")
        )
        if self.frontier is not None:
            self.frontier.client.close()
        self.frontier = None  # nothing more goes to Redis: close() has nothing to do
        detail = str(exc).split(LayoutMismatch.PREFIX + ": ", 1)[-1]
        lead = (
            f"crawl {crawl!r} was created by a newer redcrawl than this worker's"
            if exc.newer_redcrawl
            else f"crawl {crawl!r} was created with other settings than this worker's"
            f"{layout_hint(str(exc), self.settings)}"
        )
        self._fail(
            "layout_mismatch",
            f"{lead}. In full: {detail}",
            before_start=True,
        )

    def _frontier_paces_downloads(self) -> None:
        """The frontier enforces DOWNLOAD_DELAY (and DOWNLOAD_SLOTS delays) for the whole
        fleet at lease time: this worker's downloader must not wait a second time. Its
        slots' delay goes to 0 (Scrapy's per-process CONCURRENT_REQUESTS_PER_DOMAIN stays:
        the fleet-wide limit is never above it for one worker)."""
        engine = getattr(self.crawler, "engine", None)
        downloader = getattr(engine, "downloader", None)
        if downloader is None:
            return
        if hasattr(downloader, "_delay"):  # Scrapy 2.11-2.19: the default delay of new slots
            downloader._delay = 0.0
        per_slot = getattr(downloader, "per_slot_settings", None)
        if isinstance(per_slot, dict):
            downloader.per_slot_settings = {
                k: {**v, "delay": 0.0} if isinstance(v, dict) else v for k, v in per_slot.items()
            }
        for slot in getattr(downloader, "slots", {}).values():
            slot.delay = 0.0
        assert self.frontier is not None
        log.info(
            "redcrawl: fleet-wide politeness is on (one key per %s): the frontier enforces, "
            "for all workers of the crawl together: %s. This worker's downloader adds no "
            "delay of its own (REDCRAWL_POLITENESS=off for Scrapy's per-process behaviour; "
            "`redcrawl hosts` shows and overrides a site's limits)",
            self.frontier.politeness,
            fleet_limits(self.settings, robots=self.crawler.settings.getbool("ROBOTSTXT_OBEY")),
        )

    def _live_others(self) -> int:
        """Workers of the crawl, other than this one, whose heartbeat is current."""
        assert self.frontier is not None
        now = self.frontier.server_time()
        return sum(until > now and w != self.worker for w, until in self.frontier.workers().items())

    def _say_crawl_state(self) -> None:
        """A finished persistent crawl fetches nothing when run again: say so. One left
        unfinished is resumed: say that too, with its counts (scrapy-redis's 'Resuming
        crawl (N requests scheduled)', which a migrated project's users look for)."""
        assert self.frontier is not None
        counts = self.frontier.counts()  # (PartitionsLost for a finished damaged crawl)
        lost = self.frontier.lost_partitions()
        if lost:  # the rest is crawled; "finished" then stops each worker (docs/cluster.md)
            log.error(
                "redcrawl: %s",
                partitions_lost_text(self.frontier.crawl, lost, self.settings.partitions),
            )
        if counts.finished and counts.done:
            # other live workers: they may have just finished it, as this one started (a
            # small crawl, `redcrawl crawl -w N`): no advice to purge a crawl they did now
            alive = self._live_others()
            if alive:
                log.info(
                    "redcrawl: crawl %r is finished: %d done, and %d other live worker(s) "
                    "of it: nothing left for this one",
                    self.frontier.crawl,
                    counts.done,
                    alive,
                )
                return
            log.warning(
                "redcrawl: crawl %r is finished: %d done; use `redcrawl purge` or "
                "`--recrawl` to crawl again (or SCHEDULER_FLUSH_ON_START)",
                self.frontier.crawl,
                counts.done,
            )
        elif counts.pending and counts.done + counts.dead and not self._live_others():
            # (not a fresh crawl whose other workers of `redcrawl crawl -w N` began it)
            log.info(
                "redcrawl: resuming crawl %r: %d request(s) left (%d ready, %d delayed, "
                "%d in flight), %d done, %d dead",
                self.frontier.crawl,
                counts.pending,
                counts.ready,
                counts.delayed,
                counts.in_flight,
                counts.done,
                counts.dead,
            )

    def _flush_once(self) -> None:
        """SCHEDULER_FLUSH_ON_START: empty the crawl once, by the first worker to start it
        (under a crawl-level lock, and only while no other worker's heartbeat is alive)."""
        assert self.frontier is not None
        with CrawlLock(self.frontier.client, self.frontier.keys, "flush", ttl=30, wait=30) as lock:
            if not lock.acquired:
                raise RedcrawlError(
                    "could not take the crawl's flush lock within 30 s: another worker is "
                    f"flushing it; retry, or delete {lock.key} if a crashed worker left it"
                )
            alive = self._live_others()
            if alive:
                log.info("redcrawl: not flushing: crawl already running (%d worker(s))", alive)
            else:
                self.frontier.purge()
                log.info("redcrawl: flushed crawl %r on start", self.frontier.crawl)
            self.frontier.renew(self.worker)

    def close(self, reason: str) -> None:
        self._closing = True
        if self._shutdown_trigger is not None:
            from twisted.internet import reactor

            cast(Any, reactor).removeSystemEventTrigger(self._shutdown_trigger)
            self._shutdown_trigger = None
        if self._watchdog is not None and self._watchdog.running:
            self._watchdog.stop()
        if self._poll_call is not None and self._poll_call.active():
            self._poll_call.cancel()
        if self._unhook is not None:
            self._unhook()
        if self.frontier is None or self.feeder is None:
            return
        feeder = self.feeder
        leftovers = [lease for _, lease in self._handed_out.values()]
        self._handed_out.clear()
        self._successors.clear()
        self._spacing.clear()
        if leftovers:
            feeder.release(leftovers)
        # Redis gone: don't wait for it (what is not stored comes back by lease expiry:
        # no parent was acknowledged before its children were stored)
        gone = self._failure == "redis_unavailable" or feeder.stalled_for() > 0
        stopped = feeder.stop(timeout=CLOSE_WAIT_GONE if gone else CLOSE_WAIT)
        self._merge_stats()
        if stopped and self._polite:
            self._politeness_stats()
        if not stopped and feeder.error is not None:
            if self._failure is None:  # (the watchdog is stopped: nothing said it yet)
                self._fail(*self._refused_call(feeder.error))
            return  # Redis refused a call: said (CRITICAL), nothing more was sent
        if not stopped:
            log.error(
                "redcrawl: could not reach Redis at close: this worker's unsettled "
                "work (requests found, pages finished) is redone when its leases "
                "expire (REDCRAWL_LEASE_TTL = %s s)",
                self.settings.lease_ttl,
            )
            return
        try:
            # signed off first: of workers closing at the same moment, the last to take
            # the purge lock then sees no other live worker (each one saw the others alive)
            self.frontier.forget_worker(self.worker)
            if not self.settings.persist:
                self._purge_if_last()
        except RedcrawlError as exc:
            log.error(
                "redcrawl: could not sign this worker off at close (%s); its leases "
                "come back by themselves when they expire",
                exc,
            )
        finally:
            self.frontier.client.close()

    def _on_forced_shutdown(self) -> None:
        """The reactor stops and this scheduler was not closed: Scrapy's forced shutdown
        (Ctrl-C or SIGTERM twice), which never closes the spider. Send what is buffered
        (children, acks) and give back what this worker holds (fetched again, no attempt
        spent), waiting CLOSE_WAIT_GONE seconds at most, so the crawl has its requests
        back now, not when their leases expire; then say so, once."""
        self._shutdown_trigger = None
        if self._closing or self.feeder is None or self.frontier is None:
            return
        self._closing = True
        held = [lease for _, lease in self._handed_out.values()]
        self._handed_out.clear()
        self._successors.clear()
        self._spacing.clear()
        if held:
            self.feeder.release(held)
        stopped = self.feeder.stop(timeout=CLOSE_WAIT_GONE)
        if self.feeder.stop_sent():  # (the last heartbeat or counters may be on their way)
            if stopped:
                self._sign_off_bounded()
            log.warning(
                "redcrawl: forced shutdown: the %d request(s) in progress were given back "
                "to the crawl (fetched again by a worker, no attempt spent)",
                len(held),
            )
        else:
            error = self.feeder.error
            log.warning(
                "redcrawl: forced shutdown: could not give this worker's requests back to "
                "Redis (%s); they come back to the crawl when their leases expire "
                "(REDCRAWL_LEASE_TTL = %s s)",
                error if error is not None else f"no answer within {CLOSE_WAIT_GONE:.0f} s",
                self.settings.lease_ttl,
            )

    def _sign_off_bounded(self) -> None:
        """forget_worker, waiting CLOSE_WAIT_GONE seconds at most (on a thread of its own:
        the frontier's client retries for minutes, and at a forced shutdown Scrapy ignores
        the next Ctrl-C, so a wait on a Redis that died right then is a hang until
        SIGKILL). Not done: the heartbeat ends by itself."""
        frontier, worker = self.frontier, self.worker
        assert frontier is not None

        def forget() -> None:
            with contextlib.suppress(RedcrawlError):
                frontier.forget_worker(worker)

        thread = threading.Thread(target=forget, name=f"redcrawl-signoff {worker}", daemon=True)
        thread.start()
        thread.join(CLOSE_WAIT_GONE)

    def _politeness_stats(self) -> None:
        """The crawl-wide politeness counters as they are at this worker's close
        (``redcrawl/politeness/<name>``: keys blocked now, deferrals by reason, the
        politeness wait in ms; see docs/politeness.md)."""
        assert self.frontier is not None
        try:
            for name, value in self.frontier.politeness_stats().items():
                self.stats.set_value(f"redcrawl/politeness/{name}", value)
        except RedcrawlError as exc:
            log.warning("redcrawl: could not read the politeness counters at close: %s", exc)

    def _purge_if_last(self) -> None:
        """SCHEDULER_PERSIST = False: remove the crawl's state when the crawl is finished
        and no other worker is alive (never under another worker's feet). Not a worker of
        ``redcrawl crawl``: its command does it once all its workers have exited (one of
        them may not have started yet: frontier/final.py)."""
        assert self.frontier is not None
        if os.environ.get(COMMAND_PURGES_ENV):
            return
        purged = purge_if_finished(self.frontier, exclude=self.worker)
        if purged is None:
            return
        log.info("redcrawl: crawl finished and SCHEDULER_PERSIST is off: purged it")
        if purged[1] is not None:
            log.warning(
                "redcrawl: could not keep the finished crawl's counts (%s): `redcrawl "
                "crawl` shows the counts it last saw",
                purged[1],
            )

    # --- failing loudly ----------------------------------------------------------------
    def _fail(self, reason: str, message: str, *, before_start: bool = False) -> None:
        """Close the spider with ``reason`` and make the process exit non-zero. From
        :meth:`open` (``before_start``) the spider is closed once the engine runs
        (:func:`~redcrawl.scrapy.lifecycle.refuse_start`)."""
        if self._failure is not None:
            return
        self._failure = reason
        if before_start:
            lifecycle.refuse_start(self.crawler, reason, message)
            return
        closing = "the spider is closing" if self._closing else "closing the spider"
        log.critical("redcrawl: %s; %s (reason %r, exit code 1)", message, closing, reason)
        self.stats.set_value("redcrawl/failure", reason)
        lifecycle.fail_process(self.crawler)
        if self._closing:
            return  # (at close: the engine is stopping it already)
        from twisted.internet import reactor

        cast(Any, reactor).callLater(0, lifecycle.stop_crawler, self.crawler, reason)

    def _watch(self) -> None:
        """Every WATCH seconds, on the reactor: merge the I/O thread's counters, and give
        up when Redis has not answered for REDCRAWL_REDIS_OUTAGE_LIMIT seconds."""
        assert self.feeder is not None
        self._merge_stats()
        if self.feeder.error is not None:
            self._fail(*self._refused_call(self.feeder.error))
        stalled = self.feeder.stalled_for()
        self._tell_outage(stalled)
        if stalled > self.settings.redis_outage_limit:
            self._fail(
                "redis_unavailable",
                f"Redis has not answered for {stalled:.0f} s "
                f"(REDCRAWL_REDIS_OUTAGE_LIMIT = {self.settings.redis_outage_limit} s); "
                "this worker's leases come back to the crawl when they expire",
            )

    def _refused_call(self, error: BaseException) -> tuple[str, str]:
        """The failure reason and CRITICAL line of a call Redis refused (the feeder's
        ``error``)."""
        if isinstance(error, CrawlVanished):  # (docs/cluster.md, Durability)
            return "crawl_vanished", str(error)
        if isinstance(error, RedisOutOfMemory):  # (it says what to do)
            return "redis_error", str(error)
        return (
            "redis_error",
            f"Redis refused a call: {error}; this worker sends nothing more to Redis, and "
            "the requests it holds come back when their leases expire "
            f"(REDCRAWL_LEASE_TTL = {self.settings.lease_ttl} s)",
        )

    def _tell_outage(self, stalled: float) -> None:
        """Say once that Redis has stopped answering (after OUTAGE_NOTICE seconds: redis-py
        resends the call meanwhile, so nothing else would say it), and once that it
        answers again."""
        if stalled >= OUTAGE_NOTICE and self._outage_since is None:
            self._outage_since = time.monotonic() - stalled
            log.warning(
                "redcrawl: Redis (%s) has not answered for %.0f s; this worker goes on with "
                "what it holds and waits for it, and gives up after "
                "REDCRAWL_REDIS_OUTAGE_LIMIT = %s s (exit code 1)",
                self._redis_name(),
                stalled,
                self.settings.redis_outage_limit,
            )
        elif not stalled and self._outage_since is not None:
            log.info(
                "redcrawl: Redis answers again, after %.1f s",
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None

    def _redis_name(self) -> str:
        """The crawl's Redis as logs name it (password hidden)."""
        if self.settings.redis_url:
            return redact(self.settings.redis_url)
        return f"embedded Redis in {self.settings.embedded_dir}"

    def _merge_stats(self) -> None:
        assert self.feeder is not None
        for name, n in self.feeder.stats().items():
            if name == "filtered_remote":
                self.stats.inc_value("redcrawl/filtered", n)
            self.stats.inc_value(f"redcrawl/{STAT_NAMES.get(name, name)}", n)
        waits = self.frontier.replica_wait if self.frontier is not None else None
        if waits is not None:  # REDCRAWL_WAIT_REPLICAS: calls acknowledged by too few
            self.stats.set_value("redcrawl/replicas_short", waits.short)

    def _wake(self) -> None:
        """The I/O thread has leases (or an error) for us: ask the engine to look."""
        if self.feeder is not None and self.feeder.error is not None:
            self._watch()
        if not self._closing:
            lifecycle.wake_engine(self.crawler)

    # --- Scrapy's scheduler interface -------------------------------------------------
    def enqueue_request(self, request: scrapy.Request) -> bool:
        if self.feeder is None:
            return False  # refused at open (_refuse_layout): the spider is closing
        meta = request.meta
        if MARK in meta:
            if self._take_over(request):
                return True
            del meta[MARK]  # a child that copied its parent's meta
        # Start requests are dont_filter in Scrapy, but a crawl must not refetch its start
        # URLs on every worker and every rerun: dedupe them (not their retry or redirect
        # successors, which inherit the marker).
        start = (
            meta.get("is_start_request")
            and not meta.get("retry_times")
            and not meta.get("redirect_times")
        )
        dont_filter = request.dont_filter and not start
        _drop_inherited_slot(request)
        fp = None if dont_filter else self._fingerprint(request)
        if fp is not None and fp in self._local_seen:
            self._filtered(request)
            return False
        try:
            env = codec.from_request(request, self.spider, fingerprint=fp)
            env.dont_filter = fp is None
            # fail here, naming the key, not later in a batch (the bytes are kept for
            # the frontier's record: encoded once)
            encode_for_store(env)
        except EncodeError as exc:
            self.stats.inc_value("redcrawl/unstorable")
            self._fail("unstorable_request", f"cannot store {request}: {exc}")
            return False
        if fp is not None:
            self._remember(fp)
        assert self.feeder is not None
        self.feeder.store(env)
        self.stats.inc_value("redcrawl/enqueued")
        return True

    def _fingerprint(self, request: scrapy.Request) -> bytes:
        if self.custom_fingerprinter is not None:
            return self.custom_fingerprinter(request)
        return self.fingerprinter.request(request)

    def _take_over(self, request: scrapy.Request) -> bool:
        """A request Scrapy's RetryMiddleware made from one we handed out (its meta
        copied, ``retry_times`` raised) is the same logical request: it keeps the
        original's lease, in this worker, and the original is not acknowledged. One
        request, one final state."""
        mark = request.meta[MARK]
        original = self._marked.get(mark)
        if original is None:
            return False
        entry = self._handed_out.get(id(original))
        if entry is None or entry[0] is not original:
            return False
        if request.meta.get("retry_times", 0) <= original.meta.get("retry_times", 0):
            return False
        if original in self._slot_back:
            # a retry made after the response (get_retry_request in a callback): its
            # site's slot went back then, so it is a new request, granted a slot of its
            # own (its meta keeps retry_times, so Scrapy's retry limit still holds)
            self.stats.inc_value("redcrawl/scrapy_retries_after_response")
            return False
        del self._handed_out[id(original)]
        self._outcomes.pop(id(original), None)
        del self._marked[mark]
        self._hand_out(request, entry[1])
        self.stats.inc_value("redcrawl/scrapy_retries")
        if self._polite and self.feeder is not None:
            self._space_retry(request, entry[1])
        else:
            self._successors.append(request)
        return True

    def _space_retry(self, request: scrapy.Request, lease: Lease, check: bool = False) -> None:
        """With fleet-wide politeness a retry keeps its key's slot (Scrapy's retry never
        reaches the response hooks that give it back), but its start must be spaced like
        any other: the frontier reserves one a delay after its key's last start
        (``FrontierCore.retry_start``, asked on the I/O thread) and the retry waits here
        until then; then (``check``) the frontier is asked again whether its key was
        paused or blocked meanwhile (docs/politeness.md, "Scrapy's retries")."""
        from twisted.internet import reactor

        if check and (self._closing or self._spacing.get(id(request)) is not request):
            return  # given back at close
        self._spacing[id(request)] = request

        def done(wait: float | None) -> None:  # (on the I/O thread)
            cast(Any, reactor).callFromThread(self._retry_due, request, lease, wait)

        assert self.feeder is not None
        self.feeder.retry_start(lease, done, check=check)

    def _retry_due(self, request: scrapy.Request, lease: Lease, wait: float | None) -> None:
        """The frontier's answer for a retry (``retry_start``): None, the request is no
        longer held here (its lease was taken back: the fleet serves it again), so it is
        dropped unfetched; ``inf``, its key is paused or blocked: given back; else the
        seconds to wait before it starts, asked again then."""
        if self._closing or self._spacing.get(id(request)) is not request:
            return  # given back at close
        if wait is None or wait == math.inf:
            del self._spacing[id(request)]
            if wait is None:
                self._forget(request)
                self.stats.inc_value("redcrawl/politeness/retry_not_held")
            else:
                self._give_back(request, "redcrawl/politeness/retry_released")
            return
        if wait > 0:
            from twisted.internet import reactor

            self.stats.inc_value("redcrawl/politeness/retry_waited_ms", int(wait * 1000))
            cast(Any, reactor).callLater(wait, self._space_retry, request, lease, True)
            return
        del self._spacing[id(request)]
        self._successors.append(request)
        lifecycle.wake_engine(self.crawler)

    def _hand_out(self, request: scrapy.Request, lease: Lease) -> None:
        mark = next(self._serial)
        request.meta[MARK] = mark
        self._marked[mark] = request
        self._handed_out[id(request)] = (request, lease)
        assert self.feeder is not None
        self.feeder.held = len(self._handed_out)

    def _on_item(self, item: Any, response: Any, spider: Any) -> None:
        if self.feeder is not None:
            self.feeder.add_stats(items=1)

    def _filtered(self, request: scrapy.Request) -> None:
        if self.feeder is not None:
            self.feeder.add_stats(filtered_local=1)
        self.stats.inc_value("redcrawl/filtered")
        if self.df is not None and self.spider is not None:
            self.df.log(request, self.spider)

    def next_request(self) -> scrapy.Request | None:
        if self.feeder is None or self.spider is None:
            return None  # refused at open
        if self._successors:
            return self._successors.popleft()  # already handed out (_take_over)
        if self._failure is not None:
            return None
        while True:
            lease = self.feeder.take()
            if lease is None:
                return None
            if self._late(lease):
                continue
            try:
                request = codec.to_request(lease.envelope, self.spider)
            except DecodeError as exc:
                error = f"cannot rebuild the request: {exc}"
                self.feeder.nack(lease, error, retry=False)
                self._say_undecodable(lease.envelope.url, error)
                continue
            if len(lease.id) == 20:  # a fingerprint (not "#<seq>": dont_filter)
                self._remember(lease.id)
            self._hand_out(request, lease)
            return request

    def _remember(self, fp: bytes) -> None:
        """A fingerprint stored in the crawl: enqueue_request filters it without Redis."""
        if len(self._local_seen) >= LOCAL_SEEN_MAX:
            self._local_seen.clear()  # a cache: Redis has the truth
        self._local_seen.add(fp)

    def _late(self, lease: Lease) -> bool:
        """A granted request that waited in this worker past its start window
        (REDCRAWL_POLITENESS_START_WINDOW, crawls with fleet-wide politeness, keys with a
        delay as far as :meth:`_delay_bound` tells): its delay was charged when it was
        granted, so starting it now could come closer than the delay to the next start
        at its site (granted to another worker on time). Give it back (served next, no
        attempt spent; its slot stays charged: a wasted slot costs throughput, never
        politeness). A key this worker cannot tell has a delay (an operator's delay
        override, the only source it does not see) is asked about instead
        (``Feeder.check_start``: ``FrontierCore.start_late`` on the I/O thread).

        The window counts from the grant (``Lease.granted``, on this process's clock at
        the earliest), not from the reply's arrival: a reply that sat in a socket or
        behind the GIL, or reached a descheduled (frozen) process, may arrive past the
        window. Such a request did not wait here, so it is asked about too, whatever its
        key: it starts if no other grant or start of its key came since its own (its start
        charged then), else it is given back. Not given back blindly: when every reply
        takes longer than the window, that would give back every request and stall the
        crawl (docs/politeness.md, "Start window")."""
        window = self.settings.politeness_start_window
        if not (self._polite and window > 0):
            return False
        now = time.monotonic()
        assert self.feeder is not None
        if not lease.received or now - lease.received <= window:
            if not lease.granted or now - lease.granted <= window:
                return False
            self.feeder.check_start([lease])  # its reply came late: the frontier decides
            self.stats.inc_value("redcrawl/politeness/late_reply_checked")
            return True
        if not self._delay_bound(lease):
            # its key may still have a delay this worker cannot see (an operator's
            # override): the frontier says whether it may start (then it comes back
            # here, its start charged) or must be given back
            self.feeder.check_start([lease])
            return True
        self.feeder.release([lease])
        self.stats.inc_value("redcrawl/politeness/late_released")
        return True

    def lease_of(self, request: scrapy.Request) -> Lease | None:
        """The lease under which this worker holds ``request`` (None: not one of ours, or
        no longer held), for components that call the frontier about it."""
        return self._held_lease(request)

    def give_back(self, request: scrapy.Request) -> bool:
        """Give back a request this worker holds that missed its start (it waited in a
        downloader middleware, e.g. for robots.txt): served next, no attempt spent, not
        acknowledged; its slot goes back. The caller then drops it (raise
        ``IgnoreRequest``). False if it is not held here."""
        return self._give_back(request, "redcrawl/politeness/late_released")

    def _give_back(self, request: scrapy.Request, stat: str) -> bool:
        lease = self._forget(request)
        if lease is None or self.feeder is None:
            return False
        self.feeder.release([lease])
        self.stats.inc_value(stat)
        return True

    def _forget(self, request: scrapy.Request) -> Lease | None:
        """Stop holding ``request`` here, unacknowledged; its lease (None: not held)."""
        lease = self._held_lease(request)
        if lease is None or self.feeder is None:
            return None
        del self._handed_out[id(request)]
        self._marked.pop(request.meta.get(MARK, 0), None)
        self._outcomes.pop(id(request), None)
        self.feeder.held = len(self._handed_out)
        return lease

    def _delay_bound(self, lease: Lease) -> bool:
        """Whether the frontier spaced ``lease``'s key by a delay, as far as this worker
        can tell without asking Redis: a DOWNLOAD_DELAY, fleet-wide AutoThrottle (every
        key has a delay then), the key's DOWNLOAD_SLOTS delay, or a Crawl-delay this
        worker read in the site's robots.txt. An operator's delay override is not seen
        here: :meth:`_late` asks the frontier about such leases (docs/politeness.md,
        "Start window")."""
        s = self.settings
        if s.politeness_delay > 0 or self._auto_throttled:
            return True
        if not s.politeness_slots and self._robots is None:
            return False
        env = lease.envelope
        if self._robots is not None and self._robots.crawl_delay_of(env.url) > 0:
            return True
        if not s.politeness_slots or self.frontier is None:
            return False
        slot = env.meta.get("download_slot") if isinstance(env.meta, dict) else None
        try:
            key = politeness_key(env.url, slot, cast(KeyMode, self.frontier.politeness))
        except (ValueError, TypeError):
            return False
        entry = s.politeness_slots.get(key)
        delay = entry.get("delay") if isinstance(entry, Mapping) else None
        return isinstance(delay, int | float) and delay > 0

    def _poke_later(self) -> None:
        """Ask the engine for requests again after poll_interval (instead of its 5 s
        heartbeat) while other workers may still produce work."""
        from twisted.internet import reactor

        if self._poll_call is None or not self._poll_call.active():
            self._poll_call = cast(Any, reactor).callLater(
                self.settings.poll_interval, lifecycle.wake_engine, self.crawler
            )

    def has_pending_requests(self) -> bool:
        if self.feeder is None:
            return False  # refused at open
        if self._successors or self._handed_out:
            return True
        counts = self.feeder.crawl_counts()
        if counts is not None and counts.finished:
            return False
        # Nothing here but the crawl may not be finished: ask for fresh counts and look
        # again soon (not at the engine's 5 s heartbeat)
        self.feeder.crawl_counts(refresh=True)
        self._poke_later()
        return True

    def __len__(self) -> int:
        return len(self._successors)

    # --- finishing requests -------------------------------------------------------------
    def _first_of(self, reason: str) -> bool:
        """Whether ``reason`` (a dead letter's error, its URL left out) is said for the
        first time: at WARNING then, the others quieter (a renamed callback or a site gone
        down may concern thousands of requests). At most 100 reasons are kept."""
        if reason in self._said or len(self._said) >= 100:
            return False
        self._said.add(reason)
        return True

    def _say_undecodable(self, url: str, error: str) -> None:
        """A stored request this spider cannot rebuild went to the dead letters: a
        WARNING for the first of each reason, DEBUG for the others."""
        first = self._first_of(error.replace(repr(url), "").replace(url, ""))
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "redcrawl: %s is now in the dead letters, not fetched: %s; `redcrawl dead` lists "
            "them, `redcrawl dead --requeue` puts them back once the spider can take them%s",
            url,
            error,
            " (others for the same reason: DEBUG)" if first else "",
        )

    def _on_finished(self, request: scrapy.Request) -> None:
        """The engine is done with ``request`` (called from lifecycle's hook)."""
        entry = self._handed_out.get(id(request))
        if entry is None or entry[0] is not request:
            return  # not ours (engine.download() requests, or already settled)
        del self._handed_out[id(request)]
        self._marked.pop(request.meta.get(MARK, 0), None)
        assert self.feeder is not None
        self.feeder.held = len(self._handed_out)
        lease = entry[1]
        outcome = self._outcomes.pop(id(request), None)
        if self._failure == "unstorable_request":
            # one of its children may be the unstorable one: never acknowledge it
            self.feeder.release([lease])
        elif outcome is None:
            self.feeder.ack(lease)
        else:
            retry, error = outcome
            self.feeder.nack(lease, error, retry=retry)  # after its children
            if retry and lease.attempts < self.settings.max_attempts:
                log.info("redcrawl: failed %s (attempt %d): %s", request.url, lease.attempts, error)
            else:  # the frontier moves it to DEAD (nack.lua: attempts >= max_attempts)
                # (a WARNING for the first of each kind of error, INFO for the others: a
                # site gone down must not flood the log)
                first = self._first_of(error.replace(request.url, "").split(":", 1)[0])
                log.log(
                    logging.WARNING if first else logging.INFO,
                    "redcrawl: failed %s, now in the dead letters %s: %s; `redcrawl dead` "
                    "lists them, `redcrawl dead --requeue` puts them back%s",
                    request.url,
                    f"after {lease.attempts} attempt{'' if lease.attempts == 1 else 's'} "
                    f"(REDCRAWL_MAX_ATTEMPTS={self.settings.max_attempts})"
                    if retry
                    else "(not retryable)",
                    error,
                    " (others failing the same way: INFO)" if first else "",
                )

    def flush(self) -> None:
        """Store buffered requests and acknowledge finished ones now (RedisSpider calls
        it for the start entries it took off their key): waits for Redis up to FLUSH_WAIT
        seconds while Redis answers, not at all during an outage."""
        if self.feeder is not None:
            self.feeder.flush(wait=0.0 if self.feeder.stalled_for() else FLUSH_WAIT)

    def record_failure(self, request: scrapy.Request, error: str, *, retry: bool = True) -> None:
        """Mark a handed-out request as failed: at its end it is nacked, not acked."""
        if id(request) in self._handed_out and id(request) not in self._outcomes:
            self._outcomes[id(request)] = (retry, error)

    def _on_spider_error(self, failure: Failure, response: Response, spider: Any) -> None:
        request = getattr(response, "request", None)
        if request is not None:
            exc = failure.value
            self.record_failure(request, f"callback error: {type(exc).__name__}: {exc}")

    def _on_item_error(self, item: Any, response: Response, spider: Any, failure: Failure) -> None:
        """An item pipeline failed: the item was not stored, so the page must come back."""
        request = getattr(response, "request", None)
        if request is not None:
            exc = failure.value
            self.record_failure(request, f"item pipeline error: {type(exc).__name__}: {exc}")

    # --- fleet-wide politeness at response time (docs/politeness.md) -------------------
    def _held_lease(self, request: scrapy.Request) -> Lease | None:
        entry = self._handed_out.get(id(request))
        return entry[1] if entry is not None and entry[0] is request else None

    def _retry_after(self, response: Response) -> float | None:
        found = parse_retry_after(
            response.headers.get(b"Retry-After"), time.time(), cap=self.settings.retry_after_cap
        )
        return None if found is None else found.delay

    def defer_response(self, request: scrapy.Request, response: Response) -> bool:
        """DeferMiddleware: the site pushed back (a status of REDCRAWL_DEFER_HTTP_CODES).
        Defer a request this worker holds (the frontier serves it later and blocks its
        site for the fleet) and forget it here: it is not acknowledged. False (let the
        response through) for a request not ours, or that handles the status itself."""
        lease = self._held_lease(request)
        if lease is None or self.feeder is None or not self._polite:
            return False
        if defer.handles_status(request, response.status, self.spider):
            return False
        del self._handed_out[id(request)]
        self._marked.pop(request.meta.get(MARK, 0), None)
        self._outcomes.pop(id(request), None)
        self.feeder.held = len(self._handed_out)
        self.feeder.defer(lease, str(response.status), self._retry_after(response))
        self.stats.inc_value(f"redcrawl/deferred/{response.status}")
        site = urlsplit(request.url).netloc
        if (site, response.status) in self._told_deferred:
            log.debug(
                "redcrawl: %s answered %d: deferred, its site blocked for the fleet",
                request.url,
                response.status,
            )
        else:  # once per site and status at INFO: a throttling site defers thousands
            if len(self._told_deferred) >= TOLD_DEFERRED_MAX:
                self._told_deferred.clear()  # (a broad crawl: its sites may be told again)
            self._told_deferred.add((site, response.status))
            log.info(
                "redcrawl: %s answered %d: deferred (no attempt spent), its site blocked for "
                "the fleet; this worker logs its site's next ones at DEBUG (counted in the "
                "stats, redcrawl/deferred/%d)",
                request.url,
                response.status,
                response.status,
            )
        return True

    def _free_slot(self, request: scrapy.Request, outcome: str) -> None:
        """The request's download is over: its site's slot goes back now (the request
        stays leased until it is acknowledged)."""
        lease = self._held_lease(request)
        if lease is not None and self.feeder is not None and self._polite:
            self.feeder.free(lease, outcome)
            self._slot_back.add(request)
            # Lease again once the reactor is through with this response (its callback
            # runs now, unless it waits on something): a request granted while the
            # reactor is busy would start late, closer than DOWNLOAD_DELAY to the next
            # start at its site. The slot itself is back for the fleet at once.
            from twisted.internet import reactor

            cast(Any, reactor).callLater(0, self.feeder.poke)

    def on_download_error(
        self, request: scrapy.Request, exception: BaseException, spider: Any = None
    ) -> None:
        """Outermost process_exception (installed with DeferMiddleware): a download that
        failed for good (after Scrapy's retries), or a request a downloader middleware
        ignored (robots.txt), gives its slot back."""
        self._free_slot(request, slot_outcome(None))

    def _on_response(self, response: Response, request: scrapy.Request, spider: Any) -> None:
        if self._polite:
            # (a 429/503 here was not deferred: the request handles it itself, or
            # deferral is off; the site is blocked all the same)
            pushed_back = response.status in self.settings.defer_http_codes
            retry_after = self._retry_after(response) if pushed_back else None
            outcome = slot_outcome(
                response.status, pushed_back=pushed_back, retry_after=retry_after
            )
            self._free_slot(request, outcome)
        if response.status not in self.settings.retry_http_codes:
            return
        meta = request.meta
        handled = (
            meta.get("dont_retry")
            or meta.get("handle_httpstatus_all")
            or response.status in meta.get("handle_httpstatus_list", ())
            or response.status in getattr(spider, "handle_httpstatus_list", ())
        )
        if not handled:
            self.record_failure(request, f"HTTP {response.status} (after Scrapy's retries)")

    # --- idleness ----------------------------------------------------------------------
    def _on_idle(self, spider: Any) -> None:
        """The engine found nothing to do. Keep the spider open until the whole crawl has
        been finished for ``idle_before_close`` seconds."""
        if self._failure is not None:
            if self.feeder is None:  # refused at open: _fail closes it with its reason
                raise DontCloseSpider
            return
        assert self.feeder is not None
        counts = self.feeder.crawl_counts(refresh=True)
        if counts is None or not counts.finished:
            self._finished_since = None
            self._poke_later()
            raise DontCloseSpider
        now = time.monotonic()
        if self._finished_since is None:
            self._finished_since = now
        if now - self._finished_since < self.settings.idle_before_close:
            self._poke_later()
            raise DontCloseSpider


def _drop_inherited_slot(request: scrapy.Request) -> None:
    """A redirect to another host keeps the source's ``meta["download_slot"]`` (Scrapy's
    downloader writes each request's slot, the host, into its meta, and RedirectMiddleware
    copies the meta): that slot would be the redirect's politeness key, so its site would
    be spaced and counted under the source's limits. Dropped when it is the previous
    URL's host (or, with ``CONCURRENT_REQUESTS_PER_IP``, the address Scrapy resolved it to:
    its slot then) and not the new one's (a slot the spider chose is kept)."""
    from scrapy.resolver import dnscache

    meta = request.meta
    sources, slot = meta.get("redirect_urls"), meta.get("download_slot")
    if not sources or not isinstance(slot, str):
        return
    previous = urlsplit(str(sources[-1])).hostname or ""
    new = urlsplit(request.url).hostname or ""
    if slot in (previous, dnscache.get(previous)) and slot not in (new, dnscache.get(new)):
        del meta["download_slot"]
