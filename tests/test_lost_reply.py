"""A lease or settle call whose reply is lost on the network: redis-py resends the call
after reconnecting, and the frontier must answer the retry with what the first execution
did (same leases, nothing pushed, acked or leased twice), or the first lease would stay
IN-FLIGHT under a live worker that never learnt it holds it.

The loss is real: a TCP proxy between the client and redis-server lets the command
through and closes both connections instead of forwarding the reply.
"""

from __future__ import annotations

import pytest
import redis

from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.frontier.base import Lease
from redcrawl.settings import Settings

from .conftest import Backend, Clock, raw
from .proxykit import ReplyDropper, envs, held


def _frontiers(
    redis_client: redis.Redis, dropper: ReplyDropper, clock: Clock, backend: Backend
) -> tuple[FrontierCore, FrontierCore]:
    """The same crawl seen directly and through the proxy."""
    settings = Settings(backend=backend, lease_ttl=10.0, retry_backoff=0.0)
    direct = open_frontier(redis_client, settings, "lost", clock=clock)
    proxied = open_frontier(dropper.client(settings), settings, "lost", clock=clock)
    return direct, proxied


def test_lost_lease_reply_returns_the_same_lease(
    redis_client: redis.Redis, dropper: ReplyDropper, clock: Clock, frontier_backend: Backend
) -> None:
    direct, proxied = _frontiers(redis_client, dropper, clock, frontier_backend)
    direct.push(envs(30))
    # the lease script is in the server's cache, so the dropped reply is the lease's own
    # (not a NOSCRIPT answer to a call that never ran)
    redis_client.script_load(direct._scripts["lease"].script)

    dropper.arm()
    leases = proxied.lease("w1", 10)

    assert dropper.dropped == 1  # the first execution's reply really was lost
    assert len(leases) == 10
    counts = direct.counts()
    assert counts.in_flight == 10, "the retry leased again: 10 requests orphaned"
    assert counts.ready == 20
    assert proxied.ack(leases) == 10
    assert direct.counts().in_flight == 0
    # the next call is a new one, not a replay
    assert len(proxied.lease("w1", 10)) == 10


def test_lost_settle_reply_pushes_acks_and_leases_once(
    redis_client: redis.Redis, dropper: ReplyDropper, clock: Clock, frontier_backend: Backend
) -> None:
    direct, proxied = _frontiers(redis_client, dropper, clock, frontier_backend)
    direct.push(envs(40))
    first = proxied.lease("w1", 10)
    children = envs(5, start=1000, dont_filter=True)  # no fingerprint: a re-push would count

    dropper.arm()
    out = proxied.settle(push=children, ack=first, lease=("w1", 10))

    assert dropper.dropped == 1
    assert out.pushed.accepted == 5 and out.acked == 10 and len(out.leases) == 10
    counts = direct.counts()
    assert counts.accepted == 45, "the retry pushed the children again"
    assert counts.done == 10
    assert counts.in_flight == 10, "the retry leased again: 10 requests orphaned"
    assert held(direct) == {lease.id for lease in out.leases}
    assert proxied.ack(out.leases) == 10
    assert direct.counts().in_flight == 0


def test_replay_returns_only_what_is_still_held(
    redis_client: redis.Redis, clock: Clock, frontier_backend: Backend
) -> None:
    """A replay after part of the lease was already settled elsewhere (its lease expired
    and was reclaimed) returns only the requests the worker still holds."""
    settings = Settings(backend=frontier_backend, lease_ttl=10.0, retry_backoff=0.0)
    f = open_frontier(redis_client, settings, "lost", clock=clock)
    f.push(envs(6))
    args = f._lease_args("w1", 6, None)
    first = f._leases("w1", f._run("lease", args))
    assert len(first) == 6
    assert f.ack(first[:2]) == 2
    again = f._leases("w1", f._run("lease", args))  # the same call, same nonce
    assert sorted(x.id for x in again) == sorted(x.id for x in first[2:])
    assert all(isinstance(x, Lease) for x in again)
    assert f.counts().in_flight == 4


def test_a_dead_workers_last_call_is_forgotten(
    redis_client: redis.Redis, clock: Clock, frontier_backend: Backend
) -> None:
    settings = Settings(backend=frontier_backend, lease_ttl=10.0, retry_backoff=0.0)
    f = open_frontier(redis_client, settings, "lost", clock=clock)
    f.push(envs(4))
    assert len(f.lease("w1", 2)) == 2
    assert len(f.lease("w2", 2)) == 2
    calls = raw(redis_client.hkeys(f.keys.calls))
    workers = {k.split(b"#")[0] for k in calls}
    assert workers == {b"", b"w1", b"w2"}  # b"": the push's (one of 256 shared slots)
    clock.advance(11)  # both heartbeats and leases expire
    f.maintain()
    calls = raw(redis_client.hkeys(f.keys.calls))
    assert not [k for k in calls if k.startswith(b"w1#")]
    assert not [k for k in calls if k.startswith(b"w2#")]
    assert f.counts().ready == 4
    assert len(f.lease("w3", 1)) == 1
    f.release_worker("w3")
    assert not [k for k in raw(redis_client.hkeys(f.keys.calls)) if k.startswith(b"w3#")]


def _dead(f: FrontierCore, n: int) -> None:
    """n requests DEAD."""
    f.push(envs(n, start=900))
    for lease in f.lease("w9", n):
        f.nack(lease, "boom", retry=False)


@pytest.mark.parametrize(
    "call",
    [
        "push_delayed",
        "push_plain",
        "push_batches",
        "settle_push",
        "nack",
        "requeue_dead",
        "release",
    ],
)
def test_every_state_changing_call_is_replayed_not_repeated(
    redis_client: redis.Redis,
    dropper: ReplyDropper,
    clock: Clock,
    frontier_backend: Backend,
    call: str,
) -> None:
    """Issue 11 item 15: calls that lease nothing carried no nonce, so a lost reply
    enqueued dont_filter requests twice (and requeued, nacked... twice)."""
    settings = Settings(backend=frontier_backend, lease_ttl=10.0, retry_backoff=0.0, batch_size=2)
    direct = open_frontier(redis_client, settings, "lost", clock=clock)
    proxied = open_frontier(dropper.client(settings), settings, "lost", clock=clock)
    for name in ("push", "settle", "nack", "requeue_dead", "release"):
        redis_client.script_load(direct._scripts[name].script)
    children = envs(5, start=1000, dont_filter=True)
    if call in ("nack", "release"):
        direct.push(envs(1))
        [mine] = proxied.lease("w1", 1)
    if call == "requeue_dead":
        _dead(direct, 3)
    before = direct.counts()

    dropper.arm()  # the reply of the first script call of the operation is lost
    if call == "push_delayed":
        assert proxied.push(children, delay=5).accepted == 5
    elif call == "push_plain":
        assert proxied.push(children).accepted == 5
    elif call == "push_batches":  # 3 calls (batch_size 2): the first one's reply is lost
        assert proxied.settle(push=children, lease=("w1", 0)).pushed.accepted == 5
    elif call == "settle_push":
        assert proxied.settle(push=children).pushed.accepted == 5
    elif call == "nack":
        assert proxied.nack(mine, "boom", delay=1) == "retried"
    elif call == "requeue_dead":
        assert proxied.requeue_dead(limit=2) == 2
    else:
        assert proxied.release([mine]) == 1

    assert dropper.dropped == 1
    c = direct.counts()
    assert c.conserved, c
    if call.startswith(("push", "settle")):
        assert c.accepted == before.accepted + 5, "a retried call pushed again"
    elif call == "nack":
        assert (c.retried, c.delayed, c.in_flight) == (1, 1, 0), c
    elif call == "requeue_dead":
        assert (c.requeued, c.dead) == (2, 1), "a retried call requeued again"
    else:
        assert (c.ready, c.in_flight) == (1, 0), c
