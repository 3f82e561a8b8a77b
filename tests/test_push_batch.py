"""One push batch mixing every case op_push tells apart (ops.lua): fresh, stored already,
duplicated within the batch, DONE, dont_filter, over several priorities, and batches whose
requests share one priority (the queue layer then pushes the accepted ids as they are).
The flags, the counts and the order requests are leased in must not depend on how the
batch is mixed."""

from __future__ import annotations

import pytest

from redcrawl.frontier import FrontierCore

from .conftest import FrontierFactory
from .test_frontier import env


def drain(f: FrontierCore) -> list[str]:
    out: list[str] = []
    while leases := f.lease("w1", 3):
        out += [le.envelope.url for le in leases]
        assert f.ack(leases) == len(leases)
    return out


def test_a_mixed_batch_gets_each_request_its_own_flag(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push([env("http://a/stored"), env("http://a/done")])
    leased = f.lease("w1", 2)
    done = [le for le in leased if le.envelope.url == "http://a/done"]
    assert f.ack(done) == 1
    f.nack(next(le for le in leased if le.envelope.url == "http://a/stored"), "x", delay=0)
    batch = [
        env("http://a/dont", dont_filter=True),
        env("http://a/1", priority=1),
        env("http://a/stored"),
        env("http://a/2", priority=-1),
        env("http://a/1", priority=1),
        env("http://a/done"),
        env("http://a/3"),
        env("http://a/dont", dont_filter=True),
        env("http://a/2", priority=-1),
    ]
    r = f.push(batch)
    assert r.flags == (True, True, False, True, False, False, True, True, False)
    assert (r.accepted, r.filtered) == (5, 4)
    c = f.counts()
    assert (c.accepted, c.filtered, c.ready + c.delayed, c.done) == (7, 4, 6, 1)
    assert c.conserved, c
    got = drain(f)
    assert sorted(got) == sorted(
        [
            "http://a/stored",
            "http://a/dont",
            "http://a/dont",
            "http://a/1",
            "http://a/2",
            "http://a/3",
        ]
    )
    assert f.counts().finished


@pytest.mark.backends("lists")
@pytest.mark.parametrize("politeness", [False, True])
@pytest.mark.parametrize("ordering", ["fifo", "lifo", "priority"])
def test_one_priority_per_batch_keeps_the_order(
    make_frontier: FrontierFactory, ordering: str, politeness: bool
) -> None:
    f = make_frontier(ordering=ordering, politeness=politeness)
    for p in (-1, 1, 0):  # one tier per batch (default bounds 1,0), one host
        assert f.push([env(f"http://a/p{p}/{i}", priority=p) for i in range(4)]).accepted == 4
    got = drain(f)
    assert len(got) == 12
    if ordering == "priority":
        assert got == [f"http://a/p{p}/{i}" for p in (1, 0, -1) for i in range(4)]
        return
    for p in (-1, 0, 1):
        mine = [u for u in got if u.startswith(f"http://a/p{p}/")]
        want = [f"http://a/p{p}/{i}" for i in range(4)]
        assert mine == (want if ordering == "fifo" else want[::-1])


@pytest.mark.backends("lists")
@pytest.mark.parametrize("ordering", ["fifo", "priority"])
def test_a_batch_that_stops_being_plain_halfway(
    make_frontier: FrontierFactory, ordering: str
) -> None:
    """Fresh fingerprints of one priority first, then a DONE one, another priority and a
    dont_filter request: the accepted ones keep their order and tiers."""
    f = make_frontier(ordering=ordering, politeness=False)
    f.push([env("http://a/done")])
    assert f.ack(f.lease("w1", 1)) == 1
    batch = [
        env("http://a/1"),
        env("http://a/2"),
        env("http://a/done"),
        env("http://a/3", priority=1),
        env("http://a/4"),
        env("http://a/5", dont_filter=True),
    ]
    assert f.push(batch).flags == (True, True, False, True, True, True)
    got = drain(f)
    assert got[0] == "http://a/3"  # (the higher tier first, at either ordering)
    assert got[1:] == ["http://a/1", "http://a/2", "http://a/4", "http://a/5"]
    assert f.counts().finished


@pytest.mark.backends("lists")
@pytest.mark.parametrize("ordering", ["fifo", "lifo", "priority"])
def test_done_fingerprints_after_the_last_accepted_one_stay_out_of_the_queue(
    make_frontier: FrontierFactory, ordering: str
) -> None:
    """A review found it: a batch of one priority whose DONE fingerprints all come after
    its last accepted request stayed "plain", and its whole fingerprint list, the DONE
    ones included, went into the ready queue (no record behind them; ready overcounted,
    the conservation law broken; after a recrawl push a request leased twice at once)."""
    f = make_frontier(ordering=ordering, politeness=False)
    f.push([env("http://a/done")])
    assert f.ack(f.lease("w1", 1)) == 1
    assert f.push([env("http://a/1"), env("http://a/done")]).flags == (True, False)
    c = f.counts()
    assert (c.ready, c.done) == (1, 1) and c.conserved, c
    assert f.push([env("http://a/done")], recrawl=True).accepted == 1
    leased = f.lease("w1", 10)
    assert sorted(le.envelope.url for le in leased) == ["http://a/1", "http://a/done"]
    assert f.ack(leased) == 2
    c = f.counts()
    assert c.finished and c.conserved and c.in_flight == 0, c
