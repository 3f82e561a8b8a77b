"""The Scrapy scheduler on the shared frontier: ``SCHEDULER = "redcrawl.scrapy.Scheduler"``.

How a request moves through one worker:

* ``enqueue_request`` fingerprints and encodes the request at once (a request that can't
  be stored is an error logged there, naming the key, and closes the spider: see
  ``docs/scrapy.md``) and buffers it; buffered requests
  are stored in the frontier in batches, always before any request is acknowledged.
* ``next_request`` hands out one request from a small local prefetch buffer, refilled by
  one ``lease`` call (never a blocking pop: Scrapy's reactor never waits on Redis).
* When Scrapy is really done with a request (its callback's output consumed, its children
  passed to ``enqueue_request``, its items through the pipelines: the engine's own
  "request finished" point, see :mod:`redcrawl.scrapy.lifecycle`), the request is
  acknowledged, or sent back for a retry or to the dead letters by its recorded outcome.
  Children and acks go to Redis together, children first, in one round trip.
* A heartbeat renews all of this worker's leases, so long callbacks keep them; a killed
  worker's leases expire and their requests are handed out again.

Outcomes (see ``docs/scrapy.md``): callback exception -> retry with backoff, then DEAD;
download error still failing after Scrapy's retries -> retry with backoff, then DEAD;
HTTP status in ``REDCRAWL_RETRY_HTTP_CODES`` after Scrapy's retries -> the same;
anything else (2xx, 3xx handled by Scrapy, 404, ``IgnoreRequest``) -> DONE.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from scrapy import signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import DontCloseSpider
from twisted.internet import task

from redcrawl import codec
from redcrawl.connection import connect
from redcrawl.errors import ConnectionLost, DecodeError, EncodeError, RedcrawlError
from redcrawl.fingerprint import canonicalizer_for, fingerprint, request_fingerprint
from redcrawl.frontier import (
    Counts,
    Lease,
    ListsFrontier,
    PushResult,
    SettleCall,
    Settled,
    open_frontier,
)
from redcrawl.guard import MemoryWatch, check_server
from redcrawl.lock import CrawlLock
from redcrawl.scrapy import lifecycle
from redcrawl.settings import Settings

if TYPE_CHECKING:
    import scrapy
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.python.failure import Failure

    from redcrawl.scrapy.dupefilter import DupeFilter

__all__ = ["Scheduler", "seed"]

log = logging.getLogger(__name__)

LOCAL_SEEN_MAX = 200_000
"""Fingerprints a worker remembers to answer enqueue_request without Redis (~20 MB)."""

TICK = 1.0
"""Seconds between flushes of buffered requests, acks and counters when idle."""

COUNTS_CACHE = 1.0
"""Seconds the crawl-wide counts are reused by has_pending_requests()."""


def seed(urls: Iterable[str], *, settings: Settings, crawl: str,
         callback: str | None = None, priority: int = 0,
         client: Any = None, recrawl: bool = False) -> PushResult:
    """Push start URLs straight into a crawl's frontier (durable, deduplicated the way
    the scheduler dedupes). ``callback`` names a spider method (default: ``parse``).
    ``recrawl``: URLs already DONE are accepted again."""
    canonicalizer = canonicalizer_for(settings)
    envs = [codec.Envelope(url=u, callback=callback, priority=priority,
                           fingerprint=fingerprint(u, canonicalizer=canonicalizer))
            for u in map(codec.request_url, urls)]
    frontier = open_frontier(client or connect(settings), settings, crawl)
    return frontier.push(envs, recrawl=recrawl)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Scheduler(BaseScheduler):
    """A Scrapy scheduler whose queue is the crawl's shared frontier in Redis."""

    def __init__(self, crawler: Crawler, settings: Settings,
                 dupefilter: DupeFilter | None = None) -> None:
        self.crawler = crawler
        self.settings = settings
        self.stats = crawler.stats
        self.df = dupefilter
        # Unique per process even when an id is configured: a restarted worker must not
        # keep its predecessor's leases alive with its heartbeat.
        self.worker = (f"{settings.worker_id}:{secrets.token_hex(3)}" if settings.worker_id
                       else default_worker_id())
        self.canonicalizer = canonicalizer_for(settings)
        self.frontier: ListsFrontier | None = None
        self.spider: scrapy.Spider | None = None
        self._buffer: list[codec.Envelope] = []      # accepted locally, not yet stored
        self._acks: list[Lease] = []                 # finished, not yet acknowledged
        self._prefetch: deque[Lease] = deque()       # leased, not yet handed to Scrapy
        # settle calls on their way (lookahead): the call, how many it leases, and what
        # it stores and acks (put back in the buffer if Redis refuses the call)
        self._ahead: deque[tuple[SettleCall, int, list[codec.Envelope], list[Lease]]] = (
            deque())
        self._handed_out: dict[int, tuple[scrapy.Request, Lease]] = {}
        self._outcomes: dict[int, tuple[bool, str]] = {}   # id(request) -> (retry, error)
        self._unstorable: str | None = None  # the first request that could not be stored
        self._local_seen: set[bytes] = set()
        self._counts: tuple[float, Counts] | None = None
        self._next_lease_at = 0.0
        self._concurrency = crawler.settings.getint("CONCURRENT_REQUESTS", 16)
        self._finished_since: float | None = None
        self._heartbeat: task.LoopingCall | None = None
        self._ticker: task.LoopingCall | None = None
        self._memory: MemoryWatch | None = None
        self._unhook: Any = None
        self._poll_call: Any = None
        self._pending_stats: dict[str, int] = {"items": 0, "filtered_local": 0}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        settings = Settings.from_scrapy(crawler.settings)
        dupefilter = None
        df_path = crawler.settings.get("DUPEFILTER_CLASS")
        if df_path:
            from scrapy.utils.misc import load_object

            dupefilter = lifecycle.build_component(load_object(df_path), crawler)
        scheduler = cls(crawler, settings, dupefilter)
        crawler.signals.connect(scheduler._on_spider_error, signals.spider_error)
        crawler.signals.connect(scheduler._on_response, signals.response_received)
        crawler.signals.connect(scheduler._on_idle, signals.spider_idle)
        crawler.signals.connect(scheduler._on_item, signals.item_scraped)
        crawler.signals.connect(scheduler._on_item_error, signals.item_error)
        return scheduler

    # --- lifecycle -------------------------------------------------------------------
    def open(self, spider: scrapy.Spider) -> None:
        self.spider = spider
        crawl = self.settings.crawl_name(spider.name)
        client = connect(self.settings)
        self.frontier = open_frontier(client, self.settings, crawl)
        for warning in check_server(self.frontier):
            log.warning("redcrawl: %s", warning)
        self._memory = MemoryWatch(client, self.settings)
        if self.settings.flush_on_start:
            self._flush_once()
        self.frontier.renew(self.worker)
        self._unhook = lifecycle.on_request_finished(self.crawler, self._on_finished)
        lifecycle.mark_start_requests(self.crawler)
        lifecycle.install_outcome_middleware(self.crawler, self)
        self._heartbeat = task.LoopingCall(self._beat)
        self._heartbeat.start(self.settings.heartbeat, now=False)
        self._ticker = task.LoopingCall(self._tick)
        self._ticker.start(TICK, now=False)
        log.info("redcrawl: worker %s on crawl %r (%s)", self.worker, crawl,
                 self.settings.redis_url or f"embedded Redis in {self.settings.embedded_dir}")

    def _flush_once(self) -> None:
        """SCHEDULER_FLUSH_ON_START: empty the crawl once, by the first worker to start it
        (under a crawl-level lock, and only while no other worker's heartbeat is alive)."""
        assert self.frontier is not None
        with CrawlLock(self.frontier.client, self.frontier.keys, "flush", ttl=30,
                       wait=30) as lock:
            if not lock.acquired:
                raise RedcrawlError(
                    "could not take the crawl's flush lock within 30 s: another worker is "
                    f"flushing it; retry, or delete {lock.key} if a crashed worker left it")
            now = self.frontier.server_time()
            alive = [w for w, until in self.frontier.workers().items() if until > now]
            if alive:
                log.info("redcrawl: not flushing: crawl already running (%d worker(s))",
                         len(alive))
            else:
                self.frontier.purge()
                log.info("redcrawl: flushed crawl %r on start", self.frontier.crawl)
            self.frontier.renew(self.worker)

    def close(self, reason: str) -> None:
        for loop in (self._heartbeat, self._ticker):
            if loop is not None and loop.running:
                loop.stop()
        if self._poll_call is not None and self._poll_call.active():
            self._poll_call.cancel()
        if self._unhook is not None:
            self._unhook()
        if self.frontier is None:
            return
        try:
            self._settle()
            self._publish_stats()
            leftovers = list(self._prefetch) + [lease for _, lease in self._handed_out.values()]
            if leftovers:
                n = self.frontier.release(leftovers)
                self.stats.inc_value("redcrawl/released", n)
            self._prefetch.clear()
            self._handed_out.clear()
            if not self.settings.persist:
                self._purge_if_last()
            self.frontier.forget_worker(self.worker)
        except RedcrawlError as exc:
            log.error("redcrawl: could not hand back this worker's leases at close (%s); "
                      "they come back by themselves when they expire", exc)
        finally:
            self.frontier.client.close()

    def _purge_if_last(self) -> None:
        """SCHEDULER_PERSIST = False: remove the crawl's state when the crawl is finished
        and no other worker is alive (never under another worker's feet)."""
        assert self.frontier is not None
        now = self.frontier.server_time()
        others = [w for w, until in self.frontier.workers().items()
                  if until > now and w != self.worker]
        if not others and self.frontier.counts().finished:
            self.frontier.purge()
            log.info("redcrawl: crawl finished and SCHEDULER_PERSIST is off: purged it")

    # --- Scrapy's scheduler interface -------------------------------------------------
    def enqueue_request(self, request: scrapy.Request) -> bool:
        meta = request.meta
        # Start requests are dont_filter in Scrapy, but a crawl must not refetch its start
        # URLs on every worker and every rerun: dedupe them (not their retry or redirect
        # successors, which inherit the marker).
        start = (meta.get("is_start_request") and not meta.get("retry_times")
                 and not meta.get("redirect_times"))
        dont_filter = request.dont_filter and not start
        fp = None if dont_filter else request_fingerprint(
            request, canonicalizer=self.canonicalizer,
            version_meta_key=self.settings.fingerprint_version_meta)
        if fp is not None and fp in self._local_seen:
            self._filtered(request)
            return False
        try:
            env = codec.from_request(request, self.spider, fingerprint=fp)
            env.dont_filter = fp is None
            codec.encode(env)  # fail here, naming the key, not later in a batch
        except EncodeError as exc:
            # Never a silent drop: close the spider, and send every request that finishes
            # from now on back for a retry instead of acknowledging it, so the one whose
            # callback made this request is fetched again once the spider is fixed.
            self.stats.inc_value("redcrawl/unstorable")
            log.error("redcrawl: cannot store %s: %s. Closing the spider (reason "
                      "redcrawl_unstorable); requests finishing now are retried later, "
                      "not acknowledged", request, exc)
            if self._unstorable is None:
                self._unstorable = str(exc)
                lifecycle.stop_crawler(self.crawler, "redcrawl_unstorable")
            return False
        if fp is not None:
            if len(self._local_seen) >= LOCAL_SEEN_MAX:
                self._local_seen.clear()  # a cache: Redis has the truth
            self._local_seen.add(fp)
        self._buffer.append(env)
        self.stats.inc_value("redcrawl/enqueued")
        if len(self._buffer) >= self.settings.batch_size:
            self._flush()
        return True

    def _on_item(self, item: Any, response: Any, spider: Any) -> None:
        self._pending_stats["items"] += 1

    def _filtered(self, request: scrapy.Request) -> None:
        self._pending_stats["filtered_local"] += 1
        self.stats.inc_value("redcrawl/filtered")
        if self.df is not None and self.spider is not None:
            self.df.log(request, self.spider)

    def next_request(self) -> scrapy.Request | None:
        assert self.frontier is not None and self.spider is not None
        while True:
            if not self._prefetch and not self._refill():
                return None
            lease = self._prefetch.popleft()
            try:
                request = codec.to_request(lease.envelope, self.spider)
            except DecodeError as exc:
                self.frontier.dead_letter(lease, f"cannot rebuild the request: {exc}")
                self.stats.inc_value("redcrawl/dead")
                continue
            self._handed_out[id(request)] = (request, lease)
            return request

    def _refill(self) -> bool:
        """Take the leases of the oldest call on its way, else make one round trip:
        store what is buffered, ack what is finished, lease more."""
        while self._ahead:
            if not self._collect_one():
                # the crawl ran short of ready work: take in what is on its way, then
                # lease only on demand (polling while nothing is ready)
                while self._ahead:
                    self._collect_one()
                if self._prefetch:
                    return True
                break
            if self._prefetch:
                self._look_ahead()
                return True
        now = time.monotonic()
        # Lease prefetch requests at a time, as long as this worker holds no more than
        # CONCURRENT_REQUESTS + prefetch (Scrapy's own limits don't bound the requests
        # still in the scraper).
        room = min(self.settings.prefetch,
                   self.settings.prefetch + self._concurrency - len(self._handed_out))
        # While the crawl had nothing ready, poll only every poll_interval, unless this
        # worker itself has new requests to store.
        if room <= 0 or (now < self._next_lease_at and not self._buffer):
            return False
        leases = self._settle(lease=room)
        if not leases:
            self._next_lease_at = now + self.settings.poll_interval
            self._poke_later()
            return False
        self._next_lease_at = 0.0
        self._prefetch.extend(leases)
        if len(leases) == room:  # the crawl has ready work: keep calls on their way
            self._look_ahead()
        return True

    def _look_ahead(self) -> None:
        """Begin settle calls (store, ack, lease ``prefetch`` more) until ``lookahead``
        are on their way, within PREFETCH * (1 + LOOKAHEAD) + CONCURRENT_REQUESTS held
        requests. Redis runs them while Scrapy works; _refill takes their leases."""
        assert self.frontier is not None
        prefetch = self.settings.prefetch
        while len(self._ahead) < self.settings.lookahead:
            held = (len(self._handed_out) + len(self._prefetch)
                    + sum(n for _, n, _, _ in self._ahead))
            room = min(prefetch, prefetch * (1 + self.settings.lookahead)
                       + self._concurrency - held)
            if room <= 0:
                return
            push, acks = self._buffer, self._acks
            self._buffer, self._acks = [], []
            call = self.frontier.settle_begin(push=push, ack=acks, lease=(self.worker, room))
            self._ahead.append((call, room, push, acks))
            self.stats.inc_value("redcrawl/lookahead_calls")

    def _flush(self) -> None:
        """A full batch to store or ack: on its way like the lookahead's calls (after
        them, in order; waiting for the oldest when ``lookahead`` are on their way), or
        a round trip now without lookahead."""
        if not self.settings.lookahead:
            self._settle()
            return
        assert self.frontier is not None
        if len(self._ahead) >= self.settings.lookahead:
            self._collect_one()
        push, acks = self._buffer, self._acks
        if not push and not acks:  # (Redis was lost while waiting)
            return
        self._buffer, self._acks = [], []
        self._ahead.append((self.frontier.settle_begin(push=push, ack=acks), 0, push, acks))

    def _collect_one(self) -> bool:
        """The oldest call on its way: its leases go to the local buffer. Returns whether
        it leased all it asked for. A call Redis refused puts what it carried back (and
        the error propagates, as for _settle)."""
        call, n, push, acks = self._ahead.popleft()
        try:
            out = call.result()
        except ConnectionLost as exc:
            self._redis_lost(exc)
            return False
        except RedcrawlError:
            self._buffer[:0] = push
            self._acks[:0] = acks
            raise
        self._prefetch.extend(self._account(out, len(acks)))
        return len(out.leases) >= n

    def _poke_later(self) -> None:
        """Ask the engine for requests again after poll_interval (instead of its 5 s
        heartbeat) while other workers may still produce work."""
        from twisted.internet import reactor

        if self._poll_call is None or not self._poll_call.active():
            self._poll_call = cast(Any, reactor).callLater(
                self.settings.poll_interval, lifecycle.wake_engine, self.crawler)

    def has_pending_requests(self) -> bool:
        if self._prefetch or self._buffer or self._handed_out or self._acks or self._ahead:
            return True
        return not self._global_counts().finished

    def _global_counts(self, max_age: float = COUNTS_CACHE) -> Counts:
        assert self.frontier is not None
        now = time.monotonic()
        if self._counts is None or now - self._counts[0] > max_age:
            self._counts = (now, self.frontier.counts())
        return self._counts[1]

    def __len__(self) -> int:
        return len(self._prefetch) + len(self._buffer)

    # --- finishing requests -------------------------------------------------------------
    def _on_finished(self, request: scrapy.Request) -> None:
        """The engine is done with ``request`` (called from lifecycle's hook)."""
        entry = self._handed_out.get(id(request))
        if entry is None or entry[0] is not request:
            return  # not ours (engine.download() requests, or already settled)
        del self._handed_out[id(request)]
        lease = entry[1]
        outcome = self._outcomes.pop(id(request), None)
        if outcome is None and self._unstorable is not None:
            outcome = (True, f"a request it made could not be stored: {self._unstorable}")
        if outcome is None:
            self._acks.append(lease)
            if len(self._acks) >= self.settings.batch_size:
                self._flush()
            return
        assert self.frontier is not None
        retry, error = outcome
        self._settle()  # children first
        result = self.frontier.nack(lease, error, retry=retry)
        self.stats.inc_value(f"redcrawl/{result}")
        log.info("redcrawl: %s %s: %s", result, request.url, error)

    def flush(self) -> None:
        """Store buffered requests and acknowledge finished ones now."""
        self._settle()

    def _settle(self, lease: int = 0) -> list[Lease]:
        """Store buffered requests, acknowledge finished ones and (``lease`` > 0) lease
        more, in one atomic round trip, after the calls on their way; returns the new
        leases."""
        while self._ahead:
            self._collect_one()
        if not self._buffer and not self._acks and not lease:
            return []
        assert self.frontier is not None
        push, acks = self._buffer, self._acks
        try:
            out = self.frontier.settle(push=push, ack=acks,
                                       lease=(self.worker, lease) if lease else None)
        except ConnectionLost as exc:
            self._redis_lost(exc)
            return []
        self._buffer, self._acks = [], []
        return self._account(out, len(acks))

    def _redis_lost(self, exc: ConnectionLost) -> None:
        log.critical("redcrawl: Redis is gone (%s); stopping this worker without "
                     "acknowledging anything: its leases will be handed out again", exc)
        self._buffer, self._acks = [], []
        self._handed_out.clear()
        self._prefetch.clear()
        self._ahead.clear()
        lifecycle.stop_crawler(self.crawler, "redis_lost")

    def _account(self, out: Settled, n_acks: int) -> list[Lease]:
        """Stats of one settle; returns its leases."""
        pushed, acked = out.pushed, out.acked
        if pushed.filtered:
            self.stats.inc_value("redcrawl/filtered", pushed.filtered)
            self.stats.inc_value("redcrawl/filtered_remote", pushed.filtered)
        if pushed.accepted:
            self.stats.inc_value("redcrawl/stored", pushed.accepted)
            self._next_lease_at = 0.0  # new work: no reason to wait before leasing
            self._counts = None
        if acked:
            self.stats.inc_value("redcrawl/acked", acked)
        if n_acks > acked:
            self.stats.inc_value("redcrawl/stale_acks", n_acks - acked)
        if out.leases:
            self.stats.inc_value("redcrawl/leased", len(out.leases))
        return out.leases

    def record_failure(self, request: scrapy.Request, error: str, *, retry: bool = True) -> None:
        """Mark a handed-out request as failed: at its end it is nacked, not acked."""
        if id(request) in self._handed_out and id(request) not in self._outcomes:
            self._outcomes[id(request)] = (retry, error)

    def _on_spider_error(self, failure: Failure, response: Response, spider: Any) -> None:
        request = getattr(response, "request", None)
        if request is not None:
            exc = failure.value
            self.record_failure(request, f"callback error: {type(exc).__name__}: {exc}")

    def _on_item_error(self, item: Any, response: Response, spider: Any,
                       failure: Failure) -> None:
        """An item pipeline failed: the item was not stored, so the page must come back."""
        request = getattr(response, "request", None)
        if request is not None:
            exc = failure.value
            self.record_failure(request, f"item pipeline error: {type(exc).__name__}: {exc}")

    def _on_response(self, response: Response, request: scrapy.Request, spider: Any) -> None:
        if response.status not in self.settings.retry_http_codes:
            return
        meta = request.meta
        handled = (meta.get("dont_retry") or meta.get("handle_httpstatus_all")
                   or response.status in meta.get("handle_httpstatus_list", ())
                   or response.status in getattr(spider, "handle_httpstatus_list", ()))
        if not handled:
            self.record_failure(request, f"HTTP {response.status} (after Scrapy's retries)")

    # --- heartbeat and idleness ------------------------------------------------------------
    def _publish_stats(self) -> None:
        """Crawl-wide counters for progress displays (items, locally filtered)."""
        assert self.frontier is not None
        deltas, self._pending_stats = self._pending_stats, dict.fromkeys(self._pending_stats, 0)
        self.frontier.add_stats(**deltas)

    def _beat(self) -> None:
        """Heartbeat: this worker and all its leases are alive for another lease_ttl."""
        assert self.frontier is not None
        try:
            self.frontier.renew(self.worker)
        except RedcrawlError as exc:
            log.warning("redcrawl: heartbeat failed (%s); retrying at the next beat", exc)

    def _tick(self) -> None:
        """Every second: store what is buffered, ack what is finished, publish counters."""
        try:
            self._settle()
            self._publish_stats()
            warning = self._memory.check() if self._memory is not None else None
            if warning:
                log.warning("redcrawl: %s", warning)
        except RedcrawlError as exc:
            log.warning("redcrawl: periodic flush failed (%s); retrying", exc)

    def _on_idle(self, spider: Any) -> None:
        """The engine found nothing to do. Keep the spider open until the whole crawl has
        been finished for ``idle_before_close`` seconds."""
        counts = self._global_counts(max_age=0)
        if not counts.finished:
            self._finished_since = None
            raise DontCloseSpider
        now = time.monotonic()
        if self._finished_since is None:
            self._finished_since = now
        if now - self._finished_since < self.settings.idle_before_close:
            self._poke_later()
            raise DontCloseSpider
