"""The shortcuts of the cheaper polite lease+ack (bench/politeness-cost.md, fifth pass),
against a real Redis on both backends: a key's state loses its expiry when work arrives,
not at its grant; a full key's slot back reopens it without reading its tier mask when one
tier has keys, and an idle key's state expires when none has; the tier schedule's cursor
after a batch of one key is where one pick at a time would have left it."""

from __future__ import annotations

import pytest

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore
from redcrawl.frontier.base import fair_schedule

from .conftest import FrontierFactory
from .test_politeness_frontier import polite

pytestmark = pytest.mark.backends("lists", "streams")

OPEN_FULL = 2**52


def site(host: str, n: int, start: int = 0, priority: int = 0) -> list[Envelope]:
    urls = [f"http://{host}/p{priority}/{i}" for i in range(start, start + n)]
    return [Envelope(url=u, fingerprint=fingerprint(u), priority=priority) for u in urls]


def scores(f: FrontierCore, key: str) -> dict[int, float]:
    """The key's score in each tier's open zset where it is a member."""
    out = {}
    for t in range(f.keys.tiers):
        score = f.client.zscore(f.keys.open(t), key)
        if score is not None:
            out[t] = score
    return out


def test_an_idle_keys_state_loses_its_expiry_when_work_arrives(
    make_frontier: FrontierFactory,
) -> None:
    f = polite(make_frontier)
    state = f.keys.pol_state_base + "a.test"
    f.push(site("a.test", 1))
    f.ack(f.lease("w", 10))
    assert 0 < f.client.pttl(state) <= 3_600_000  # idle: expires
    f.push(site("a.test", 3, start=1))
    assert f.client.pttl(state) == -1  # ready work: kept, before any grant
    got = f.lease("w", 10)
    assert len(got) == 2 and f.client.pttl(state) == -1
    f.ack(got)  # nothing in flight, one ready: kept
    assert f.client.pttl(state) == -1
    f.ack(f.lease("w", 10))
    assert 0 < f.client.pttl(state) <= 3_600_000
    assert f.counts().conserved


def test_a_full_keys_slot_back_reopens_it_in_its_only_tier(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 5) + site("b.test", 1))
    got = [x for x in f.lease("w", 10) if "a.test" in x.envelope.url]
    assert len(got) == 2
    (tier,) = scores(f, "a.test")
    assert scores(f, "a.test")[tier] == OPEN_FULL
    f.ack(got[:1])  # no tier mask read: the one tier with keys
    assert scores(f, "a.test")[tier] < OPEN_FULL
    assert len(f.lease("w", 10)) == 1
    assert f.client.pttl(f.keys.pol_state_base + "a.test") == -1
    assert f.counts().conserved


def test_slot_backs_after_every_queue_ran_dry_let_the_states_expire(
    make_frontier: FrontierFactory,
) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 2) + site("b.test", 2))
    got = f.lease("w", 10)
    assert len(got) == 4 and not any(scores(f, k) for k in ("a.test", "b.test"))
    f.ack(got)  # full keys, no tier has keys: no mask read, idle
    for key in ("a.test", "b.test"):
        assert 0 < f.client.pttl(f.keys.pol_state_base + key) <= 3_600_000
        assert int(f.client.hget(f.keys.pol_state_base + key, "in") or 0) == 0
    assert f.counts().conserved


@pytest.mark.parametrize("cursor", [0, 3, 7, 1_000_003])
def test_the_cursor_after_a_batch_is_where_one_pick_at_a_time_leaves_it(
    make_frontier: FrontierFactory, cursor: int
) -> None:
    f = polite(make_frontier, politeness_concurrency=6)
    f.push(site("a.test", 10, priority=0))
    (tier,) = scores(f, "a.test")
    f.client.hset(f.keys.control, "cursor", cursor)
    assert len(f.lease("w", 5)) == 5
    # one pick at a time: past the next place of the tier in the schedule, 5 times (the
    # other tiers have no key)
    sched = [int(c, 16) for c in fair_schedule(f.settings.tier_weights)]
    at = cursor
    for _ in range(5):
        while sched[at % len(sched)] != tier:
            at += 1
        at += 1
    assert int(f.client.hget(f.keys.control, "cursor")) == at % (len(sched) * 1_000_000)


def test_a_lease_that_grants_nothing_leaves_the_cursor(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_concurrency=1)
    f.push(site("a.test", 2))
    assert len(f.lease("w", 10)) == 1
    at = f.client.hget(f.keys.control, "cursor")
    assert f.lease("w", 10) == []
    assert f.client.hget(f.keys.control, "cursor") == at


def test_a_grant_ends_an_expiry_another_script_set_on_a_key_with_ready_work(
    make_frontier: FrontierFactory,
) -> None:
    """A review of the fifth pass: the grant skipped its PERSIST whenever the tier mask
    said the key had ready work, trusting that no expiry is set then; the robots.txt
    charge (charge.lua, nothing in flight) and a fleet AutoThrottle update set one on such
    a key, and so did pol_push before the fifth pass (a crawl upgraded in place). Nothing
    ended it any more: mid-crawl the key's state (in flight, next, block) expired, and the
    key was granted beyond its concurrency and before its delay."""
    f = polite(make_frontier, politeness_concurrency=1)
    state = f.keys.pol_state_base + "a.test"
    f.push(site("a.test", 3))
    f.charge_fetch(["a.test"])  # a robots.txt fetch charged to the key: nothing in flight
    assert f.client.pttl(state) > 0  # (as before the fifth pass: an idle-looking key)
    got = f.lease("w", 10)
    assert len(got) == 1
    assert f.client.pttl(state) == -1, "its state would expire with a request in flight"
