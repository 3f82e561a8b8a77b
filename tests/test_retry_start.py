"""Scrapy's retries of a held request, spaced for the fleet (``FrontierCore.retry_start``,
``lua/retry_start.lua``): a retry keeps its lease and its slot, and its start is reserved
a delay after its key's last start; the key's next grant waits a delay after the retry.
Real Redis, the frontier's test clock. The worker's side (a retry held until its start)
is tests/test_trial12_messy_sites.py."""

from __future__ import annotations

import math

import pytest

from redcrawl.politeness.hosts import Hosts

from .conftest import Clock, FrontierFactory
from .test_robots import _polite, _site


@pytest.mark.backends("lists", "streams")
def test_a_retry_starts_a_delay_after_its_grant_and_the_next_grant_a_delay_after_it(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """DOWNLOAD_DELAY=1, concurrency 2: a request granted at 0 fails at 0.05 and Scrapy
    retries it. Its start is reserved at 1.0 (a delay after its grant), and the key's
    next grant at 2.0, not at 1.0, where a delay-spaced grant would otherwise come."""
    f = _polite(make_frontier, politeness_delay=1.0)
    f.push(_site("a.test", 3))
    (first,) = f.lease("w1", 10)
    clock.advance(0.05)
    (wait,) = f.retry_start([first])
    assert wait == pytest.approx(0.95, abs=0.002)
    clock.advance(0.95)  # the retry starts now
    assert f.lease("w2", 10) == []
    clock.advance(0.99)
    assert f.lease("w2", 10) == []
    clock.advance(0.02)
    assert len(f.lease("w2", 10)) == 1
    assert f.counts().conserved


@pytest.mark.backends("lists", "streams")
def test_a_second_retry_waits_a_delay_after_the_first(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """Two retries of the same request, each right after its failure: 1 s after the grant,
    then 1 s after the first retry's start."""
    f = _polite(make_frontier, politeness_delay=1.0)
    f.push(_site("a.test", 1))
    (first,) = f.lease("w1", 10)
    clock.advance(0.1)
    assert f.retry_start([first]) == [pytest.approx(0.9, abs=0.002)]
    clock.advance(0.9 + 0.1)
    assert f.retry_start([first]) == [pytest.approx(0.9, abs=0.002)]


@pytest.mark.backends("lists", "streams")
def test_without_a_delay_a_retry_starts_now_and_one_not_held_is_none(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = _polite(make_frontier)
    f.push(_site("a.test", 2))
    one, two = f.lease("w1", 10)
    assert f.retry_start([one]) == [0]
    assert f.release([two]) == 1
    assert f.retry_start([two, one]) == [None, 0]


@pytest.mark.backends("lists", "streams")
def test_without_politeness_nothing_is_spaced(make_frontier: FrontierFactory) -> None:
    f = make_frontier(politeness=False)
    f.push(_site("a.test", 1))
    (one,) = f.lease("w1", 10)
    assert f.retry_start([one]) == [None]


@pytest.mark.backends("lists", "streams")
def test_a_site_blocked_by_its_robots_txt_is_not_granted_and_its_waiters_are_refused(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """robots.txt answered 429 with Retry-After: 2 (``block_site``): the key is granted
    to no worker for 2 s, and a request granted before, waiting for that robots.txt, may
    not start (``start_late``: given back) until the block ends."""
    f = _polite(make_frontier)
    f.push(_site("a.test", 3))
    (waiter, _) = f.lease("w1", 2)
    f.block_site("a.test", 2.0)
    assert f.start_late([waiter]) == [False]
    assert f.release([waiter]) == 1
    clock.advance(1.9)
    assert f.lease("w2", 10) == []
    clock.advance(0.2)
    assert len(f.lease("w2", 10)) == 1  # (the other slot is w1's second request's)
    assert f.counts().conserved


@pytest.mark.backends("lists", "streams")
def test_a_retry_of_a_paused_key_is_given_back_not_started(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """An operator paused the key (``redcrawl hosts set KEY --pause``: no new fetches at
    that site, say because it answers 500s) while one of its requests was in a worker,
    and Scrapy then retries that request: its start is not reserved; the worker must give
    it back (``inf``: served again once the key is resumed)."""
    f = _polite(make_frontier)
    f.push(_site("a.test", 1))
    (first,) = f.lease("w1", 10)
    Hosts(f).set("a.test", paused=True)
    assert f.retry_start([first]) == [math.inf]
    assert f.release([first]) == 1
    assert f.lease("w2", 10) == []
    Hosts(f).set("a.test", paused=False)
    assert len(f.lease("w2", 10)) == 1
    assert f.counts().conserved


@pytest.mark.backends("lists", "streams")
def test_a_late_start_of_a_paused_or_operator_blocked_key_is_refused(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """A request that waited in its worker (for robots.txt) asks to start late
    (``start_late``) after an operator paused or blocked its key: refused (given back),
    as a 429's block refuses it."""
    f = _polite(make_frontier)
    f.push(_site("a.test", 1) + _site("b.test", 1))
    a, b = f.lease("w1", 10)
    hosts = Hosts(f)
    hosts.set("a.test", paused=True)
    hosts.set("b.test", block_for=60)
    assert f.start_late([a, b]) == [False, False]
    hosts.set("a.test", paused=False)
    hosts.set("b.test", block_until=None)
    assert f.start_late([a, b]) == [True, True]


@pytest.mark.backends("lists", "streams")
def test_a_late_start_of_a_request_no_longer_held_is_refused(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """A request that waited in its worker (for robots.txt) while the fleet took its lease
    back (the worker frozen or cut off longer than its lease) asks to start late: refused
    (review 35: it was told to start, and fetched beside the request's new holder)."""
    f = _polite(make_frontier)
    f.push(_site("a.test", 1))
    (waiter,) = f.lease("w1", 10)
    assert f.release_worker("w1") == 1
    assert f.start_late([waiter]) == [False]
    (again,) = f.lease("w2", 10)
    assert f.start_late([again]) == [True]
