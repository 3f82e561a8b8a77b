"""``settle_begin``: settle calls sent now and read later, in order, on a connection of
their own (the Scheduler's lookahead), on both backends and both Redis versions."""

from __future__ import annotations

import pytest
import redis

from redcrawl.errors import FrontierError
from redcrawl.frontier import PendingSettle, open_frontier
from redcrawl.settings import Settings

from .conftest import Backend, Clock, FrontierFactory
from .proxykit import ReplyDropper, envs, held


def test_pipelined_settles_do_what_settle_does_in_order(make_frontier: FrontierFactory) -> None:
    # (the counts below are about settling; 3 sites with room for all their requests, so
    # how politeness spreads grants over the sites changes none of them)
    f = make_frontier(batch_size=7, politeness_concurrency=100)
    first = f.settle_begin(push=envs(20), lease=("w1", 5))  # 3 script calls (batch 7)
    assert first.sent
    out1 = first.result()
    assert (out1.pushed.accepted, out1.pushed.filtered, len(out1.leases)) == (20, 0, 5)

    # children of the first five, then their parents' ack, then more leases: begun in
    # that order, read newest first, still run in order
    children = f.settle_begin(push=envs(6, start=100) + envs(2))
    parents = f.settle_begin(ack=out1.leases, lease=("w1", 30))
    out3 = parents.result()
    out2 = children.result()
    assert (out2.pushed.accepted, out2.pushed.filtered) == (6, 2)
    assert out3.acked == 5 and len(out3.leases) == 21  # 15 left + 6 children
    c = f.counts()
    assert c.conserved and (c.accepted, c.done, c.in_flight, c.ready) == (26, 5, 21, 0)
    assert f.settle_begin(ack=out3.leases).result().acked == 21
    assert f.counts().finished


def test_a_script_cache_flush_between_calls_is_survived(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier()
    f.push(envs(10))
    a = f.settle_begin(lease=("w1", 4)).result()
    redis_client.script_flush()  # e.g. a Redis restart: EVALSHA answers NOSCRIPT
    b = f.settle_begin(ack=a.leases, lease=("w1", 4)).result()
    assert b.acked == 4 and len(b.leases) == 4
    c = f.counts()
    assert (c.done, c.in_flight, c.ready) == (4, 4, 2) and c.conserved


def test_a_refused_call_raises_and_the_next_one_works(
    make_frontier: FrontierFactory,
    redis_client: redis.Redis,
    clock: Clock,
    frontier_backend: Backend,
) -> None:
    f = make_frontier()
    f.push(envs(3))
    other = make_frontier(dedupe="bloom")  # another layout: every script is refused
    refused = other.settle_begin(lease=("w2", 1))
    with pytest.raises(FrontierError, match="layout mismatch"):
        refused.result()
    with pytest.raises(FrontierError, match="layout mismatch"):
        refused.result()  # asked again: the same answer, not another call's
    assert len(f.settle_begin(lease=("w1", 3)).result().leases) == 3


def test_lost_replies_on_the_pipe_are_replayed_not_repeated(
    redis_client: redis.Redis, dropper: ReplyDropper, clock: Clock, frontier_backend: Backend
) -> None:
    settings = Settings(backend=frontier_backend, lease_ttl=10.0, retry_backoff=0.0)
    direct = open_frontier(redis_client, settings, "pipe", clock=clock)
    proxied = open_frontier(dropper.client(settings), settings, "pipe", clock=clock)
    direct.push(envs(50))
    warm = proxied.settle_begin(lease=("w1", 10)).result().leases  # the pipe is warm

    dropper.arm()  # the first reply on the pipe's connection never arrives
    a = proxied.settle_begin(push=envs(3, start=500, dont_filter=True), ack=warm, lease=("w1", 10))
    b = proxied.settle_begin(lease=("w1", 10))
    out_a, out_b = a.result(), b.result()

    assert dropper.dropped == 1
    assert (out_a.pushed.accepted, out_a.acked, len(out_a.leases)) == (3, 10, 10)
    assert len(out_b.leases) == 10
    c = direct.counts()
    assert c.conserved
    assert c.accepted == 53, "a retried call pushed again"
    assert c.in_flight == 20, "a retried call leased again: requests orphaned"
    assert held(direct) == {x.id for x in out_a.leases + out_b.leases}


def test_a_refused_call_is_not_overtaken_by_the_acks_of_the_next(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    """Issue 11 item 14: pipelined settles A (children of P) and B (ack of P); Redis
    refuses A and runs B. B must not ack P: a crash before A is sent again would lose the
    children. B hands P back (unacked), and so does every later call of the chain until
    the refusal is read; settles begun after that start a new chain."""
    f = make_frontier(batch_size=2)
    f.push(envs(4))
    parents = f.lease("w1", 4)
    # A: 3 calls (batch 2), the first refused by Redis: a malformed call (one push too
    # many announced) fails the script's validation before it writes anything
    calls = f._settle_calls(envs(5, start=100), (), None, None)
    calls[0][0] += 1
    a = PendingSettle(f, calls)
    b = f.settle_begin(ack=parents[:2], lease=("w1", 0))
    c = f.settle_begin(ack=parents[2:3])
    out_b, out_c = b.result(), c.result()
    with pytest.raises(FrontierError, match="malformed"):
        a.result()
    assert out_b.acked == 0 and out_b.unacked == tuple(parents[:2])
    assert out_c.acked == 0 and out_c.unacked == (parents[2],)
    counts = f.counts()
    assert counts.done == 0 and counts.in_flight == 4, "a parent was acked past a refused call"
    # the refusal is read: a new chain
    d = f.settle_begin(push=envs(5, start=100), ack=parents)
    assert d.result().acked == 4
    counts = f.counts()
    assert counts.conserved and (counts.done, counts.accepted) == (4, 9), counts
    clock.advance(60)
    assert len(f.lease("w2", 10)) == 5  # A's pushes that did run (calls 2, 3) and D's
