"""What a failover to a lagging replica takes back, for lease tokens and ``disown``
(docs/cluster.md, "Durability").

The lagging replica is played, as in tests/test_disown.py, by a snapshot of the server
(DUMP of every key) restored after the calls it missed; the test clock moves on by the
seconds a failover takes.

- Lease tokens: the token counter is part of what a failover takes back. A worker that
  got a lease the new master never heard of still holds its token; if the new master
  handed the same token out again for the same request (the head of the same queue), that
  worker's stale nack, release or ack would settle the new holder's lease. A token is
  never below the server's clock in microseconds (ms x 1000), so the new master's tokens
  are past every token the old one handed out.
- ``disown`` is not waited for (``REDCRAWL_WAIT_REPLICAS``): a disown the failover takes
  back leaves the orphans in flight under their live worker, whose next disown takes
  them back again; nothing is lost or done twice.
"""

from __future__ import annotations

import hashlib

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.frontier.durability import WAITED

from .conftest import Clock, FrontierFactory
from .test_disown import orphan, promote_lagging, snapshot

FAILOVER_S = 2.0
"""Seconds a failover takes at least (Redis Cluster's node timeout is 15 s by default)."""


def envs(n: int) -> list[Envelope]:
    urls = [f"http://a{i}.example/" for i in range(n)]
    return [Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls]


@pytest.mark.parametrize("polite", [False, True])
def test_a_token_lost_in_a_failover_is_not_handed_out_again(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock, polite: bool
) -> None:
    """The bug: the new master handed the lost lease's token out again, for the same
    requests; the old holder's nack (no retry) sent the new holder's request to DEAD and
    the new holder's ack was stale: a request fetched fine ended DEAD. (Streams with
    politeness add a request's entry when it is granted, so its entry id, part of the
    token, was new; without politeness the entry is the one pushed.)"""
    f = make_frontier(politeness=polite)
    f.push(envs(4))
    snap = snapshot(redis_client)
    lost = f.lease("a", 2)  # the replica never got this lease
    assert len(lost) == 2
    clock.advance(FAILOVER_S)
    promote_lagging(redis_client, snap)
    new = f.lease("b", 2)
    assert sorted(x.id for x in new) == sorted(x.id for x in lost)  # the queue's head again
    assert not {x.token for x in new} & {x.token for x in lost}
    assert f.nack(lost[0], "a's fetch failed", retry=False) == "stale"
    assert f.release(lost[1:]) == 0
    assert f.ack(new) == 2
    c = f.counts()
    assert (c.done, c.dead, c.ready, c.in_flight) == (2, 0, 2, 0), c
    later = f.lease("b", 2)  # tokens keep growing after the jump
    assert len(later) == 2 and all(x.token not in {y.token for y in new} for x in later)


def test_a_disown_taken_back_by_a_failover_is_done_again_by_the_next(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    """Why ``disown`` needs no WAIT: losing it loses nothing."""
    assert "disown" not in WAITED
    f = make_frontier()
    f.push(envs(1))
    orphan(f)
    snap = snapshot(redis_client)
    assert f.disown("w1", []) == 1
    clock.advance(FAILOVER_S)
    promote_lagging(redis_client, snap)  # the disown is undone
    assert f.counts().in_flight == 1
    assert f.disown("w1", []) == 1  # the worker's next disown
    c = f.counts()
    assert (c.ready, c.in_flight) == (1, 0) and c.conserved, c
