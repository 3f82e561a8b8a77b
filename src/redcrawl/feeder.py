# Over 450 lines on purpose: one class, the worker's Redis I/O thread, every error path in one loop.
"""A worker's Redis I/O on a thread of its own, off the caller's (Scrapy's reactor) thread.

The caller (the Scrapy scheduler) only touches local buffers, under one lock, and never
waits on Redis:

* :meth:`Feeder.take` pops a leased request from the ready buffer (or returns None and
  asks the thread for more);
* :meth:`Feeder.store`, :meth:`Feeder.ack` and :meth:`Feeder.nack` append to buffers
  the thread flushes.

The I/O thread loops: it takes everything buffered at once and sends it in one
:meth:`~redcrawl.frontier.FrontierCore.settle` (store the children, then ack the
parents, then lease more: children are always stored before their parent's ack, since a
parent finishes after its children were buffered), then the nacks, then the heartbeat
and, every ``tick``, the crawl-wide counts (the caller's view of "is the crawl
finished?"). Stores and acks wait for the next lease call, or a full batch, or the tick:
a tick sends them only if no settle call went out since the tick before (so they wait
two ticks at most), and :meth:`Feeder.flush` at once; every settle call costs Redis a
fixed amount whatever it carries. A call Redis refused puts what it carried back in
front of the buffers.

During an outage the thread is blocked in redis-py's retries (which resend the same
call, so a lease call's nonce still returns the first execution's outcome) while the
caller goes on with what it holds. :meth:`Feeder.stalled_for` tells how long Redis has
not answered: the caller decides when to give up (``REDCRAWL_REDIS_OUTAGE_LIMIT``).

With fleet-wide politeness (``polite``) a worker always leases only what it can start now.

Orphan leases: the thread keeps the tokens of every lease it holds (from the settle reply
that brought it until the call that gives it back: ack, nack, deferral, release), and
every ``disown_every`` heartbeats, or at a heartbeat after asking for leases and getting
none, it calls :meth:`~redcrawl.frontier.FrontierCore.disown` with them: leases Redis has
under this worker's name that it does not hold (an ack undone by a failover to a lagging
replica, a lease reply lost on the way) go back to READY, counted as ``orphaned``. The
thread is the worker's only caller and waits for each reply, so no lease is on its way to
it while that runs (docs/cluster.md, "Durability").

How much is leased: ``prefetch`` at a time, keeping ``prefetch * lookahead`` ready ahead
of the caller's demand, within ``prefetch * (1 + lookahead) + concurrency`` held in all.
A full batch of ``prefetch`` is waited for while more than half the lookahead is ready
(when the caller holds more than ``concurrency``, e.g. responses waiting for their
callbacks, a batch fits later; leasing the few that fit at once made a call every few
requests).
At the tail of a crawl (the crawl-wide ready count below ``prefetch * (1 + lookahead)``,
the most one worker keeps ahead, so what it gives back never makes it lease a full batch
again) a worker leases only what it can start now, and while the crawl has nothing else
ready and other workers are there, it gives back (release: served next, not counted as
an attempt) the leases it holds beyond that, so that they get them instead of waiting.

No Scrapy here: tests/test_feeder.py drives it against a real Redis.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from redcrawl.errors import ConnectionError_, RedcrawlError

if TYPE_CHECKING:
    from redcrawl.codec import Envelope
    from redcrawl.frontier import Counts, FrontierCore, Lease

__all__ = ["Feeder"]

log = logging.getLogger(__name__)


class Feeder:
    """Leases, stores and acknowledges for one worker on a thread of its own."""

    def __init__(
        self,
        frontier: FrontierCore,
        worker: str,
        *,
        prefetch: int = 16,
        lookahead: int = 2,
        concurrency: int = 16,
        batch_size: int = 100,
        heartbeat: float = 20.0,
        poll_interval: float = 0.5,
        tick: float = 1.0,
        on_ready: Callable[[], None] | None = None,
        on_tick: Callable[[], None] | None = None,
        polite: bool = False,
        disown_every: int = 3,
    ) -> None:
        self.frontier = frontier
        self.worker = worker
        self.prefetch = prefetch
        self.lookahead = lookahead
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.heartbeat = heartbeat
        self.poll_interval = poll_interval
        self.tick = tick
        self.on_ready = on_ready
        """Called (on the I/O thread) when leases arrive."""
        self.on_tick = on_tick
        """Called on the I/O thread every ``tick`` (e.g. a memory check)."""
        self.ahead = prefetch * (1 + lookahead)
        self.low = prefetch * lookahead // 2
        """While more than this many are ready, lease only full batches of ``prefetch``
        (not a few at a time as requests in progress finish): fewer, fuller calls."""
        """The most leases kept ahead of the caller; also the tail mark: while the crawl
        has fewer ready, lease only what can start now and give back the rest."""
        self.held = 0
        """Requests the caller holds (handed out, not finished): set by the caller."""
        self.polite = polite
        """The frontier enforces fleet-wide politeness: a lease holds its key's slot and
        its delay was charged when it was granted, so lease only what can start now
        (as at the tail of a crawl), never ahead: a request waiting in this buffer would
        hold a site's slot idle and start later than its turn."""

        self.disown_every = disown_every
        """Heartbeats between calls of ``FrontierCore.disown`` (0: never), sooner after a
        lease call that got nothing."""

        self._cond = threading.Condition()
        self._ready: deque[Lease] = deque()
        self._push: list[Envelope] = []
        self._acks: list[Lease] = []
        self._nacks: list[tuple[Lease, str, bool]] = []
        self._releases: list[Lease] = []
        self._frees: list[tuple[Lease, str]] = []  # slots back at response time
        self._defers: list[tuple[Lease, str, float | None]] = []  # 429/503 pushed back
        self._starts: list[Lease] = []  # late starts to ask the frontier about
        # Scrapy's retries of held requests, to get a start reserved (retry_start)
        self._retries: list[tuple[Lease, Callable[[float | None], None], bool]] = []
        self._stats: dict[str, int] = {}
        self._crawl_stats: dict[str, int] = {}
        self._gen = 0  # local changes (store/ack/nack) so far
        self._counts: Counts | None = None
        self._counts_gen = -1  # the local changes the counts were read after
        self._settled_gen = 0  # the local changes sent to Redis
        self._others = 0  # other workers of the crawl (heartbeats)
        self._demand = False  # take() found nothing
        self._refresh = False  # counts wanted now
        self._next_lease = 0.0  # nothing was ready: don't ask before this
        self._last_settle = -1e9  # when the last settle call went out (I/O thread)
        self._call_since: float | None = None
        self._failing_since: float | None = None
        self._owned: Counter[str] = Counter()  # tokens of the leases held (I/O thread)
        self._beats = 0  # heartbeats since the last disown
        self._starved = False  # a lease call got nothing since the last heartbeat
        self._stop = False
        self._closed = False
        self._stop_sent = False  # the stop's round (stores, acks, releases) reached Redis
        self.error: BaseException | None = None
        """A fatal error of the thread (Redis refused a call): the caller should stop."""
        self._thread = threading.Thread(target=self._run, name=f"redcrawl-io {worker}", daemon=True)

    # --- the caller's side (never waits on Redis) ---------------------------------------
    def start(self) -> None:
        self._thread.start()

    def take(self) -> Lease | None:
        """A leased request, or None (then the thread leases more, and calls
        ``on_ready`` when it has some)."""
        with self._cond:
            if self._ready:
                lease = self._ready.popleft()
                if len(self._ready) <= self.prefetch * self.lookahead:
                    self._cond.notify_all()
                return lease
            self._demand = True
            self._cond.notify_all()
            return None

    def store(self, envelope: Envelope) -> None:
        """Store a request (a child) before any ack buffered after it."""
        with self._cond:
            self._push.append(envelope)
            self._gen += 1
            if len(self._push) >= self.batch_size:
                self._cond.notify_all()

    def ack(self, lease: Lease) -> None:
        with self._cond:
            self._acks.append(lease)
            self._gen += 1
            if len(self._acks) >= self.batch_size:
                self._cond.notify_all()

    def nack(self, lease: Lease, error: str, *, retry: bool = True) -> None:
        """A failed attempt (after the requests stored before it)."""
        with self._cond:
            self._nacks.append((lease, error, retry))
            self._gen += 1
            self._cond.notify_all()

    def free(self, lease: Lease, outcome: str) -> None:
        """Its response arrived: give its politeness slot back now, in the next call
        (``FrontierCore.free``; the request stays leased until its ack)."""
        with self._cond:
            self._frees.append((lease, outcome))
            self._cond.notify_all()

    def poke(self) -> None:
        """Lease now if there is room (not at the next poll): e.g. a slot went back and
        the caller can start a request at once."""
        with self._cond:
            self._next_lease = 0.0
            self._cond.notify_all()

    def defer(self, lease: Lease, reason: str, retry_after: float | None) -> None:
        """The site pushed back: ``FrontierCore.defer`` (served later, key blocked)."""
        with self._cond:
            self._defers.append((lease, reason, retry_after))
            self._gen += 1
            self._cond.notify_all()

    def check_start(self, leases: list[Lease]) -> None:
        """Leases that waited here past their start window, of keys whose delay the
        caller cannot see (an operator's override): the thread asks the frontier
        (``FrontierCore.start_late``); each that may start comes back to the front of
        the ready buffer with no arrival or grant time (so it is not checked twice) and
        ``on_ready`` is called; the others are given back (release), counted as
        ``late_released``. Also leases whose reply reached this worker past their start
        window (``Lease.granted``), whatever their key."""
        with self._cond:
            self._starts += leases
            self._gen += 1
            self._cond.notify_all()

    def retry_start(
        self, lease: Lease, done: Callable[[float | None], None], *, check: bool = False
    ) -> None:
        """A held request is fetched again by Scrapy's RetryMiddleware: the thread asks the
        frontier for its start (``FrontierCore.retry_start``; ``check``: whether the start
        reserved before may be taken now) and calls ``done`` with the seconds to wait
        (None: no longer held, or nothing to space; inf: give it back), on this thread.
        Kept while Redis does not answer; dropped when the feeder stops (the caller gives
        the lease back)."""
        with self._cond:
            self._retries.append((lease, done, check))
            self._cond.notify_all()

    def release(self, leases: list[Lease]) -> None:
        """Give leases back unprocessed (served next, not counted as an attempt)."""
        with self._cond:
            self._releases += leases
            self._gen += 1
            self._cond.notify_all()

    def add_stats(self, **deltas: int) -> None:
        """Crawl-wide counters, added with the next heartbeat."""
        with self._cond:
            for name, n in deltas.items():
                self._crawl_stats[name] = self._crawl_stats.get(name, 0) + n

    def flush(self, wait: float = 0.0) -> bool:
        """Send what is buffered now (not at the next tick); with ``wait``, wait up to
        that many seconds for it to be stored. Returns whether it was."""
        deadline = time.monotonic() + wait
        with self._cond:
            gen = self._gen
            self._refresh = True
            self._cond.notify_all()
            while self._settled_gen < gen:
                left = deadline - time.monotonic()
                if left <= 0 or self.error is not None or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
            return True

    def generation(self) -> int:
        """How many local changes (store, ack, nack, ...) were buffered so far: with
        :meth:`stored_through`, a caller learns without waiting when what it buffered
        up to now is in Redis."""
        with self._cond:
            return self._gen

    def stored_through(self, generation: int) -> bool:
        """Whether every change up to ``generation`` (:meth:`generation`) was sent to
        Redis (never waits: :meth:`flush` waits)."""
        with self._cond:
            return self._settled_gen >= generation

    def busy(self) -> bool:
        """Whether anything local is not settled yet (buffered, or a call on its way)."""
        with self._cond:
            return bool(
                self._ready
                or self._push
                or self._acks
                or self._nacks
                or self._releases
                or self._frees
                or self._defers
                or self._starts
                or self._retries
                or self._call_since is not None
            )

    def crawl_counts(self, refresh: bool = False) -> Counts | None:
        """The crawl-wide counts as last read, if read after everything this worker did
        was settled; None otherwise (then the caller can't know the crawl is finished).
        ``refresh`` asks the thread to read them again now."""
        with self._cond:
            if refresh:
                self._refresh = True
                self._cond.notify_all()
            if self._counts_gen != self._gen or self._ready or self._push or self._acks:
                return None
            return self._counts

    def stats(self) -> dict[str, int]:
        """Counters since the last call (stored, filtered, acked, leased, ...)."""
        with self._cond:
            out, self._stats = self._stats, {}
            return out

    def stalled_for(self) -> float:
        """Seconds Redis has not answered this worker (0 while it does)."""
        since = self._failing_since or self._call_since
        if since is None:
            return 0.0
        elapsed = time.monotonic() - since
        return elapsed if elapsed > 1.0 else 0.0

    def stop(self, timeout: float) -> bool:
        """Flush what is buffered, give back what is leased and not started, then end
        the thread. Returns False if that did not finish within ``timeout`` seconds
        (Redis gone): what is left comes back by lease expiry."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive() and self._closed

    def stop_sent(self) -> bool:
        """Whether the stop's round (what was buffered, the leases given back) reached
        Redis, even if :meth:`stop` returned False because what follows it (the last
        heartbeat, the counters) did not finish in time."""
        with self._cond:
            return self._stop_sent

    # --- the I/O thread -----------------------------------------------------------------
    def _inc(self, name: str, n: int = 1) -> None:
        if n:
            self._stats[name] = self._stats.get(name, 0) + n

    def _lease_size(self, now: float) -> int:
        """How many to lease now (called under the lock)."""
        if self._stop or (now < self._next_lease and not self._push):
            return 0
        ready = len(self._ready)
        if ready > self.prefetch * self.lookahead or (ready and not self.lookahead):
            return 0
        if not self._demand and ready == 0 and self.held >= self.concurrency:
            return 0
        room = self.ahead + self.concurrency - self.held - ready
        n = min(self.prefetch, room)
        if self.polite or (self._counts is not None and self._counts.ready < self.ahead):
            # the tail of the crawl: only what can start now (one if the caller asks)
            free = self.concurrency - self.held - ready
            n = min(n, free if free > 0 else int(self._demand and not ready))
        elif n < self.prefetch and ready > self.low:
            # a full batch does not fit yet and enough is ready: wait until one does
            # (each call costs Redis a fixed amount, whatever it carries)
            return 0
        return max(n, 0)

    def _excess(self) -> list[Lease]:
        """Leases held beyond what can start now while the crawl has nothing else ready
        (called under the lock): to give back."""
        if self._counts is None or self._counts.ready or self._stop or not self._others:
            return []
        keep = max(1, self.concurrency - self.held)
        out: list[Lease] = []
        while len(self._ready) > keep:
            out.append(self._ready.pop())
        return out

    def _due(self, now: float, next_beat: float, next_tick: float) -> bool:
        return bool(
            self._stop
            or self._refresh
            or self._nacks
            or self._releases
            or self._frees
            or self._defers
            or self._starts
            or self._retries
            or len(self._push) >= self.batch_size
            or len(self._acks) >= self.batch_size
            or now >= next_beat
            or now >= next_tick
            or self._lease_size(now) > 0
        )

    def _hold_back(self, now: float, stopping: bool) -> bool:
        """Whether this round leaves the buffered stores and acks for a later one (called
        under the lock): a round woken by the tick alone, when a settle call went out
        within the last tick (the next lease call carries them; else the next tick
        does, so they wait two ticks at most) and nothing else is buffered. Not with
        fleet-wide politeness: there every response's slot goes back with a call of its
        own, which carries them anyway, and a request acked later is one more whose lease
        a SIGKILL leaves to expire (its refetch counts against its site)."""
        return bool(
            not (stopping or self._refresh or self.polite)
            and now - self._last_settle < self.tick
            and (self._push or self._acks)
            and len(self._push) < self.batch_size
            and len(self._acks) < self.batch_size
            and not (self._nacks or self._releases or self._frees or self._defers)
            and not self._starts
            and self._lease_size(now) == 0
        )

    def _run(self) -> None:  # noqa: C901 (the I/O thread's loop: its error handling in one place)
        now = time.monotonic()
        next_beat, next_tick = now + self.heartbeat, now + self.tick
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._due(now, next_beat, next_tick):
                        break
                    wake = min(next_beat, next_tick)
                    if self._next_lease > now and (self._demand or not self._ready):
                        wake = min(wake, self._next_lease)
                    self._cond.wait(max(0.0, wake - now))
                stopping = self._stop
                tick = now >= next_tick or self._refresh or stopping
                beat = now >= next_beat or stopping
                hold = self._hold_back(now, stopping)
                self._refresh = False
                push, acks, nacks = self._push, self._acks, self._nacks
                if hold:  # (a settle call went out since the last tick: they wait for the next)
                    push, acks = [], []
                else:
                    self._push, self._acks = [], []
                self._nacks = []
                frees, defers, starts = self._frees, self._defers, self._starts
                self._frees, self._defers, self._starts = [], [], []
                retries, self._retries = ([] if stopping else self._retries), []
                releases = self._releases + self._excess()
                self._releases = []
                if stopping:
                    releases += starts + list(self._ready)
                    starts = []
                    self._ready.clear()
                # (leases being checked come back to the ready buffer, or go back)
                n = max(self._lease_size(now) - len(starts), 0)
                if n and self._ready:
                    self._inc("lookahead_calls")
                gen = self._settled_gen if hold else self._gen
                self._call_since = now
            try:
                self._step(push, acks, nacks, releases, n, now, frees, defers, starts)
                if retries:
                    waits = self.frontier.retry_start(
                        [lease for lease, _, _ in retries], [c for _, _, c in retries]
                    )
                    for (_, done, _), wait in zip(retries, waits, strict=True):
                        done(wait)
                    retries = []
                if stopping:
                    with self._cond:
                        self._stop_sent = True
                if beat:
                    self._beat()
                    next_beat = time.monotonic() + self.heartbeat
                    if not stopping:
                        self._disown()
                if tick:
                    counts = self.frontier.counts()
                    others = sum(1 for w in self.frontier.workers() if w != self.worker)
                    with self._cond:
                        self._counts, self._counts_gen = counts, gen
                        self._others = others
                    if self.on_tick is not None:
                        self.on_tick()
                    next_tick = time.monotonic() + self.tick
            except ConnectionError_ as exc:
                # redis-py gave up retrying: keep everything, try again in a moment
                with self._cond:
                    self._retries[:0] = retries
                    if self._failing_since is None:
                        self._failing_since = self._call_since
                        # (the caller says it to its user: see stalled_for())
                        log.debug(
                            "redcrawl: Redis is not answering (%s); this worker goes "
                            "on with what it holds and keeps trying",
                            exc,
                        )
                    self._call_since = None
                    self._cond.wait(1.0)
                continue
            except RedcrawlError as exc:
                # (the caller says it to its user: see error)
                log.debug("redcrawl: Redis refused a call of worker %s: %s", self.worker, exc)
                with self._cond:
                    self.error = exc
                    self._call_since = None
                if self.on_ready is not None:
                    self.on_ready()  # so that the caller notices
                return
            with self._cond:
                self._settled_gen = gen
                self._cond.notify_all()
                if self._failing_since is not None:
                    log.debug(
                        "redcrawl: Redis answers again after %.1f s",
                        time.monotonic() - self._failing_since,
                    )
                self._failing_since = self._call_since = None
                if stopping:
                    self._closed = True
                    return

    def _step(
        self,
        push: list[Envelope],
        acks: list[Lease],
        nacks: list[tuple[Lease, str, bool]],
        releases: list[Lease],
        n: int,
        now: float,
        frees: list[tuple[Lease, str]] | None = None,
        defers: list[tuple[Lease, str, float | None]] | None = None,
        starts: list[Lease] | None = None,
    ) -> None:
        """One round: late starts checked, deferrals, settle (store, ack, free slots, lease
        n), then nacks and releases. What did not go out is put back in front of the
        buffers (and the error propagates)."""
        f = self.frontier
        frees, defers, starts = frees or [], defers or [], starts or []
        try:
            if starts:
                flags = f.start_late(starts)
                go = [
                    dataclasses.replace(lease, received=0.0, granted=0.0)
                    for lease, ok in zip(starts, flags, strict=True)
                    if ok
                ]
                back = [lease for lease, ok in zip(starts, flags, strict=True) if not ok]
                starts = []
                releases = back + releases
                with self._cond:
                    self._ready.extendleft(reversed(go))
                    self._inc("late_released", len(back))
                if go and self.on_ready is not None:
                    self.on_ready()
            # a site pushing back is blocked before this round's lease (else the lease
            # could grant the site again before its block is set)
            while defers:
                lease, reason, retry_after = defers[0]
                self._inc(f"defer_{f.defer(lease, reason, retry_after=retry_after)}")
                self._let_go([lease])
                defers.pop(0)
            if push or acks or n or frees:
                out = f.settle(
                    push=push, ack=acks, lease=(self.worker, n) if n else None, free=frees
                )
                frees = []
                self._last_settle = time.monotonic()
                self._inc("settle_calls")
                self._inc("lease_calls", int(n > 0))
                self._let_go(acks)
                self._hold(out.leases)
                if n and not out.leases:
                    self._starved = True
                self._account(
                    out.pushed.accepted,
                    out.pushed.filtered,
                    out.acked,
                    len(acks) - out.acked,
                    len(out.leases),
                    n,
                    now,
                )
                if self.polite and n and not out.leases:
                    # every site with ready work is busy or waiting for its delay: ask
                    # again when the first one opens, if that is before the next poll
                    opens = f.next_open()
                    if opens is not None:
                        with self._cond:
                            self._next_lease = min(self._next_lease, now + max(opens, 0.005))
                push, acks = [], []
                with self._cond:
                    self._ready.extend(out.leases)
                    if out.leases:
                        self._demand = False
                # the caller is told whenever leases arrive (not only when it found none):
                # with fleet-wide politeness a request's delay was charged when it was
                # granted, so it should reach the downloader without waiting for the
                # engine's next look
                if out.leases and self.on_ready is not None:
                    self.on_ready()
            while nacks:
                lease, error, retry = nacks[0]
                self._inc(f"nack_{f.nack(lease, error, retry=retry)}")
                self._let_go([lease])
                nacks.pop(0)
            if releases:
                self._inc("released", f.release(releases))
                self._let_go(releases)
                releases = []
        finally:
            if push or acks or nacks or releases or frees or defers or starts:
                with self._cond:
                    self._starts[:0] = starts
                    self._push[:0] = push
                    self._acks[:0] = acks
                    self._nacks[:0] = nacks
                    self._releases[:0] = releases
                    self._frees[:0] = frees
                    self._defers[:0] = defers

    def _account(
        self,
        accepted: int,
        filtered: int,
        acked: int,
        stale: int,
        leased: int,
        asked: int,
        now: float,
    ) -> None:
        with self._cond:
            self._inc("stored", accepted)
            self._inc("filtered_remote", filtered)
            self._inc("acked", acked)
            self._inc("stale_acks", stale)
            self._inc("leased", leased)
            if asked and leased == 0:
                self._next_lease = now + self.poll_interval
            elif accepted or leased:
                self._next_lease = 0.0

    def _hold(self, leases: list[Lease]) -> None:
        """Leases that reached this worker (I/O thread)."""
        self._owned.update(lease.token for lease in leases)

    def _let_go(self, leases: list[Lease]) -> None:
        """Leases given back by a call that returned (I/O thread)."""
        for lease in leases:
            left = self._owned[lease.token] - 1
            if left > 0:
                self._owned[lease.token] = left
            else:
                self._owned.pop(lease.token, None)

    def _disown(self) -> None:
        """After a heartbeat: every ``disown_every`` of them, or sooner when a lease call
        got nothing, take back the leases Redis has under this worker's name that it does
        not hold (their acks undone by a failover; see the module docstring)."""
        if not self.disown_every:
            return
        self._beats += 1
        if self._beats < self.disown_every and not self._starved:
            return
        self._beats, self._starved = 0, False
        n = self.frontier.disown(self.worker, list(self._owned))
        if n:
            log.warning(
                "redcrawl: took back %d request(s) leased to worker %s that it does not "
                "hold (acks undone by a failover to a lagging replica?)",
                n,
                self.worker,
            )
            with self._cond:
                self._inc("orphaned", n)

    def _beat(self) -> None:
        """Heartbeat: this worker and its leases live on; crawl-wide counters added."""
        self.frontier.renew(self.worker)
        with self._cond:
            deltas, self._crawl_stats = self._crawl_stats, {}
        if deltas:
            try:
                self.frontier.add_stats(**deltas)
            except BaseException:
                with self._cond:
                    for name, k in deltas.items():
                        self._crawl_stats[name] = self._crawl_stats.get(name, 0) + k
                raise
