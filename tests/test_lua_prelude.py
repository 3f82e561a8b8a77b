"""The shared prelude of the frontier scripts (frontier/lua/lib.lua, latency.lua, ops.lua):
literals that stand in for values computed at every call must equal what they replace."""

from __future__ import annotations

import re

import pytest
import redis

from redcrawl import scripts
from redcrawl.frontier import open_frontier
from redcrawl.metrics.buckets import LATENCY_BOUNDS_MS
from redcrawl.settings import Settings

from .conftest import Clock
from .proxykit import ReplyDropper, envs, held


def lua_table(src: str, name: str) -> list[str]:
    """The items of the Lua table constructor ``local <name> = {...}`` in ``src``."""
    m = re.search(r"local " + name + r" = \{([^}]*)\}", src)
    assert m, name
    return [x.strip().strip("'") for x in m.group(1).split(",")]


def test_latency_field_names_are_the_bounds() -> None:
    src = scripts.text("frontier/lua/latency.lua")
    bounds = [int(b) for b in lua_table(src, "LAT_BOUNDS")]
    assert tuple(bounds) == LATENCY_BOUNDS_MS
    assert lua_table(src, "LAT_FIELDS") == [f"lat:{b}" for b in bounds]
    assert f"local N_BOUNDS = {len(bounds)}" in src


@pytest.mark.parametrize("politeness", [False, True])
def test_a_lost_settle_reply_is_replayed_from_the_call_record(
    redis_client: redis.Redis, dropper: ReplyDropper, clock: Clock, politeness: bool
) -> None:
    """call_record keeps a lists lease without politeness as its token alone (its entry
    lists the ids): the replay must still return the lease, once."""
    settings = Settings(lease_ttl=10.0, retry_backoff=0.0, politeness=politeness)
    direct = open_frontier(redis_client, settings, "lost", clock=clock)
    proxied = open_frontier(dropper.client(settings), settings, "lost", clock=clock)
    direct.push(envs(40))
    first = proxied.lease("w1", 10)
    dropper.arm()
    out = proxied.settle(push=envs(5, start=1000, dont_filter=True), ack=first, lease=("w1", 10))
    assert dropper.dropped == 1
    assert out.pushed.accepted == 5 and out.acked == 10 and len(out.leases) == 10
    counts = direct.counts()
    assert (counts.accepted, counts.done, counts.in_flight) == (45, 10, 10)
    assert held(direct) == {lease.id for lease in out.leases}
    assert proxied.ack(out.leases) == 10
    assert direct.counts().in_flight == 0


@pytest.mark.parametrize("politeness", [False, True])
def test_a_replayed_lease_returns_what_is_still_held(
    redis_client: redis.Redis, clock: Clock, politeness: bool
) -> None:
    settings = Settings(lease_ttl=10.0, retry_backoff=0.0, politeness=politeness)
    f = open_frontier(redis_client, settings, "lost", clock=clock)
    f.push(envs(6))
    args = f._lease_args("w1", 6, None)
    first = f._leases("w1", f._run("lease", args))
    assert f.ack(first[:2]) == 2
    again = f._leases("w1", f._run("lease", args))  # the same call, same nonce
    assert sorted(x.id for x in again) == sorted(x.id for x in first[2:])
    assert [(x.attempts, x.token) for x in again] == [(x.attempts, x.token) for x in first[2:]]
    assert f.ack(first[2:]) == 4
    assert f._leases("w1", f._run("lease", args)) == []  # all acked: nothing held
    assert f.counts().in_flight == 0
