"""Where Scrapy is really done with a request, and the few engine internals we touch.

Scrapy (2.11 to 2.19) has no public hook for "this request is finished". The engine's
own point is ``slot.remove_request(request)``: it runs once per request after every
outcome, when the callback's (or errback's) output has been consumed, every child has
been passed to the scheduler and the items have left the pipelines
(``../shared/SCRAPY-LIFECYCLE.md`` measured this under SIGKILL: acking there lost
nothing in 31 trials, acking at the end of a spider middleware's output lost pages in 14
of 15). :func:`on_request_finished` wraps that method on the engine's slot instance.

Download errors have no signal either: :class:`OutcomeMiddleware` (a downloader
middleware, outermost, so it only sees an exception once Scrapy's RetryMiddleware has
given up) records them. The scheduler installs it itself when the project didn't.

Every access to engine internals is here, guarded, with a clear error naming the
Scrapy version when the shape is not what we know.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from scrapy.exceptions import IgnoreRequest, NotConfigured

from redcrawl.errors import ConfigError, RedcrawlError
from redcrawl.failure_file import write_failure

if TYPE_CHECKING:
    import scrapy
    from scrapy.crawler import Crawler

__all__ = ["OutcomeMiddleware", "on_request_finished"]

log = logging.getLogger(__name__)


def _scrapy_version() -> str:
    import scrapy

    return str(scrapy.__version__)


def _slot(crawler: Crawler) -> Any:
    engine = crawler.engine
    slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
    if slot is None or not callable(getattr(slot, "remove_request", None)):
        raise RedcrawlError(
            f"Scrapy {_scrapy_version()}: the engine has no slot with remove_request(); "
            "redcrawl supports Scrapy 2.11 to 2.19 — please report this version"
        )
    return slot


def on_request_finished(
    crawler: Crawler, callback: Callable[[scrapy.Request], None]
) -> Callable[[], None]:
    """Call ``callback(request)`` each time the engine finishes a request, before the
    engine forgets it. Returns a function that removes the hook."""
    slot = _slot(crawler)
    original = slot.remove_request

    def remove_request(request: scrapy.Request) -> None:
        try:
            callback(request)
        except Exception:
            log.exception("redcrawl: error while finishing %s", request)
        finally:
            original(request)

    slot.remove_request = remove_request

    def unhook() -> None:
        if slot.__dict__.get("remove_request") is remove_request:
            del slot.remove_request

    return unhook


def build_component(cls: Any, crawler: Crawler) -> Any:
    """Scrapy's way to build a component from the crawler (2.12+ and before)."""
    try:
        from scrapy.utils.misc import build_from_crawler
    except ImportError:  # Scrapy < 2.12
        from scrapy.utils.misc import create_instance  # type: ignore[attr-defined]

        return create_instance(cls, crawler.settings, crawler)
    return build_from_crawler(cls, crawler)


def scheduler_of(crawler: Crawler) -> Any:
    """The engine's scheduler, or None."""
    engine = crawler.engine
    slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
    return getattr(slot, "scheduler", None)


def mark_start_requests(crawler: Crawler) -> None:
    """Scrapy < 2.13 does not mark start requests (``meta["is_start_request"]``, set by
    2.13's StartSpiderMiddleware); mark them the same way, so that a crawl's start URLs
    are deduplicated across workers and reruns on every version."""
    slot: Any = getattr(crawler.engine, "slot", None)
    original = getattr(slot, "start_requests", None)
    if slot is None or original is None:
        return  # 2.13+: the engine reads start() itself, and marks what it yields

    def marked() -> Any:
        for request in original:
            if hasattr(request, "meta"):
                request.meta.setdefault("is_start_request", True)
            yield request

    slot.start_requests = marked()


def custom_fingerprinter(crawler: Crawler) -> Callable[[scrapy.Request], bytes] | None:
    """The project's REQUEST_FINGERPRINTER_CLASS as a function giving 20-byte ids, or
    None when it is Scrapy's default (whose fingerprints redcrawl computes faster)."""
    from scrapy.utils.request import RequestFingerprinter

    fingerprinter = getattr(crawler, "request_fingerprinter", None)
    if fingerprinter is None or type(fingerprinter) is RequestFingerprinter:
        return None

    def fingerprint(request: scrapy.Request) -> bytes:
        fp = bytes(fingerprinter.fingerprint(request))
        # frontier ids are 20 bytes (a fingerprint) or "#<seq>"
        return fp if len(fp) == 20 else hashlib.sha1(fp).digest()

    return fingerprint


def fail_process(crawler: Crawler) -> None:
    """Make ``scrapy crawl`` / ``runspider`` exit with code 1 once the engine stops, and
    tell a supervisor why (:func:`redcrawl.failure_file.write_failure`: the refusal's
    reason, else the stat ``redcrawl/failure``, set before this is called).

    Scrapy's commands return 1 only when a crawl failed to start: CrawlerProcess sets
    ``bootstrap_failed`` when the crawler has no spider after its crawl ends (2.11 to
    2.19), so the spider is detached at ``engine_stopped``, after every other use of it
    (stats are dumped and ``spider_closed`` sent before)."""
    from scrapy import signals

    reason = refused(crawler)
    if reason is None:
        try:
            reason = crawler.stats.get_value("redcrawl/failure")
        except (AttributeError, RuntimeError):  # Scrapy 2.19 raises before the crawl starts
            reason = None
    if reason is not None:
        write_failure(str(reason))

    def detach() -> None:
        crawler.spider = None

    crawler.signals.connect(detach, signals.engine_stopped, weak=False)


REFUSED = "_redcrawl_refused"
"""Attribute of a crawler refused at start (:func:`refuse_start`): the reason."""


def refused(crawler: Crawler) -> str | None:
    """The reason this crawl was refused at start, or None."""
    return cast(str | None, getattr(crawler, REFUSED, None))


def refuse_start(crawler: Crawler, reason: str, message: str) -> None:
    """Refuse a crawl that cannot start (a wrong setting, no Redis): one CRITICAL line
    with ``message`` (which says what to do), stat ``redcrawl/failure``, exit code 1, and
    the spider closed with ``reason`` once the engine runs (closed earlier, Scrapy 2.19
    never sends ``engine_stopped`` and exits 0). Said once per crawler, whichever of the
    spider (built first) or the scheduler finds the problem."""
    if refused(crawler) is not None:
        return
    setattr(crawler, REFUSED, reason)
    said = message.rstrip().rstrip(".")  # ("... embedded Redis.; closing": one stop too many)
    log.critical("redcrawl: %s; closing the spider (reason %r, exit code 1)", said, reason)
    fail_process(crawler)
    close_when_started(crawler, reason)


KEEP_OPEN_FOR = 30.0
"""Seconds a refused crawl's spider is kept from closing as idle (``finished``) while its
close with the refusal's reason is on its way (:func:`close_when_started`)."""


@contextmanager
def refusing_config_errors(crawler: Crawler) -> Iterator[None]:
    """Build a component Scrapy makes with its engine (an item pipeline, a middleware, an
    extension): a :class:`~redcrawl.errors.ConfigError` refuses the crawl
    (:func:`refuse_start`: one CRITICAL line, exit 1, the spider closed with
    ``config_error``) and leaves the component out (``NotConfigured``). Raised as it is,
    Scrapy ends in asyncio's "Task exception was never retrieved" with a traceback, and
    the spider, whose engine never started, closes as ``finished``."""
    try:
        yield
    except ConfigError as exc:
        refuse_start(crawler, "config_error", str(exc))
        raise NotConfigured from None


def close_when_started(crawler: Crawler, reason: str) -> None:
    """Close the spider with ``reason`` (stat ``redcrawl/failure``) once the engine runs
    (Scrapy 2.19 has no stats before the crawl starts)."""
    from scrapy import signals
    from scrapy.exceptions import DontCloseSpider

    kept_until = time.monotonic() + KEEP_OPEN_FOR

    def keep_open(*args: Any, **kwargs: Any) -> None:
        # until the close below: an idle engine (nothing to crawl, as a refused crawl
        # has) would close the spider first, as 'finished'; bounded, so that a close that
        # never comes cannot keep the process alive
        if time.monotonic() < kept_until:
            raise DontCloseSpider

    def close() -> None:
        crawler.signals.disconnect(keep_open, signals.spider_idle)
        stop_crawler(crawler, reason)

    def stop(wait: int = 0) -> None:
        # (imported here: Scrapy < 2.14 builds the spider, which may refuse, before it
        # installs its reactor, and importing twisted's reactor installs the default one)
        from twisted.internet import reactor

        if wait == 0:
            crawler.stats.set_value("redcrawl/failure", reason)
        engine = crawler.engine
        if not getattr(engine, "running", True) and wait < 200:
            cast(Any, reactor).callLater(0.05, stop, wait + 1)  # up to 10 s
        else:
            cast(Any, reactor).callLater(0, close)

    crawler.signals.connect(keep_open, signals.spider_idle, weak=False)
    try:
        engine = crawler.engine
    except (AttributeError, RuntimeError):  # not built yet (Scrapy 2.19 raises)
        engine = None
    if engine is not None and getattr(engine, "running", False):
        stop()  # started already: engine_started will not be sent again
    else:
        crawler.signals.connect(stop, signals.engine_started, weak=False)


def wake_engine(crawler: Crawler) -> None:
    """Make the engine ask the scheduler for requests now (not at its 5 s heartbeat)."""
    engine = crawler.engine
    slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
    if slot is not None and getattr(slot, "closing", None) is None:
        slot.nextcall.schedule()


def stop_crawler(crawler: Crawler, reason: str) -> None:
    """Close the spider (from any reactor callback)."""
    engine = crawler.engine
    if engine is None or engine.spider is None:
        return
    close_async = getattr(engine, "close_spider_async", None)
    if close_async is not None:
        from scrapy.utils.defer import deferred_from_coro

        deferred_from_coro(close_async(reason=reason))
    else:  # Scrapy < 2.14
        engine.close_spider(engine.spider, reason)


class OutcomeMiddleware:
    """Downloader middleware that reports a download that finally failed (after Scrapy's
    own retries) to redcrawl's scheduler, so the request is retried later with backoff
    and ends in the dead letters instead of being acknowledged.

    Enable it at a low order (outermost), e.g.
    ``DOWNLOADER_MIDDLEWARES = {"redcrawl.scrapy.OutcomeMiddleware": 10}``; the scheduler
    adds it by itself when it is missing.
    """

    def __init__(self, crawler: Crawler | None = None) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> OutcomeMiddleware:
        return cls(crawler)

    def _scheduler(self) -> Any:
        return scheduler_of(self.crawler) if self.crawler is not None else None

    def process_exception(
        self, request: scrapy.Request, exception: BaseException, spider: Any = None
    ) -> None:
        if isinstance(exception, IgnoreRequest):
            return None  # deliberate: the request is done
        scheduler = self._scheduler()
        record = getattr(scheduler, "record_failure", None)
        if record is not None:
            record(
                request,
                f"download error: {type(exception).__name__}: {exception}",
                retry=not isinstance(exception, _final_download_errors()),
            )
        return None


def _final_download_errors() -> tuple[type[BaseException], ...]:
    """Download errors the same request meets on every fetch, which Scrapy never retries
    either: a download cancelled (``DOWNLOAD_MAXSIZE``: the file will not shrink;
    Scrapy's ``DownloadCancelledError``, ``CancelledError`` before 2.13) and a URL scheme
    no handler downloads (``NotSupported``, ``UnsupportedURLSchemeError``). Such a request
    goes to the dead letters at once, not after REDCRAWL_MAX_ATTEMPTS fetches. Scrapy's
    engine never cancels a download in progress when it closes (it waits for them), so a
    cancellation is not a worker stopping."""
    import scrapy.exceptions
    from twisted.internet.defer import CancelledError

    names = ("NotSupported", "DownloadCancelledError", "UnsupportedURLSchemeError")
    found = [getattr(scrapy.exceptions, n, None) for n in names]
    return (CancelledError, *(c for c in found if isinstance(c, type)))


def install_outcome_middleware(crawler: Crawler, scheduler: Any) -> None:
    """Add :class:`OutcomeMiddleware` as the outermost downloader middleware unless the
    project enabled it."""
    manager = getattr(getattr(crawler.engine, "downloader", None), "middleware", None)
    if manager is None:
        return
    if any(isinstance(mw, OutcomeMiddleware) for mw in getattr(manager, "middlewares", ())):
        return
    methods = getattr(manager, "methods", None)
    if methods is None or "process_exception" not in methods:
        log.warning(
            "redcrawl: Scrapy %s: could not add OutcomeMiddleware; add it to "
            "DOWNLOADER_MIDDLEWARES so failed downloads are retried later",
            _scrapy_version(),
        )
        return
    # process_exception methods run highest order first: the last one is the outermost.
    methods["process_exception"].append(OutcomeMiddleware(crawler).process_exception)
