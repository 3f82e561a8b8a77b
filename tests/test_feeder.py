"""The worker's I/O thread (:class:`redcrawl.feeder.Feeder`) against a real Redis: no
Scrapy, no subprocess. The caller's side never waits on Redis; what it buffers reaches
the frontier in order (children before their parent's ack); leases arrive ahead of
demand and, at the tail of a crawl, what can't start soon goes back to the crawl."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.feeder import Feeder
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, Lease, open_frontier
from redcrawl.settings import Settings
from tests.conftest import FrontierFactory, RedisServer

URL = "http://example.com/page/{}"


def env(i: int) -> Envelope:
    url = URL.format(i)
    return Envelope(url=url, fingerprint=fingerprint(url))


def wait_for(predicate: object, timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def front(redis7_client: redis.Redis) -> FrontierCore:
    # one host, many requests: the feeder's own buffering, without fleet-wide limits
    return open_frontier(redis7_client, Settings(politeness=False), "feed")


def feeder(front: FrontierCore, **kwargs: object) -> Iterator[Feeder]:
    params: dict[str, object] = {
        "prefetch": 4,
        "lookahead": 2,
        "concurrency": 2,
        "poll_interval": 0.05,
        "tick": 0.1,
        "heartbeat": 1.0,
    }
    f = Feeder(front, "w1", **{**params, **kwargs})  # type: ignore[arg-type]
    f.start()
    try:
        yield f
    finally:
        f.stop(timeout=10)


@pytest.fixture
def feed(front: FrontierCore) -> Iterator[Feeder]:
    yield from feeder(front)


def take(f: Feeder, n: int, timeout: float = 10) -> list[Lease]:
    got: list[Lease] = []

    def more() -> bool:
        lease = f.take()
        if lease is not None:
            got.append(lease)
            f.held = len(got)
        return len(got) >= n

    wait_for(more, timeout, f"{n} leases")
    return got


def test_stored_requests_are_leased_then_acked(front: FrontierCore, feed: Feeder) -> None:
    for i in range(10):
        feed.store(env(i))
    leases = take(feed, 10)
    assert sorted(lease.envelope.url for lease in leases) == sorted(
        URL.format(i) for i in range(10)
    )
    for lease in leases:
        feed.ack(lease)
    feed.held = 0
    wait_for(lambda: front.counts().done == 10, what="the acks")
    c = front.counts()
    assert c.finished and c.conserved and c.accepted == 10
    wait_for(
        lambda: (v := feed.crawl_counts()) is not None and v.finished,
        what="the feeder's view of the finished crawl",
    )
    stats = feed.stats()
    assert stats["stored"] == 10 and stats["acked"] == 10 and stats["leased"] == 10


def test_children_are_stored_before_their_parent_is_acked(
    front: FrontierCore, feed: Feeder
) -> None:
    """The parent's ack is buffered after its children: whenever Redis shows the parent
    done, its children are stored."""
    feed.store(env(0))
    (parent,) = take(feed, 1)
    for i in range(1, 200):
        feed.store(env(i))
    feed.ack(parent)
    seen_done_without_children = []

    def check() -> bool:
        c = front.counts()
        if c.done and c.accepted < 200:
            seen_done_without_children.append(c)
        return c.done == 1

    wait_for(check, what="the parent's ack")
    assert seen_done_without_children == []
    assert front.counts().accepted == 200


def test_the_caller_never_waits_on_a_frozen_redis(
    front: FrontierCore, feed: Feeder, redis7: RedisServer
) -> None:
    """Redis frozen (SIGSTOP) for 5 s: the caller's calls return while it is frozen, the
    feeder says Redis is stalled, and everything buffered meanwhile is stored once it
    thaws. A call that waited on Redis would last until the thaw; the bound is half the
    freeze, not a speed target (a loaded CI machine once took 0.66 s for one call)."""
    freeze = 5.0
    for i in range(8):
        feed.store(env(i))
    leases = take(feed, 8)
    os.kill(redis7.pid, signal.SIGSTOP)
    # thawed on time even if a call did wait on Redis, so such a test fails, not hangs
    thaw = threading.Timer(freeze, os.kill, (redis7.pid, signal.SIGCONT))
    thaw.start()
    try:
        worst = 0.0
        calls = 0
        deadline = time.monotonic() + freeze - 0.5
        i = 100
        while time.monotonic() < deadline:
            started = time.perf_counter()
            feed.store(env(i))
            feed.take()
            feed.crawl_counts(refresh=True)
            if leases:
                feed.ack(leases.pop())
            worst = max(worst, time.perf_counter() - started)
            calls += 1
            i += 1
            time.sleep(0.005)
        stalled = feed.stalled_for()
    finally:
        thaw.cancel()
        os.kill(redis7.pid, signal.SIGCONT)
    print(f"\n{calls} caller rounds with Redis frozen, the longest {worst * 1000:.2f} ms")
    assert stalled > 1.0
    assert worst < freeze / 2
    assert calls >= 8  # every buffered ack was handed over while Redis was frozen
    wait_for(lambda: front.counts().done == 8, what="the acks after the thaw")
    wait_for(lambda: front.counts().accepted == i - 100 + 8, what="the stores after the thaw")
    wait_for(lambda: feed.stalled_for() == 0, what="the feeder to see Redis again")


def test_leases_arrive_ahead_of_demand_within_bounds(front: FrontierCore) -> None:
    """prefetch 4, lookahead 2, concurrency 2: at most 4 * 3 leased ahead while the
    crawl has plenty ready; none leased while the crawl is paused."""
    front.push([env(i) for i in range(100)])
    for f in feeder(front):
        wait_for(lambda: front.counts().in_flight >= 12, what="leases ahead")
        time.sleep(0.3)
        assert front.counts().in_flight == 12  # prefetch * (1 + lookahead), no more
        stats = f.stats()
        assert stats.get("lookahead_calls", 0) >= 1


def test_leases_come_in_full_batches(front: FrontierCore) -> None:
    """With more requests in progress than the concurrency (Scrapy's scraper holds some
    after their download), a worker still leases PREFETCH at a time while it has more
    than half its lookahead ready: one call per batch, not one per request taken (each
    call has a fixed cost in Redis). The bound on what it holds stays as it was."""
    front.push([env(i) for i in range(200)])
    f = Feeder(front, "w1", prefetch=4, lookahead=2, concurrency=2, tick=30.0, heartbeat=30.0)
    f.start()
    try:
        wait_for(lambda: front.counts().in_flight >= 12, what="leases ahead")
        f.held = 5  # room for 4 * 3 + 2 - 5 = 9 ready ahead
        f.stats()
        for _ in range(24):
            wait_for(lambda: f.take() is not None, what="a lease")
            time.sleep(0.02)  # (the I/O thread's turn)
        time.sleep(0.1)
        stats = f.stats()
        assert stats["leased"] >= 20
        assert stats["leased"] / stats["lease_calls"] >= 3.5  # full batches of 4
        assert front.counts().in_flight <= 24 + 12  # taken + at most 12 ahead
    finally:
        f.stop(timeout=10)


def test_a_tick_sends_nothing_that_a_recent_call_would_carry(front: FrontierCore) -> None:
    """The tick reads the crawl-wide counts; it sends what is buffered only if no settle
    call went out since the tick before (a lease call carries the stores and acks
    anyway): no settle call of its own while lease calls come often, and buffered
    stores still reach Redis within two ticks without one."""
    front.push([env(i) for i in range(500)])
    f = Feeder(front, "w1", prefetch=4, lookahead=2, concurrency=2, tick=0.4, heartbeat=30.0)
    f.start()
    try:
        wait_for(lambda: front.counts().in_flight >= 12, what="leases ahead")
        f.stats()
        end = time.monotonic() + 4.0  # 10 ticks, a lease call every ~0.2 s
        i = 1000
        while time.monotonic() < end:
            lease = f.take()  # (a lease call at every 4th)
            time.sleep(0.025)  # (so that something is always buffered)
            if lease is not None:
                f.store(env(i))  # a child, then its parent's ack
                f.ack(lease)
                i += 1
            time.sleep(0.025)
        stats = f.stats()
        assert stats["lease_calls"] >= 8
        assert stats["settle_calls"] - stats["lease_calls"] <= 2  # (5 to 10 before)
        f.store(env(i))  # no lease call coming: a tick sends it
        wait_for(lambda: front.counts().accepted == i - 499, timeout=2, what="a tick")
    finally:
        f.stop(timeout=10)


def test_tail_leases_go_back_to_the_crawl(front: FrontierCore) -> None:
    """At the tail (nothing else ready in the crawl), a worker that holds more than it
    can start gives the rest back when there is another worker: that one leases them."""
    front.push([env(i) for i in range(10)])
    front.renew("w2")  # another worker of the crawl (its heartbeat)
    f = Feeder(
        front,
        "w1",
        prefetch=4,
        lookahead=2,
        concurrency=2,
        poll_interval=0.05,
        tick=5.0,
        heartbeat=1.0,
    )
    f.start()
    try:
        wait_for(lambda: front.counts().in_flight == 10, what="the feeder to hoard")
        assert front.lease("w2", 10) == []  # nothing left for another worker...
        f.flush()  # (the next read of the crawl-wide counts)
        wait_for(lambda: front.counts().ready == 8, what="the excess given back")
        other = front.lease("w2", 10)
        assert len(other) == 8  # ...until the feeder gave back what it can't start
        assert len(take(f, 2)) == 2
        time.sleep(0.3)
        assert f.take() is None and front.counts().in_flight == 10  # no hoarding again
        assert f.stats()["released"] == 8
    finally:
        f.stop(timeout=10)


def test_stop_flushes_and_gives_back_what_was_not_started(front: FrontierCore) -> None:
    front.push([env(i) for i in range(6)])
    f = Feeder(front, "w1", prefetch=4, lookahead=1, concurrency=2, tick=5.0)
    f.start()
    (lease,) = take(f, 1)
    f.store(env(99))
    f.ack(lease)
    assert f.stop(timeout=10)
    c = front.counts()
    assert (c.accepted, c.done, c.in_flight, c.ready) == (7, 1, 0, 6) and c.conserved


def test_flush_waits_until_stored(front: FrontierCore) -> None:
    f = Feeder(front, "w1", tick=30.0, heartbeat=30.0)
    f.start()
    try:
        for i in range(3):
            f.store(env(i))
        assert f.flush(wait=10)
        assert front.counts().accepted == 3  # stored when flush returned
    finally:
        f.stop(timeout=10)


def test_a_lone_worker_keeps_what_it_leased(front: FrontierCore) -> None:
    """No other worker: nothing to give back to (no release and lease again)."""
    front.push([env(i) for i in range(10)])
    f = Feeder(front, "w1", prefetch=4, lookahead=2, concurrency=2, tick=0.05)
    f.start()
    try:
        wait_for(lambda: front.counts().in_flight == 10, what="the feeder to lease")
        time.sleep(0.5)
        assert "released" not in f.stats()
    finally:
        f.stop(timeout=10)


def test_polite_worker_leases_only_what_can_start_now(front: FrontierCore) -> None:
    """With fleet-wide politeness a lease holds a site's slot: a worker leases for its
    free capacity (concurrency 2 here) only, never ahead."""
    front.push([env(i) for i in range(100)])
    for f in feeder(front, polite=True):
        wait_for(lambda: front.counts().in_flight >= 2, what="leases")
        time.sleep(0.3)
        assert front.counts().in_flight == 2
        got = take(f, 2)
        f.ack(got[0])
        f.held = 1
        wait_for(lambda: front.counts().done == 1, what="the ack")
        time.sleep(0.3)
        assert front.counts().in_flight <= 2


def test_a_deferral_blocks_the_site_before_the_same_round_leases(
    make_frontier: FrontierFactory,
) -> None:
    """A 503 reported in a round that also leases: the site's block is set first, so the
    worker's own lease in that round gets nothing of the site (it used to lease first and
    could fetch the site again right after its 503)."""
    front = make_frontier(
        "defer-order", politeness_concurrency=2, politeness_delay=0.0, use_clock=False
    )
    front.push(
        [Envelope(url=f"http://a.test/{i}", fingerprint=fingerprint(f"a{i}")) for i in range(5)]
    )
    f = Feeder(front, "w1", prefetch=4, lookahead=1, concurrency=4, polite=True)
    (pushed_back,) = front.lease("w1", 1)
    f._step([], [], [], [], 1, time.monotonic(), [], [(pushed_back, "503", 5.0)])
    assert list(f._ready) == []
    assert front.counts().conserved
