"""The start window for keys whose delay a worker cannot see: an operator's delay override
(``redcrawl hosts set KEY --delay``, the hosts API's PUT) on a crawl whose DOWNLOAD_DELAY
is 0. A granted request that waited in the worker past REDCRAWL_POLITENESS_START_WINDOW
is not started blindly: the worker asks the frontier (``FrontierCore.start_late``, on its
I/O thread), which lets it start (its start charged) unless another grant of its key came
after it within the delay; then it is given back (served next, no attempt spent).

A real Scheduler and Feeder (its I/O thread) against a real Redis; the frontier on the
test clock, so the key's delay holds for as long as the test needs."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from scrapy import Spider
from scrapy.utils.test import get_crawler

from redcrawl.feeder import Feeder
from redcrawl.frontier import FrontierCore, Lease
from redcrawl.scrapy import Scheduler

from .conftest import Clock, FrontierFactory
from .test_politeness_frontier import conserved, polite, site

pytestmark = pytest.mark.backends("lists")

WINDOW = 0.03


def wait_for(check: Callable[[], object], timeout: float = 5.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("timed out")


def start_worker(
    make_frontier: FrontierFactory, **scrapy_settings: object
) -> tuple[Scheduler, FrontierCore]:
    """A Scheduler on a crawl with politeness and no DOWNLOAD_DELAY, its Feeder's thread
    running (it leases nothing by itself until the scheduler finds nothing to hand out;
    the test hands it a lease)."""
    crawler = get_crawler(Spider, {"REDCRAWL_POLITENESS_START_WINDOW": WINDOW, **scrapy_settings})
    scheduler = Scheduler.from_crawler(crawler)
    assert isinstance(scheduler, Scheduler)
    f = polite(
        make_frontier,
        politeness_concurrency=2,
        politeness_start_window=WINDOW,
        politeness_slots=scheduler.settings.politeness_slots,
    )
    scheduler.frontier = f
    scheduler.spider = Spider(name="late")
    scheduler._polite = True
    scheduler.feeder = Feeder(f, "w1", concurrency=1, polite=True, poll_interval=60.0)
    scheduler.feeder.held = 1  # as if busy: it leases only when next_request finds nothing
    scheduler.feeder.start()
    return scheduler, f


@pytest.fixture
def worker(make_frontier: FrontierFactory) -> Iterator[tuple[Scheduler, FrontierCore]]:
    scheduler, f = start_worker(make_frontier)
    yield scheduler, f
    assert scheduler.feeder is not None
    scheduler.feeder.stop(5.0)


def late_lease(f: FrontierCore, worker: str) -> Lease:
    """A lease of w1 as its I/O thread would have received it, a second ago."""
    (lease,) = f.lease(worker, 1)
    return dataclasses.replace(lease, received=time.monotonic() - 1.0)


def hand_to_feeder(scheduler: Scheduler, lease: Lease) -> None:
    assert scheduler.feeder is not None
    with scheduler.feeder._cond:
        scheduler.feeder._ready.append(lease)


def test_a_late_request_of_a_key_with_an_operator_delay_is_given_back_after_a_later_grant(
    worker: tuple[Scheduler, FrontierCore], clock: Clock
) -> None:
    scheduler, f = worker
    f.push(site("a.test", 3))
    f.client.hset(f.keys.pol_override, "a.test", json.dumps({"delay": 1.0}))
    first = late_lease(f, scheduler.worker)
    clock.advance(1.05)
    assert len(f.lease("w2", 5)) == 1  # another worker's grant, after the delay: it may
    hand_to_feeder(scheduler, first)  # have started already, so first must not start now
    assert scheduler.next_request() is None
    wait_for(lambda: f.counts().ready == 2)  # given back, served next
    assert scheduler.next_request() is None  # (a.test is closed: the test clock stands)
    scheduler._merge_stats()
    assert scheduler.stats.get_value("redcrawl/politeness/late_released") == 1
    conserved(f)


def test_a_late_request_with_no_start_since_its_grant_starts_and_is_charged(
    worker: tuple[Scheduler, FrontierCore], clock: Clock
) -> None:
    scheduler, f = worker
    f.push(site("a.test", 3))
    f.client.hset(f.keys.pol_override, "a.test", json.dumps({"delay": 1.0}))
    first = late_lease(f, scheduler.worker)
    clock.advance(0.5)
    hand_to_feeder(scheduler, first)
    request = wait_for(scheduler.next_request)
    assert request.url == first.envelope.url  # type: ignore[attr-defined]
    # its start was charged now: the next grant of a.test waits the delay from now
    clock.advance(0.9)
    assert f.lease("w2", 5) == []
    clock.advance(0.2)
    assert len(f.lease("w2", 5)) == 1
    conserved(f)


def test_a_late_request_of_a_key_without_any_delay_starts(
    worker: tuple[Scheduler, FrontierCore],
) -> None:
    scheduler, f = worker
    f.push(site("a.test", 3))
    first = late_lease(f, scheduler.worker)
    assert len(f.lease("w2", 5)) == 1  # granted after it: no delay, nothing to keep
    hand_to_feeder(scheduler, first)
    request = wait_for(scheduler.next_request)
    assert request.url == first.envelope.url  # type: ignore[attr-defined]
    conserved(f)


def test_a_late_request_of_a_download_slots_key_is_given_back_without_asking(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """DOWNLOAD_SLOTS delays are known to the worker: a late request of such a key is
    given back at once, without asking the frontier."""
    scheduler, f = start_worker(make_frontier, DOWNLOAD_SLOTS={"a.test": {"delay": 1.0}})
    try:
        f.push(site("a.test", 2))
        first = late_lease(f, scheduler.worker)
        hand_to_feeder(scheduler, first)
        calls: list[int] = []
        start_late = f.start_late

        def counted(leases: Sequence[Lease]) -> list[bool]:
            calls.append(len(leases))
            return start_late(leases)

        f.start_late = counted  # type: ignore[method-assign]
        assert scheduler.next_request() is None
        assert scheduler.stats.get_value("redcrawl/politeness/late_released") == 1
        wait_for(lambda: f.counts().ready == 2)
        assert calls == []
        conserved(f)
    finally:
        assert scheduler.feeder is not None
        scheduler.feeder.stop(5.0)
