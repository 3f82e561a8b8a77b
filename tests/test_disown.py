"""Orphan leases (issue 15; docs/cluster.md, "Durability"): a failover to a lagging
replica undoes acks a worker already got, so requests are IN-FLIGHT again under lease
tokens of a live worker that no longer holds them. Its heartbeat keeps every lease named
on it alive, so they would never expire (and, with fleet-wide politeness, hold their
sites' slots forever). ``FrontierCore.disown(worker, held)`` takes back the worker's
leases it does not name in ``held``, on both backends.

The lagging replica is played by a snapshot of the server (DUMP of every key) taken
before the ack and restored after it: what a replica that missed the ack holds when it
is promoted."""

from __future__ import annotations

import hashlib
import time

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.feeder import Feeder
from redcrawl.frontier import FrontierCore, Lease

from .conftest import Clock, FrontierFactory

pytestmark = pytest.mark.backends("lists", "streams")

Snapshot = dict[bytes, bytes]


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


def snapshot(c: redis.Redis) -> Snapshot:
    return {k: c.dump(k) for k in c.keys("*")}  # type: ignore[misc]


def promote_lagging(c: redis.Redis, snap: Snapshot) -> None:
    """The server now holds what the snapshot held (a replica that missed what came after
    it, promoted)."""
    for k in c.keys("*"):
        if k not in snap:
            c.delete(k)
    for k, v in snap.items():
        c.restore(k, 0, v, replace=True)


def orphan(f: FrontierCore, worker: str = "w1") -> None:
    """One request leased by ``worker``, acked, and the ack undone by a failover."""
    before = f.counts().in_flight
    held = f.lease(worker, 1)
    assert len(held) == 1
    snap = snapshot(f.client)
    assert f.ack(held) == 1
    promote_lagging(f.client, snap)
    assert f.counts().in_flight == before + 1


def test_undone_ack_stays_in_flight_while_its_worker_heartbeats(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """The bug: nothing ever takes the orphan back while w1 lives (w1 holds nothing)."""
    f = make_frontier(lease_ttl=10)
    f.push([env("http://a/1")])
    orphan(f)
    for _ in range(6):
        clock.advance(8)
        f.renew("w1")
        assert f.lease("w2", 5) == []
        f.maintain()
    assert f.counts().in_flight == 1
    # the fix: w1 says what it holds (nothing); the orphan goes back to READY at once
    assert f.disown("w1", []) == 1
    c = f.counts()
    assert c.in_flight == 0 and c.ready == 1 and c.conserved, c
    assert int(f.client.hget(f.keys.stats, "orphaned") or 0) == 1
    again = f.lease("w2", 5)
    assert [x.envelope.url for x in again] == ["http://a/1"]
    assert f.ack(again) == 1
    assert f.counts().finished


def test_disown_keeps_what_the_worker_holds(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push([env(f"http://a/{i}") for i in range(3)])
    kept = f.lease("w1", 1)
    orphan(f)  # the second request
    other = f.lease("w2", 1)  # another worker's lease is not w1's to disown
    assert f.disown("w1", [x.token for x in kept]) == 1
    assert f.disown("w1", [x.token for x in kept]) == 0  # nothing left to take back
    assert f.ack(kept) == 1 and f.ack(other) == 1
    c = f.counts()
    assert c.in_flight == 0 and c.ready == 1 and c.conserved, c


def test_orphan_spends_its_attempt_then_dead(make_frontier: FrontierFactory) -> None:
    """Taken back as an expired lease would be: the delivery counts as an attempt."""
    f = make_frontier(max_attempts=1)
    f.push([env("http://a/1")])
    orphan(f)
    assert f.disown("w1", []) == 1
    c = f.counts()
    assert c.dead == 1 and c.in_flight == 0 and c.conserved, c


def test_orphan_gives_its_politeness_slot_back(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """With fleet-wide politeness the orphan holds its site's only slot: the site is
    stuck until it is disowned."""
    f = make_frontier(
        lease_ttl=10,
        politeness_concurrency=1,
        politeness_delay=0.0,
        politeness_randomize=False,
    )
    assert f.politeness == "host"
    f.push([env("http://a/1"), env("http://a/2")])
    orphan(f)
    for _ in range(3):
        clock.advance(8)
        f.renew("w1")
        assert f.lease("w2", 5) == []
    assert f.disown("w1", []) == 1
    got = f.lease("w2", 5)
    assert len(got) == 1  # the slot is free again (one at a time)
    assert f.ack(got) == 1
    got = f.lease("w2", 5)
    assert len(got) == 1 and f.ack(got) == 1
    assert f.counts().finished


def test_partitioned_crawl_disowns_in_every_partition(make_frontier: FrontierFactory) -> None:
    f = make_frontier(partitions=2, politeness=False)
    f.push([env(f"http://h{i}/1") for i in range(8)])
    leased: list[Lease] = []
    for _ in range(20):  # (a lease call takes from one partition)
        leased += f.lease("w1", 1)
    assert len(leased) == 8
    assert len({x.token.split(":")[0] for x in leased}) == 2  # both partitions
    kept, acked = leased[:1], leased[1:]
    snap = snapshot(f.client)
    assert f.ack(acked) == len(acked)
    promote_lagging(f.client, snap)
    assert f.counts().in_flight == 8
    assert f.disown("w1", [x.token for x in kept]) == len(acked)
    assert f.ack(kept) == 1
    c = f.counts()
    assert c.in_flight == 0 and c.ready == len(acked) and c.conserved, c


@pytest.mark.backends("lists")
def test_lists_disown_a_lease_once_no_request_of_it_is_held(
    make_frontier: FrontierFactory,
) -> None:
    """On the lists backend a token names one lease call's requests: an undone ack under a
    token the worker still holds (another request of the same call) is taken back once
    the worker lets that token go."""
    f = make_frontier()
    f.push([env(f"http://a/{i}") for i in range(2)])
    both = f.lease("w1", 2)
    assert len({x.token for x in both}) == 1
    snap = snapshot(f.client)
    assert f.ack(both[:1]) == 1
    promote_lagging(f.client, snap)
    assert f.disown("w1", [both[1].token]) == 0
    assert f.ack(both[1:]) == 1
    assert f.disown("w1", []) == 1
    c = f.counts()
    assert c.in_flight == 0 and c.ready == 1 and c.conserved, c


def test_a_feeder_takes_its_orphans_back(make_frontier: FrontierFactory) -> None:
    """A worker's I/O thread disowns what it does not hold at its heartbeats, never what it
    holds: a lease taken and not acked yet survives every heartbeat."""
    f = make_frontier(use_clock=False, politeness=False)
    f.push([env(f"http://a/{i}") for i in range(3)])
    orphan(f)
    feed = Feeder(f, "w1", prefetch=1, lookahead=0, concurrency=1, heartbeat=0.1, tick=0.1)
    feed.start()
    try:
        held: list[Lease] = []
        deadline = time.monotonic() + 20
        while len(held) < 3:
            assert time.monotonic() < deadline, (held, f.counts())
            lease = feed.take()
            if lease is None:
                time.sleep(0.02)
                continue
            time.sleep(0.5)  # several heartbeats while it is held
            feed.ack(lease)
            held.append(lease)
        assert feed.flush(wait=10)
        assert sorted(x.envelope.url for x in held) == [f"http://a/{i}" for i in range(3)]
        assert f.counts().finished
        assert feed.stats().get("orphaned") == 1
        assert int(f.client.hget(f.keys.stats, "orphaned") or 0) == 1
    finally:
        feed.stop(timeout=10)
