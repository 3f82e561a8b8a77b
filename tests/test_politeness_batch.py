"""Several grants of one politeness key in one lease call (lists backend, real Redis): a
key with no delay is granted as many requests at once as its free slots, the lease and the
tier schedule allow; a key with a delay one per call; the per-key invariant (in flight =
requests holding a slot ≤ concurrency) holds across workers, and the weighted-fair tier
schedule is the same as without politeness."""

from __future__ import annotations

from collections import Counter

import pytest

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, Lease

from .conftest import Clock, FrontierFactory

pytestmark = pytest.mark.backends("lists", "streams")


def env(url: str, priority: int = 0) -> Envelope:
    return Envelope(url=url, fingerprint=fingerprint(url), priority=priority)


def site(host: str, n: int, priority: int = 0) -> list[Envelope]:
    return [env(f"http://{host}/p{priority}/{i}", priority) for i in range(n)]


def hosts(leases: list[Lease]) -> Counter[str]:
    return Counter(lease.envelope.url.split("/")[2] for lease in leases)


def in_flight(f: FrontierCore, key: str) -> int:
    return int(f.client.hget(f.keys.pol_state_base + key, "in") or 0)


def polite(make_frontier: FrontierFactory, **settings: object) -> FrontierCore:
    params: dict[str, object] = {
        "politeness_concurrency": 3,
        "politeness_delay": 0.0,
        "politeness_randomize": False,
    }
    f = make_frontier(**{**params, **settings})
    assert f.politeness == "host"
    return f


def test_no_delay_grants_up_to_the_free_slots_of_a_key_in_one_call(
    make_frontier: FrontierFactory,
) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 10))
    got = f.lease("w1", 10)
    assert hosts(got) == {"a.test": 3}
    # FIFO within the key, as one at a time would have given them
    assert [x.envelope.url for x in got] == [f"http://a.test/p0/{i}" for i in range(3)]
    assert in_flight(f, "a.test") == 3
    assert f.lease("w2", 10) == []
    f.ack(got[:2])
    assert hosts(f.lease("w2", 10)) == {"a.test": 2}
    assert in_flight(f, "a.test") == 3
    assert f.counts().conserved


def test_a_batch_is_bounded_by_the_lease_and_the_queue(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_concurrency=8)
    f.push(site("a.test", 10) + site("b.test", 2))
    first = f.lease("w", 5)
    assert len(first) == 5 and len(hosts(first)) == 1
    rest = f.lease("w", 100)
    # a.test: 3 more (8 in flight), b.test: its 2
    assert hosts(first + rest) == {"a.test": 8, "b.test": 2}
    assert in_flight(f, "a.test") == 8 and in_flight(f, "b.test") == 2
    assert f.lease("w", 100) == []
    assert f.counts().ready == 2


def test_a_key_with_a_delay_gets_one_grant_per_call(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=5, politeness_delay=1.0)
    f.push(site("a.test", 5))
    assert len(f.lease("w", 10)) == 1
    assert f.lease("w", 10) == []
    clock.advance(1.0)
    assert len(f.lease("w", 10)) == 1
    assert in_flight(f, "a.test") == 2


def test_an_override_delay_stops_batching_for_its_key_only(
    make_frontier: FrontierFactory,
) -> None:
    f = polite(make_frontier)
    f.client.hset(f.keys.pol_override, "a.test", '{"delay": 0.5}')
    f.push(site("a.test", 5) + site("b.test", 5))
    assert hosts(f.lease("w", 10)) == {"a.test": 1, "b.test": 3}


def test_concurrency_holds_across_workers_and_frees(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_concurrency=4)
    f.push(site("a.test", 20) + site("b.test", 20))
    held: list[Lease] = []
    for _ in range(12):
        for w in ("w1", "w2", "w3"):
            held += f.lease(w, 7)
            for key in ("a.test", "b.test"):
                mine = [x for x in held if key in x.envelope.url]
                assert len(mine) == in_flight(f, key) <= 4
        # give back some at response time, ack others
        f.free([(x, "s") for x in held[:2]])
        f.ack(held[:3])
        held = held[3:]
        for key in ("a.test", "b.test"):
            # the freed but not yet acked one no longer holds a slot
            assert in_flight(f, key) <= 4
    assert f.counts().conserved


# (lists only: a streams crawl without politeness has no tier schedule, high before low)
@pytest.mark.backends("lists")
def test_tier_schedule_is_the_same_as_without_politeness(make_frontier: FrontierFactory) -> None:
    def tiers_leased(f: FrontierCore) -> list[int]:
        f.push(site("a.test", 30, priority=5) + site("a.test", 30, priority=-5))
        return [x.envelope.priority for x in f.lease("w", 20)]

    on = tiers_leased(polite(make_frontier, crawl="on", politeness_concurrency=100))
    off = tiers_leased(make_frontier(crawl="off", politeness=False))
    assert Counter(on) == Counter(off)
    assert set(on) == {5, -5}  # the low tier is not starved by a batch of the high one


def open_tiers(f: FrontierCore, key: str) -> dict[int, float]:
    """The key's score in each tier's open zset where it is a member."""
    out = {}
    for t in range(3):
        score = f.client.zscore(f.keys.open(t), key)
        if score is not None:
            out[t] = score
    return out


@pytest.mark.parametrize("forget_mask", [False, True])
def test_a_full_key_with_work_in_two_tiers_opens_in_both_when_a_slot_comes_back(
    make_frontier: FrontierFactory, forget_mask: bool
) -> None:
    f = polite(make_frontier, politeness_concurrency=2)
    f.push(site("a.test", 5, priority=5) + site("a.test", 5, priority=-5))
    got = f.lease("w", 10)
    assert len(got) == 2
    assert set(open_tiers(f, "a.test")) == {0, 2}
    assert f.lease("w", 10) == []
    if forget_mask:
        # a state written again after it expired has no tier mask: every tier is rescored
        f.client.hdel(f.keys.pol_state_base + "a.test", "tm")
    f.ack(got)
    again = f.lease("w", 10)
    assert len(again) == 2 and in_flight(f, "a.test") == 2
    # both tiers are open again: the weighted schedule can reach the low one
    f.ack(again)
    leased = []
    for _ in range(6):
        batch = f.lease("w", 10)
        leased += batch
        f.ack(batch)
    assert {x.envelope.priority for x in again + leased} == {5, -5}
    assert f.counts().ready == 0 and f.counts().conserved


def test_state_expires_only_once_the_key_has_no_ready_work(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_concurrency=2)
    f.push(site("a.test", 3))
    state = f.keys.pol_state_base + "a.test"
    first = f.lease("w", 10)
    f.ack(first)
    assert in_flight(f, "a.test") == 0
    assert f.client.pttl(state) == -1  # one ready request left: the state is kept
    last = f.lease("w", 10)
    assert len(last) == 1 and f.client.pttl(state) == -1
    f.ack(last)
    assert 0 < f.client.pttl(state) <= 3_600_000  # idle: it expires
