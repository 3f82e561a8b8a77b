"""The start window counts from the grant, not from the lease reply's arrival (issue 13).

A lease reply that sat in a socket or behind the GIL, or reached a frozen (SIGSTOPped,
descheduled) worker, arrives after its grant: the key's delay was charged at the grant,
and another worker may have been granted the key's next turn meanwhile, on time. Measured
from the arrival, such a request looked on time, started, and came closer than the delay
to that next start at the site (the fleet test under load: five hosts 0.168 s apart, 0.2 s
delay, all at once). Now each lease carries ``granted``, a lower bound of its grant time on
the worker's clock (:mod:`redcrawl.frontier.grant_clock`), and a request whose reply came
past its window is asked about (``FrontierCore.start_late``): it starts only if no other
grant or start of its key came since its own, else it is given back (no attempt spent).

A real Scheduler and Feeder (its I/O thread) against a real Redis; a slow reply is a
reply whose decoding waits (``FrontierCore._leases``, where the arrival is stamped)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import scrapy

from redcrawl.frontier import FrontierCore, Lease
from redcrawl.frontier.grant_clock import DRIFT, GrantClock

from .conftest import Clock, FrontierFactory
from .test_politeness_frontier import conserved, site
from .test_politeness_late_start import WINDOW, start_worker, wait_for

pytestmark = pytest.mark.backends("lists", "streams")

SLOW = 3 * WINDOW
"""How long a slow lease reply takes to reach the worker after its grant: past the
window."""


def slow_replies(
    f: FrontierCore, worker: str, meanwhile: Any = None
) -> tuple[threading.Event, list[Lease]]:
    """Make ``worker``'s lease replies that grant something reach it SLOW late (their
    decoding waits; ``meanwhile()`` runs during the first such wait); an event set and a
    list extended when one has arrived."""
    arrived = threading.Event()
    got: list[Lease] = []
    decode = f._leases

    def slow(w: str, raw: Sequence[Any], *args: Any) -> list[Lease]:
        if w == worker and len(raw or ()) >= 4:
            time.sleep(SLOW)
            if meanwhile is not None and not got:
                meanwhile()
        out = decode(w, raw, *args)
        if w == worker and out:
            got.extend(out)
            arrived.set()
        return out

    f._leases = slow  # type: ignore[method-assign, assignment]
    return arrived, got


def test_a_request_whose_reply_came_late_is_given_back_after_a_later_grant(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """The key's delay is known to the worker (DOWNLOAD_SLOTS): still, a request whose
    reply came late is not judged from its arrival; another worker was granted the key
    while the reply was on its way, so it is given back, served next, no attempt spent."""
    scheduler, f = start_worker(make_frontier, DOWNLOAD_SLOTS={"a.test": {"delay": 1.0}})
    assert scheduler.feeder is not None
    try:
        f.push(site("a.test", 3))

        def other_worker_granted() -> None:
            clock.advance(1.05)  # the key's next turn, on time
            assert len(f.lease("w2", 5)) == 1

        arrived, got = slow_replies(f, "w1", other_worker_granted)
        scheduler.feeder.held = 0
        assert scheduler.next_request() is None  # asks the I/O thread for a lease
        assert arrived.wait(5.0)
        (late,) = got
        assert late.received - late.granted >= SLOW
        assert scheduler.next_request() is None  # not started: asked about, refused
        wait_for(lambda: f.counts().ready == 2)  # given back (w2 holds one)
        scheduler._merge_stats()
        assert scheduler.stats.get_value("redcrawl/politeness/late_reply_checked") == 1
        assert scheduler.stats.get_value("redcrawl/politeness/late_released") == 1
        scheduler.feeder.stop(5.0)  # (so that w1 does not lease it again first)
        clock.advance(1.1)
        (again,) = f.lease("w3", 5)
        assert again.id == late.id and again.attempts == 1  # served next, no attempt spent
        conserved(f)
    finally:
        scheduler.feeder.stop(5.0)


def test_a_request_whose_reply_came_late_starts_when_nothing_came_since(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """Nothing else of its key was granted or started since its grant: it starts, its start
    charged now (the key's next grant a delay from now)."""
    scheduler, f = start_worker(make_frontier, DOWNLOAD_SLOTS={"a.test": {"delay": 1.0}})
    assert scheduler.feeder is not None
    try:
        f.push(site("a.test", 3))
        arrived, got = slow_replies(f, "w1", lambda: clock.advance(0.5))
        scheduler.feeder.held = 0
        assert scheduler.next_request() is None
        assert arrived.wait(5.0)
        request = wait_for(scheduler.next_request)
        assert isinstance(request, scrapy.Request) and request.url == got[0].envelope.url
        clock.advance(0.9)  # 1.4 s after the grant, 0.9 s after the start: still closed
        assert f.lease("w2", 5) == []
        clock.advance(0.2)
        assert len(f.lease("w2", 5)) == 1
        conserved(f)
    finally:
        scheduler.feeder.stop(5.0)


def test_a_crawl_whose_every_reply_is_slower_than_the_window_finishes(
    make_frontier: FrontierFactory,
) -> None:
    """Every lease reply takes longer than the start window (a slow link, a loaded
    machine): each request is asked about, none is given back for ever, the crawl ends
    with every request fetched once (the real clock; a 0.1 s delay)."""
    scheduler, f = start_worker(make_frontier, DOWNLOAD_SLOTS={"a.test": {"delay": 0.1}})
    assert scheduler.feeder is not None
    try:
        f._clock = None  # the server's clock: the delays pass by themselves
        f.push(site("a.test", 4))
        slow_replies(f, "w1")
        scheduler.feeder.held = 0
        scheduler.feeder.poll_interval = 0.05
        started: list[str] = []
        deadline = time.monotonic() + 20
        while len(started) < 4:
            assert time.monotonic() < deadline, f"stalled after {started}: {f.counts()}"
            request = scheduler.next_request()
            if request is None:
                time.sleep(0.01)
                continue
            started.append(request.url)
            scheduler._on_finished(request)  # fetched: acked
        assert sorted(started) == sorted(e.url for e in site("a.test", 4))
        assert scheduler.feeder.flush(5.0)
        wait_for(lambda: f.counts().done == 4)
        assert f.counts().dead == 0
        conserved(f)
    finally:
        scheduler.feeder.stop(5.0)


# --- the clock offset, alone -----------------------------------------------------------


def test_a_fast_call_bounds_the_offset_and_a_slow_reply_does_not_move_the_grant() -> None:
    clock = GrantClock()
    # server clock = local clock - 100 s; a call that ran 1 ms after it was sent
    assert clock.granted(10.0, (10.001 - 100) * 1000, 10.002) == pytest.approx(10.0)
    # granted at local 20.0, its reply read 0.5 s later: the grant time stays 20.0 at most
    got = clock.granted(19.9, (20.0 - 100) * 1000, 20.5)
    assert 19.99 <= got <= 20.0


def test_the_grant_is_never_put_before_the_call_was_sent_nor_known_without_a_bound() -> None:
    clock = GrantClock()
    assert clock.granted(5.0, None, 6.0) == 5.0  # a replayed call: only its send time
    assert clock.granted(0.0, None, 6.0) == 0.0  # nothing known
    assert clock.granted(0.0, 1000.0, 6.0) == 0.0  # no bound yet
    assert clock.granted(7.0, 2000.0, 7.5) == 7.0


def test_a_server_clock_stepping_forward_starts_the_bound_afresh() -> None:
    clock = GrantClock()
    clock.granted(10.0, 0.0, 10.001)  # offset in [10.0, 10.001]
    # the server's clock jumps 5 s ahead: offset now about 5.0; the old bound is too high
    got = clock.granted(11.0, 6000.0, 11.002)
    assert got == pytest.approx(11.0, abs=0.002)
    assert clock.offset is not None and clock.offset <= 5.0


def test_the_bound_decays_with_time_by_at_most_the_drift() -> None:
    clock = GrantClock()
    clock.granted(10.0, 0.0, 10.001)
    low = clock.offset
    assert low is not None
    # 100 s later, a slow call (its send 1 s before the server ran it)
    clock.granted(109.0, 100_000.0, 110.001)
    assert clock.offset == pytest.approx(low - DRIFT * 100, abs=1e-6)


# --- the grant time each lease carries -------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 3])
def test_every_lease_reply_carries_its_grant_time(
    make_frontier: FrontierFactory, partitions: int
) -> None:
    """lease(), settle(lease=...) and a pipelined settle: each lease's ``granted`` lies
    between the call's send and its reply (the server's own clock here)."""
    f = make_frontier(use_clock=False, partitions=partitions)
    f.push(site("a.test", 3) + site("b.test", 3) + site("c.test", 3))
    before = time.monotonic()
    got = f.lease("w1", 3)
    got += f.settle(lease=("w1", 3)).leases
    got += f.settle_begin(lease=("w1", 3)).result().leases
    after = time.monotonic()
    assert len(got) == 9
    for lease in got:
        assert before <= lease.granted <= after, (before, lease.granted, after)
        assert lease.granted <= lease.received
    conserved(f)
