"""Spiders that take their start URLs from a Redis key, like scrapy-redis's.

``RedisSpider`` and ``RedisCrawlSpider`` read the key ``redis_key`` (default
``REDIS_START_URLS_KEY`` = ``"%(name)s:start_urls"``), a list (or a set with
``REDIS_START_URLS_AS_SET``, or a sorted set, highest score first, with
``REDIS_START_URLS_AS_ZSET``), ``REDIS_START_URLS_BATCH_SIZE`` entries at a time: at
start, and again whenever the spider is idle. An entry is a plain URL or a JSON object::

    {"url": "https://example.com/p/1", "meta": {"source": "feed"}, "callback": "parse_item",
     "priority": 5, "method": "POST", "body": "...", "headers": {...}, "dont_filter": true}

Other keys of a JSON entry become form data, as in scrapy-redis.

Every entry is handled the same way, whether it was read at start or while the spider was
idle, as scrapy-redis does: it is always fetched (``dont_filter`` is True unless a JSON
entry says false: not deduplicated, not dropped as offsite). Only http(s) URLs are
accepted unless the spider lists more schemes in ``redis_start_url_schemes`` (e.g.
``{"http", "https", "ftp"}``); a callback must be a public method of the spider's own
class (:mod:`redcrawl.callbacks`). A refused or malformed entry is logged with the reason,
counted (stat ``redcrawl/start_entries/refused``) and kept (below); it never stops the
spider.

A start key that cannot be read (a key of another type than the settings say, or one an
ACL user may not touch) closes the spider with a message naming the key and what to do
(reason ``redcrawl_start_key``).

What happens to an entry between its key and the frontier (a SIGKILL loses none): on
redcrawl's scheduler a batch is *claimed*, not popped: one atomic step
(``lua/start_claim.lua``) takes it off the start key (from the head of a list as
``LPOP``, as ``SPOP`` from a set, as ``ZPOPMAX`` from a sorted set, score kept) and keeps
it in the claims hash beside the key (:func:`redcrawl.keys.start_claims`:
``<key>:{<key>}:claimed``, or ``<key>:claimed`` for a key with a hash tag; one field
``<worker>#<seq>`` per batch, in the start key's Redis Cluster slot). Once every request
made from the batch went to the scheduler and the worker's I/O thread has stored them
in the frontier, the claim is cleared (``lua/start_settle.lua``). The claims of a worker
whose heartbeat has ended (``FrontierCore.workers``) go back to the start key
(``lua/start_recover.lua``: at the head of a list, in order; a sorted set's with their
scores), looked for when a spider starts and while it is idle; a live worker's claims are
never touched. So an entry is fetched at least once, like scrapy-redis's ``dont_filter``
start entries: a worker killed after its requests were stored but before its claim was
cleared (a second or so) has its entries fetched again. A spider on another scheduler,
or one that overrides :meth:`RedisMixin.fetch_data`, pops as scrapy-redis does.

Refused entries are kept: each goes (as JSON ``{"entry", "reason", "worker", "time"}``)
to the list beside the start key (:func:`redcrawl.keys.start_refused`:
``<key>:{<key>}:refused``), newest first, the last :data:`REFUSED_MAX`; the first one a
worker refuses logs where the list is. Inspect with ``redis-cli LRANGE <list> 0 -1``;
re-push a fixed entry onto the start key.

To seed a crawl deduplicated, push URLs into the frontier itself instead:
``redcrawl seed URL...`` or :func:`redcrawl.scrapy.seed`.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import redis
import scrapy
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.spiders import CrawlSpider, Spider

from redcrawl.callbacks import callback_problem, resolve_callback
from redcrawl.connection import connect, redis_cli_hint
from redcrawl.errors import ConfigError, ConnectionError_, RedcrawlError
from redcrawl.frontier.core import heartbeat_deadlines
from redcrawl.keys import start_claims, start_refused
from redcrawl.scrapy import lifecycle
from redcrawl.scrapy.one_off import one_off_command
from redcrawl.scripts import BASE, Scripts
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors
from redcrawl.urls import HTTP_SCHEMES, url_problem

__all__ = ["REFUSED_MAX", "RedisCrawlSpider", "RedisMixin", "RedisSpider", "StartKey"]

REFUSED_MAX = 10_000
"""Refused start entries kept in the list beside the start key (the newest)."""

SETTLE_EVERY = 0.5
"""Seconds between looks for claimed batches whose requests are stored (to clear them)."""

RECOVER_EVERY = 1.0
"""Seconds between looks for claims of stopped workers (at start and while idle)."""

REACTOR_TIMEOUT = 5.0
"""Seconds a start key call made on Scrapy's reactor (claims, while idle) may wait for
Redis, with no retry: a frozen or dead Redis must not block the reactor (SIGTERM would
not be handled). A claim that failed is sent again with the same field at the next
read, which gets the same batch back."""

READ_AGAIN = 5.0
"""Seconds before the next read of the start key after one that failed."""

_SOURCES = {
    "claim": (BASE, "lua/start_claim.lua"),
    "settle": (BASE, "lua/start_settle.lua"),
    "recover": (BASE, "lua/start_recover.lua"),
}

_REQUEST_KEYS = {
    "url",
    "meta",
    "callback",
    "errback",
    "priority",
    "method",
    "body",
    "headers",
    "dont_filter",
    "cookies",
    "cb_kwargs",
    "formdata",
}


def _check_entry_types(params: dict[str, Any]) -> None:
    """A ValueError naming the first field of a JSON start entry whose type Scrapy's
    Request would reject, or take to mean something else ('"dont_filter": "no"' is true;
    '"cookies": 7' fails only at download, then is retried and dead-lettered). A null
    field counts as not given."""
    for name, value in params.items():
        if name in ("url", "method", "body", "callback", "errback"):
            ok, want = isinstance(value, str), "a string"
        elif name in ("meta", "cb_kwargs", "headers", "formdata"):
            ok, want = isinstance(value, dict), "a JSON object"
        elif name == "cookies":
            ok = isinstance(value, dict) or (
                isinstance(value, list) and all(isinstance(c, dict) for c in value)
            )
            want = "a JSON object or a list of objects"
        elif name == "dont_filter":
            ok, want = isinstance(value, bool), "true or false"
        elif name == "priority":
            ok = isinstance(value, int) and not isinstance(value, bool)
            want = "an integer"
        else:
            continue
        if not ok:
            raise ValueError(f"{name!r} must be {want}, not {json.dumps(value)[:80]}")


class StartKey:
    """The Redis side of one start key: claim a batch, clear a claim (and keep refused
    entries), give stopped workers' claims back, or pop as scrapy-redis does (module
    docs). Errors: :class:`~redcrawl.errors.ConfigError` for a key of the wrong type or
    outside the ACL user's key pattern, else :mod:`redcrawl.transport`'s."""

    def __init__(self, client: Any, key: str, kind: str) -> None:
        self.client = client
        self.key = key
        self.kind = kind
        """``list``, ``set`` or ``zset``."""
        self.claims = start_claims(key)
        self.refused = start_refused(key)
        self._scripts = Scripts(client, _SOURCES)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        with redis_errors(what):
            try:
                yield
            except redis.exceptions.NoPermissionError as exc:
                raise ConfigError(
                    "REDIS_START_URLS_KEY",
                    f"the Redis user may not read the start key {self.key!r} or the keys "
                    f"beside it ({exc}). Allow them in the user's ACL (ACL SETUSER <user> "
                    f"~{self.key}*), or move the key inside the user's key pattern with "
                    "REDIS_START_URLS_KEY or the spider's redis_key (e.g. "
                    "'rc:%(name)s:start_urls' for ~rc:*)",
                ) from None
            except redis.exceptions.ResponseError as exc:
                if "WRONGTYPE" not in str(exc):
                    raise
                raise self._wrong_type() from None

    def _wrong_type(self) -> ConfigError:
        actual = self.client.type(self.key)
        actual = actual.decode() if isinstance(actual, bytes) else str(actual)
        setting = {"set": "REDIS_START_URLS_AS_SET", "zset": "REDIS_START_URLS_AS_ZSET"}
        fix = (
            f"set {setting[actual]} = True"
            if actual in setting
            else "turn REDIS_START_URLS_AS_SET and REDIS_START_URLS_AS_ZSET off"
            if actual == "list"
            else "delete it or point REDIS_START_URLS_KEY elsewhere"
        )
        return ConfigError(
            setting.get(self.kind, "REDIS_START_URLS_KEY"),
            f"start key {self.key!r} is a Redis {actual}, but the spider reads it "
            f"as a {self.kind}; {fix}",
        )

    def pop(self, count: int) -> list[bytes]:
        """Pop up to ``count`` entries (no claim: scrapy-redis's way)."""
        with self._errors("reading the start key"):
            if self.kind == "zset":
                data = [member for member, _ in self.client.zpopmax(self.key, count)]
            elif self.kind == "set":
                data = self.client.spop(self.key, count)
            else:
                data = self.client.lpop(self.key, count)
        return list(data or [])

    def claim(self, field: str, count: int) -> list[bytes]:
        """Take up to ``count`` entries off the key under the claim ``field``
        (``<worker>#<seq>``), atomically (each entry goes to one worker)."""
        with self._errors("claiming start entries"):
            raw = self._scripts["claim"](
                keys=[self.key, self.claims], args=[self.kind, count, field]
            )
        return list(raw[::2] if self.kind == "zset" else raw)

    def settle(self, field: str, refused: list[str]) -> None:
        """Clear the claim ``field`` ("" for none) and keep the ``refused`` records, in one
        step."""
        with self._errors("clearing a start entries claim"):
            self._scripts["settle"](
                keys=[self.claims, self.refused], args=[field, REFUSED_MAX, *refused]
            )

    def owners(self) -> dict[str, list[str]]:
        """Worker -> the fields of its claims, newest first."""
        with self._errors("reading start entries claims"):
            fields = self.client.hkeys(self.claims)
        out: dict[str, list[tuple[int, str]]] = {}
        for raw in fields:
            field = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            worker, _, seq = field.rpartition("#")
            out.setdefault(worker, []).append((int(seq) if seq.isdigit() else 0, field))
        return {w: [f for _, f in sorted(claims, reverse=True)] for w, claims in out.items()}

    def recover(self, fields: list[str]) -> int:
        """Give the claims ``fields`` (newest first) back to the start key; returns how many
        entries went back (a claim cleared or given back meanwhile is skipped)."""
        if not fields:
            return 0
        with self._errors("giving start entries back"):
            return int(
                self._scripts["recover"](keys=[self.key, self.claims], args=[self.kind, *fields])
            )

    def recover_stopped(
        self, me: str | None, workers: dict[str, float], now: float
    ) -> tuple[int, list[str]]:
        """Give back the claims of every worker but ``me`` whose heartbeat deadline in
        ``workers`` (``FrontierCore.workers``: seconds, server clock) is not after ``now``
        (or that has none). Returns (entries given back, the live workers that hold
        claims)."""
        stopped: list[str] = []
        live: list[str] = []
        for worker, fields in self.owners().items():
            if worker == me:
                continue
            if workers.get(worker, 0.0) > now:
                live.append(worker)
            else:
                stopped += fields
        return self.recover(stopped), live


def _spider_number(name: str, value: Any, low: float) -> float:
    """A spider attribute that is a number (``redis_batch_size``, ``max_idle_time``),
    perhaps given as a spider argument (a string); a ConfigError naming it otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    whole = name != "max_idle_time"
    if not math.isfinite(number) or number < low or (whole and number != int(number)):
        kind = "a whole number" if whole else "a number of seconds"
        raise ConfigError(
            f"spider attribute {name}",
            f"{value!r} is not {kind} of at least {low:g} (set it on the spider or with "
            f"`scrapy crawl SPIDER -a {name}=N`)",
        )
    return number


class RedisMixin:
    """Reads start requests from a Redis key. Mix into a Spider (see module docs)."""

    redis_key: str | None = None
    redis_batch_size: int | None = None
    max_idle_time: float | None = None
    redis_encoding: str = "utf-8"
    """``REDIS_ENCODING``, for a ``make_request_from_data`` written for scrapy-redis (its
    own decodes the entry with it); redcrawl reads start entries as UTF-8."""
    redis_start_url_schemes: Iterable[str] = HTTP_SCHEMES
    """URL schemes start entries may use; http and https unless the spider opts in."""

    crawler: Any
    name: str
    logger: Any

    _refused = False  # setup_redis failed: the crawl is refused (lifecycle.refuse_start)
    _one_off: str | None = None  # a one-off Scrapy command runs: no start URLs from Redis

    def _setup_or_refuse(self, crawler: Any) -> None:
        """:meth:`setup_redis`, or, when a setting is wrong or Redis can't be reached, the
        crawl refused with one CRITICAL line and exit code 1 (raised here, while Scrapy
        builds the spider, it would end as an asyncio traceback): the spider then yields
        nothing and the scheduler does not open. Under a one-off Scrapy command (``scrapy
        shell``, ``parse``...) the spider leaves Redis alone (:mod:`redcrawl.scrapy.one_off`)."""
        command = one_off_command()
        if command is not None:
            self._one_off = command
            self.logger.info(
                "redcrawl: `scrapy %s`: this spider reads no start URLs from Redis", command
            )
            return
        try:
            self.setup_redis(crawler)
        except (ConfigError, ConnectionError_) as exc:
            self._refused = True
            reason = "config_error" if isinstance(exc, ConfigError) else "redis_unavailable"
            lifecycle.refuse_start(crawler, reason, str(exc))

    def setup_redis(self, crawler: Any) -> None:
        settings = Settings.from_scrapy(crawler.settings)
        self._rc_settings = settings
        key = self.redis_key or settings.start_urls_key
        try:
            self.redis_key = key % {"name": self.name}
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError(
                "REDIS_START_URLS_KEY",
                f"start key {key!r} is not a valid %-format ({exc!r}); the only "
                "placeholder is %(name)s, the spider's name",
            ) from None
        if not self.redis_key.strip():
            raise ConfigError("REDIS_START_URLS_KEY", "the start key name is empty: name one")
        # (spider arguments, `-a max_idle_time=4`, come as strings: scrapy-redis converts them)
        if self.redis_batch_size is None:
            self.redis_batch_size = settings.start_urls_batch_size
        self.redis_batch_size = int(_spider_number("redis_batch_size", self.redis_batch_size, 1))
        if self.max_idle_time is None:
            self.max_idle_time = settings.max_idle_time
        self.max_idle_time = _spider_number("max_idle_time", self.max_idle_time, 0)
        self.redis_encoding = str(crawler.settings.get("REDIS_ENCODING") or "utf-8")
        self.server = connect(settings)
        self._reactor_client = self._bounded_client(settings)
        if settings.start_urls_as_set and settings.start_urls_as_zset:
            raise ConfigError(
                "REDIS_START_URLS_AS_ZSET",
                "REDIS_START_URLS_AS_SET is on too; "
                "the start key is either a set or a sorted set: turn one off",
            )
        self._key_type = (
            "zset"
            if settings.start_urls_as_zset
            else "set"
            if settings.start_urls_as_set
            else "list"
        )
        self._schemes = frozenset(s.lower() for s in self.redis_start_url_schemes)
        self._closing = False
        self._idle_since = time.monotonic()
        self._start_key = StartKey(self._reactor_client, self.redis_key, self._key_type)
        self._seq = itertools.count(1)
        self._retry_field: str | None = None  # a claim whose reply never came: sent again
        self._read_after = 0.0  # a read failed: don't read before this (monotonic)
        self._read_failing = False  # a failed read was logged (once per outage)
        self._worker: str | None = None  # the scheduler's worker id, once claiming
        self._feeder: Any = None  # the scheduler's Feeder, once claiming
        self._frontier: Any = None  # the scheduler's frontier (workers' heartbeats)
        # claimed batches whose requests all went to the scheduler: (claim field, the
        # feeder's generation then, refused records), cleared once stored
        self._pending: deque[tuple[str, int, list[str]]] = deque()
        self._settle_call: Any = None
        self._next_recover = 0.0
        self._claims_elsewhere = False  # live workers held claims at the last look
        self._told_refused = False
        self._settle_failing = False  # a failed claim clearing was logged (once per outage)
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self._active, signal=signals.response_received)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        self.logger.info(
            "Reading start URLs from redis key %r (batch size %d)",
            self.redis_key,
            self.redis_batch_size,
        )

    def _bounded_client(self, settings: Settings) -> Any:
        """The client of the start key calls made on the reactor: each call waits
        REACTOR_TIMEOUT seconds at most, with no retry (``self.server``, the spider's
        client for its own code as in scrapy-redis, keeps redcrawl's retries). A Redis
        Cluster URL keeps ``self.server``."""
        from redcrawl.cluster import is_cluster_url
        from redcrawl.connection import resolve_url

        if is_cluster_url(resolve_url(settings)):
            return self.server
        return connect(
            settings,
            check=False,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=REACTOR_TIMEOUT,
            socket_connect_timeout=REACTOR_TIMEOUT,
        )

    # --- reading the key -----------------------------------------------------------
    def fetch_data(self, count: int) -> list[bytes]:
        """Pop up to ``count`` entries, atomically (each entry goes to one worker), without
        a claim (scrapy-redis's way: used on another scheduler, or when overridden).
        :class:`~redcrawl.errors.ConfigError` when the key can't be read as configured."""
        assert self.redis_key is not None
        return StartKey(self.server, self.redis_key, self._key_type).pop(count)

    def _claimer(self) -> str:
        """How this worker reads the key: ``claim`` (redcrawl's scheduler), ``pop`` (another
        scheduler, or an overridden ``fetch_data``) or ``none`` (the scheduler refused to
        start: the spider is closing, leave the entries where they are)."""
        if self._feeder is not None:
            return "claim"
        try:
            scheduler = lifecycle.scheduler_of(self.crawler)
        except (AttributeError, RuntimeError):  # no crawl running (Scrapy 2.19: no engine)
            scheduler = None
        if scheduler is None or not hasattr(scheduler, "feeder"):
            return "pop"
        if type(self).fetch_data is not RedisMixin.fetch_data:
            return "pop"
        if scheduler.feeder is None or scheduler.frontier is None:
            return "none"
        self._feeder, self._worker = scheduler.feeder, scheduler.worker
        self._frontier = scheduler.frontier
        return "claim"

    def _take(self, how: str, count: int) -> tuple[list[bytes], str]:
        """A batch and its claim field ("" when popped)."""
        if how == "pop":
            return self.fetch_data(count), ""
        self.recover_claims()
        field = self._retry_field or f"{self._worker}#{next(self._seq)}"
        self._retry_field = field  # until the claim's reply is here
        batch = self._start_key.claim(field, count)
        self._retry_field = None
        return batch, field

    def recover_claims(self, force: bool = False) -> int:
        """Give the claims of stopped workers back to the start key (at most every
        :data:`RECOVER_EVERY` seconds unless ``force``); returns how many entries went back.
        Notes whether live workers hold claims (the spider is not idle while they do)."""
        now = time.monotonic()
        if self._feeder is None or (now < self._next_recover and not force):
            return 0
        self._next_recover = now + RECOVER_EVERY
        owners = self._start_key.owners()
        if not any(w != self._worker for w in owners):
            self._claims_elsewhere = False
            return 0
        back, live = self._start_key.recover_stopped(self._worker, *self._heartbeats())
        self._claims_elsewhere = bool(live)
        if back:
            self.logger.warning(
                "Gave %d start entries back to %r: claimed by worker(s) that stopped "
                "before their requests were stored",
                back,
                self.redis_key,
            )
            self.crawler.stats.inc_value("redcrawl/start_entries/recovered", back)
        return back

    def _heartbeats(self) -> tuple[dict[str, float], float]:
        """The workers' heartbeat deadlines (as ``FrontierCore.workers``) and the server's
        clock, read in one round with the bounded client (on the reactor: not the
        scheduler's client, whose retries wait minutes while Redis is frozen). A Redis
        Cluster URL reads them through the frontier (its bounded client is
        ``self.server``, as unbounded)."""
        frontier = self._frontier
        client = self._reactor_client
        if client is self.server:
            return frontier.workers(), frontier.server_time()
        parts = getattr(frontier, "parts", None) or [frontier]
        with redis_errors("workers"):
            pipe = client.pipeline(transaction=False)
            for part in parts:
                pipe.hgetall(part.keys.workers)
            pipe.time()
            *raws, (sec, usec) = pipe.execute()
        return heartbeat_deadlines(raws), float(sec) + float(usec) / 1e6

    def _refuse(self, data: bytes, reason: str) -> str:
        """Log and count a refused entry; returns its record for the refused list."""
        self.logger.error("Skipping start entry %r from %r: %s", data[:200], self.redis_key, reason)
        self.crawler.stats.inc_value("redcrawl/start_entries/refused")
        if not self._told_refused:
            self._told_refused = True
            self.logger.warning(
                "Refused start entries are kept in the Redis list %r (newest first, the "
                "last %d): see them with `%s LRANGE %s 0 -1`, push fixed ones onto %r",
                self._start_key.refused,
                REFUSED_MAX,
                redis_cli_hint(self._rc_settings),
                self._start_key.refused,
                self.redis_key,
            )
        record = {
            "entry": data.decode("utf-8", "backslashreplace"),
            "reason": reason,
            "worker": self._worker,
            "time": round(time.time(), 3),
        }
        return json.dumps(record, ensure_ascii=False)

    def _batch_done(self, field: str, refused: list[str]) -> None:
        """Every request made from a batch went to the scheduler: clear its claim once
        they are stored (never waiting here), keeping the refused entries."""
        if not field:
            if refused:
                self._start_key.settle("", refused)
            return
        self._pending.append((field, self._feeder.generation(), refused))
        self._feeder.flush(0.0)  # store them now, not at the next tick (does not wait)
        self._settle_claims()

    def _settle_claims(self, force: bool = False) -> None:
        """Clear the claims of the batches whose requests are stored; look again in
        :data:`SETTLE_EVERY` seconds while some are not (one such call at a time). While
        Redis is not answering (the feeder stalled, or a start key call failed less than
        :data:`READ_AGAIN` seconds ago) nothing is sent unless ``force`` (at close): a
        call would block the reactor up to :data:`REACTOR_TIMEOUT` seconds each time. A
        failure is logged once per outage."""
        quiet = time.monotonic() < self._read_after or self._feeder.stalled_for() > 0
        try:
            while (
                self._pending
                and (force or not quiet)
                and self._feeder.stored_through(self._pending[0][1])
            ):
                field, _, refused = self._pending[0]
                self._start_key.settle(field, refused)
                self._pending.popleft()
                if self._settle_failing:
                    self._settle_failing = False
                    self.logger.info("Clearing start entries claims again")
        except RedcrawlError as exc:
            self._read_after = time.monotonic() + READ_AGAIN
            if not self._settle_failing:
                self._settle_failing = True
                self.logger.warning(
                    "Could not clear a start entries claim (%s); it is cleared when Redis "
                    "answers again",
                    exc.__cause__ or exc,
                )
        waiting = self._settle_call is not None and self._settle_call.active()
        if self._pending and not self._closing and not waiting:
            from twisted.internet import reactor

            self._settle_call = cast(Any, reactor).callLater(SETTLE_EVERY, self._settle_claims)

    def _spider_closed(self, spider: Any, reason: str = "") -> None:
        """The scheduler has stopped its I/O thread: clear the claims of what it stored;
        the others go back to the key once this worker's heartbeat is gone."""
        self._closing = True
        if self._settle_call is not None and self._settle_call.active():
            self._settle_call.cancel()
        if self._pending:
            self._settle_claims(force=True)
        if self._retry_field is not None:
            self._give_back_unanswered()
        if self._pending:
            self.logger.warning(
                "%d claimed batch(es) of start entries were not stored; they go back to %r "
                "for the next worker",
                len(self._pending),
                self.redis_key,
            )

    def _give_back_unanswered(self) -> None:
        """At close: the claim whose reply never came (it would have been sent again at
        the next read) goes back to the key now, not at another worker's recover pass
        (one bounded attempt; if it fails, that pass still gives it back)."""
        field, self._retry_field = self._retry_field, None
        assert field is not None
        try:
            if self._feeder.stalled_for() > 0:  # (it would wait 5 s more at close)
                raise RedcrawlError("Redis is not answering this worker")
            back = self._start_key.recover([field])
        except RedcrawlError as exc:
            self.logger.warning(
                "Could not give back the start entries of a claim whose reply never came "
                "(%s); they go back to %r once this worker's heartbeat is gone",
                exc.__cause__ or exc,
                self.redis_key,
            )
            return
        if back:
            self.logger.info(
                "Gave %d start entries back to %r: their claim's reply never came",
                back,
                self.redis_key,
            )
            self.crawler.stats.inc_value("redcrawl/start_entries/recovered", back)

    def next_requests(self) -> Iterator[Any]:
        if self._one_off is not None or self._refused or self._closing:
            return
        how = self._claimer()
        if how == "none":
            return
        if how == "claim" and (
            time.monotonic() < self._read_after or self._feeder.stalled_for() > 0
        ):
            return  # Redis is not answering this worker: read the entries when it does
        try:
            batch, field = self._take(how, self.redis_batch_size or 16)
        except ConfigError as exc:
            self._closing = True
            self.logger.error("Closing the spider: %s", exc)
            lifecycle.fail_process(self.crawler)  # scrapy crawl exits 1, not 0
            from twisted.internet import reactor

            # later, not from inside the engine's read of start requests (Scrapy 2.11
            # fails if the slot goes away while it iterates them)
            cast(Any, reactor).callLater(
                0, lifecycle.stop_crawler, self.crawler, "redcrawl_start_key"
            )
            return
        except RedcrawlError as exc:  # Redis away: the entries stay, read them when idle
            self._read_after = time.monotonic() + READ_AGAIN
            if not self._read_failing:  # once per outage, not at every idle look
                self._read_failing = True
                self.logger.warning(
                    "Could not read start entries from %r (%s); they stay in Redis and are "
                    "read when it answers again",
                    self.redis_key,
                    exc.__cause__ or exc,  # (not ConnectionLost's advice: the worker goes on)
                )
            return
        if self._read_failing:
            self._read_failing = False
            self.logger.info("Reading start entries from %r again", self.redis_key)
        refused: list[str] = []
        for data in batch:
            try:
                made = self.make_request_from_data(data)
            except (ValueError, TypeError, KeyError, UnicodeError) as exc:
                refused.append(self._refuse(data, str(exc)))
                continue
            if made is None:
                continue
            for request in [made] if isinstance(made, scrapy.Request) else made:
                if not isinstance(request, scrapy.Request):
                    yield request  # an overridden make_request_from_data's own output
                    continue
                problem = url_problem(request.url, self._schemes)
                if problem is not None:
                    hint = (
                        " (a spider allows more schemes with redis_start_url_schemes)"
                        if problem.startswith("it is not an absolute")
                        else ""
                    )
                    refused.append(self._refuse(data, f"URL {request.url!r}: {problem}{hint}"))
                    continue
                # the same whether read at start or when idle, as in scrapy-redis: not
                # a Scrapy start request (those are deduplicated by the scheduler)
                request.meta["is_start_request"] = False
                self.crawler.stats.inc_value("redcrawl/start_entries/accepted")
                yield request
        # here the engine asked for the next request: it passed every one of this batch
        # to the scheduler (Scrapy's crawl() enqueues at once)
        self._batch_done(field, refused)

    def make_request_from_data(
        self, data: bytes
    ) -> scrapy.Request | Iterable[scrapy.Request] | None:
        """A request from one entry: a plain URL, or a JSON object (module docs)."""
        text = data.decode("utf-8").strip()
        if not text:
            return None
        if not text.startswith("{"):
            return scrapy.Request(text, dont_filter=True)
        params = json.loads(text)
        if not isinstance(params, dict) or not params.get("url"):
            raise ValueError("a JSON start entry needs a non-empty 'url'")
        params = {k: v for k, v in params.items() if v is not None}  # null: not given
        _check_entry_types(params)
        kwargs: dict[str, Any] = {"dont_filter": params.get("dont_filter", True)}
        for name in ("meta", "priority", "method", "body", "headers", "cookies", "cb_kwargs"):
            if name in params:
                kwargs[name] = params[name]
        if "method" in kwargs:
            kwargs["method"] = str(kwargs["method"]).upper()
        for name in ("callback", "errback"):
            if params.get(name):
                kwargs[name] = self._entry_method(str(params[name]), name)
        formdata = params.get("formdata") or {
            k: v for k, v in params.items() if k not in _REQUEST_KEYS
        }
        if formdata:  # as scrapy-redis: GET with a query string unless a method is given
            kwargs.setdefault("method", "GET")
            return scrapy.FormRequest(params["url"], formdata=formdata, **kwargs)
        return scrapy.Request(params["url"], **kwargs)

    def _entry_method(self, name: str, what: str) -> Any:
        """A spider method named by a start entry: anyone who can write to the key picks
        it, so the rule of :mod:`redcrawl.callbacks` applies (public methods of the
        spider's own class, ``parse`` included)."""
        problem = callback_problem(self, name)
        method = resolve_callback(self, name) if problem is None else None
        if method is None:
            raise ValueError(
                f"{what} {problem or repr(name) + ' is not a method'}; a start "
                "entry may name only a public method of the spider's own class"
            )
        return method

    # --- feeding the engine -------------------------------------------------------
    async def start(self) -> AsyncIterator[Any]:
        for request in self.next_requests():
            yield request

    def start_requests(self) -> Iterator[scrapy.Request]:  # Scrapy < 2.13
        return self.next_requests()

    def schedule_next_requests(self) -> int:
        n = 0
        for request in self.next_requests():
            self.crawler.engine.crawl(request)
            n += 1
        if n and self._feeder is None:  # popped, not claimed: store them now
            scheduler = lifecycle.scheduler_of(self.crawler)
            flush = getattr(scheduler, "flush", None)
            if flush is not None:
                flush()  # into the frontier now: the entries are off the Redis key
        return n

    def _active(self, *args: Any, **kwargs: Any) -> None:
        self._idle_since = time.monotonic()

    def spider_idle(self) -> None:
        """Fetch more start URLs (first giving stopped workers' claims back); close only
        after ``max_idle_time`` seconds with neither new start URLs, nor responses, nor
        claims of live workers, i.e. since the crawl went quiet (0: never, scrapy-redis's
        default)."""
        if self._pending:
            self._settle_claims()
        if self.schedule_next_requests():
            self._idle_since = time.monotonic()
            raise DontCloseSpider
        if self._claims_elsewhere:  # another worker's entries are on their way
            self._idle_since = time.monotonic()
        idle = time.monotonic() - self._idle_since
        if self.max_idle_time and idle >= self.max_idle_time:
            return
        raise DontCloseSpider


class RedisSpider(RedisMixin, Spider):
    """A Spider whose start URLs come from Redis (``redis_key``)."""

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> RedisSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider._setup_or_refuse(crawler)
        return spider


class RedisCrawlSpider(RedisMixin, CrawlSpider):
    """A CrawlSpider (rules) whose start URLs come from Redis (``redis_key``)."""

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> RedisCrawlSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider._setup_or_refuse(crawler)
        return spider
