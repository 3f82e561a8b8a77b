"""Every state transition of the frontier, on real Redis servers (7.x and 6.2), for both
backends (lists and streams: see ``make_frontier`` in conftest.py). Tests of what only the
lists backend has (lifo, strict priority, weighted tiers) are marked ``backends("lists")``;
the streams backend's own tests are in test_streams.py."""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import msgpack
import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.frontier import FrontierCore
from redcrawl.frontier.base import fair_schedule

from .conftest import Clock, FrontierFactory


def env(url: str, priority: int = 0, dont_filter: bool = False) -> Envelope:
    return Envelope(
        url=url,
        priority=priority,
        dont_filter=dont_filter,
        fingerprint=hashlib.sha1(url.encode()).digest(),
    )


def urls(n: int, prefix: str = "http://example.com/p") -> list[Envelope]:
    return [env(f"{prefix}{i}") for i in range(n)]


def check(f: FrontierCore) -> None:
    c = f.counts()
    assert c.conserved, c


def test_push_dedupes_within_and_across_batches(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    r = f.push([env("http://a/1"), env("http://a/2"), env("http://a/1")])
    assert (r.accepted, r.filtered, r.flags) == (2, 1, (True, True, False))
    r = f.push([env("http://a/2"), env("http://a/3")])
    assert r.flags == (False, True)
    c = f.counts()
    assert (c.accepted, c.filtered, c.ready) == (3, 2, 3)
    check(f)


def test_dont_filter_bypasses_dedupe(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push([env("http://a/1")])
    r = f.push([env("http://a/1", dont_filter=True), env("http://a/1", dont_filter=True)])
    assert r.accepted == 2
    assert f.counts().ready == 3


def test_done_fingerprint_still_filters_but_queued_and_done_are_apart(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier()
    f.push([env("http://a/1"), env("http://a/2")])
    leases = f.lease("w1", 1)
    assert f.ack(leases) == 1
    fp_done = hashlib.sha1(leases[0].envelope.url.encode()).digest()
    assert leases[0].id == fp_done == leases[0].envelope.fingerprint
    assert f.done.contains([fp_done]) == [True]
    # "queued" is the request hash itself: the other request is there, the done one not
    assert not redis_client.hexists(f.keys.req, fp_done)
    assert redis_client.hkeys(f.keys.req) == [hashlib.sha1(b"http://a/2").digest()]
    assert f.push([env(leases[0].envelope.url)]).accepted == 0  # done is still a duplicate


def test_lease_ack_cycle_and_counts(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push(urls(10))
    leases = f.lease("w1", 4)
    assert len(leases) == 4 and all(lease.attempts == 1 for lease in leases)
    c = f.counts()
    assert (c.ready, c.in_flight) == (6, 4)
    check(f)
    assert f.ack(leases) == 4
    assert f.ack(leases) == 0  # acking twice does nothing
    c = f.counts()
    assert (c.ready, c.in_flight, c.done) == (6, 0, 4)
    check(f)
    assert not c.finished
    f.ack(f.lease("w1", 100))
    assert f.counts().finished


@pytest.mark.backends("lists")  # lifo / strict priority / weighted tiers: lists only
def test_fifo_and_lifo_order(make_frontier: FrontierFactory) -> None:
    fifo = make_frontier("fifo", ordering="fifo")
    fifo.push(urls(5))
    assert [lease.envelope.url[-1] for lease in fifo.lease("w", 5)] == list("01234")
    lifo = make_frontier("lifo", ordering="lifo")
    lifo.push(urls(5))
    assert [lease.envelope.url[-1] for lease in lifo.lease("w", 5)] == list("43210")


@pytest.mark.backends("lists")  # lifo / strict priority / weighted tiers: lists only
def test_strict_priority_order_fifo_among_equals(make_frontier: FrontierFactory) -> None:
    f = make_frontier(ordering="priority")
    f.push(
        [
            env("http://x/a", 0),
            env("http://x/b", 5),
            env("http://x/c", -3),
            env("http://x/d", 5),
            env("http://x/e", 100),
            env("http://x/f", 0),
        ]
    )
    got = [lease.envelope.url[-1] for lease in f.lease("w", 6)]
    assert got == list("ebdafc")


@pytest.mark.backends("lists")  # lifo / strict priority / weighted tiers: lists only
def test_tiers_weighted_fair_choice(make_frontier: FrontierFactory) -> None:
    f = make_frontier(tier_weights=(5, 3, 2), tier_bounds=(1, 0), politeness=False)
    for tier_prio, name in ((5, "h"), (0, "m"), (-5, "l")):
        f.push([env(f"http://{name}/{i}", tier_prio) for i in range(2000)])
    seen: Counter[str] = Counter()
    for _ in range(100):
        for lease in f.lease("w", 10):
            seen[lease.envelope.url[7]] += 1
    assert seen == {"h": 500, "m": 300, "l": 200}
    # Low priority is served steadily, not only after high is exhausted.
    first = [lease.envelope.url[7] for lease in f.lease("w", 20)]
    assert first.count("l") == 4


def test_empty_tier_gives_its_share_to_others(make_frontier: FrontierFactory) -> None:
    f = make_frontier(politeness=False)
    f.push([env(f"http://l/{i}", -1) for i in range(30)])
    f.push([env(f"http://h/{i}", 3) for i in range(5)])
    got = [lease.envelope.url[7] for lease in f.lease("w", 35)]
    assert Counter(got) == {"l": 30, "h": 5}
    assert got[:5].count("h") >= 2  # high still comes early


def test_fair_schedule_shape() -> None:
    s = fair_schedule([5, 3, 2])
    assert len(s) == 10 and Counter(s) == {"0": 5, "1": 3, "2": 2}
    assert "22" not in s and "000" not in s
    assert fair_schedule([1]) == "0"


def test_lease_expires_and_is_reclaimed_once(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = make_frontier(lease_ttl=10)
    f.push(urls(3))
    first = f.lease("w1", 3)
    assert f.lease("w2", 3) == []
    clock.advance(11)
    again = f.lease("w2", 3)
    assert sorted(x.id for x in again) == sorted(x.id for x in first)
    assert all(x.attempts == 2 for x in again)
    assert f.counts().reclaimed == 3
    # the old worker's stale acks are ignored; the new owner's count
    assert f.ack(first) == 0
    assert f.counts().in_flight == 3
    assert f.ack(again) == 3
    check(f)


def test_many_reclaimers_do_not_double_requeue(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = make_frontier(lease_ttl=5, politeness=False)
    f.push(urls(50))
    f.lease("dead-worker", 50)
    clock.advance(6)
    for _ in range(10):
        f.maintain()
    c = f.counts()
    assert (c.ready, c.in_flight, c.reclaimed) == (50, 0, 50)
    check(f)
    leased = f.lease("w", 100)
    assert len({x.id for x in leased}) == 50 == len(leased)


def test_heartbeat_keeps_leases_alive(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = make_frontier(lease_ttl=10)
    f.push(urls(2))
    held = f.lease("w1", 2)
    for _ in range(5):
        clock.advance(8)
        f.renew("w1")
        assert f.lease("w2", 2) == []
    assert f.counts().in_flight == 2
    clock.advance(11)  # heartbeats stop: the worker is gone
    assert len(f.lease("w2", 2)) == 2
    assert f.ack(held) == 0


def test_nack_retries_with_delay_then_dead(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = make_frontier(max_attempts=3)
    f.push(urls(1))
    lease = f.lease("w", 1)[0]
    assert f.nack(lease, "HTTP 503", delay=30) == "retried"
    c = f.counts()
    assert (c.delayed, c.in_flight, c.retried) == (1, 0, 1)
    check(f)
    assert f.lease("w", 1) == []  # not due yet
    clock.advance(31)
    lease = f.lease("w", 1)[0]
    assert lease.attempts == 2
    assert f.nack(lease, "HTTP 503 again", delay=0) == "retried"
    lease = f.lease("w", 1)[0]
    assert lease.attempts == 3
    assert f.nack(lease, "HTTP 500 final") == "dead"  # attempts used up
    c = f.counts()
    assert (c.dead, c.delayed, c.ready) == (1, 0, 0)
    check(f)
    (dead,) = f.dead()
    assert dead.error == "HTTP 500 final" and dead.attempts == 3
    assert dead.url == "http://example.com/p0"
    assert f.nack(lease, "late") == "stale"


def test_backoff_grows_exponentially(
    make_frontier: FrontierFactory, clock: Clock, redis_client: redis.Redis
) -> None:
    f = make_frontier(max_attempts=10, retry_backoff=2.0, retry_backoff_max=5.0)
    f.push(urls(1))
    dues = []
    for _ in range(3):
        lease = f.lease("w", 1)[0]
        f.nack(lease, "boom")
        due = redis_client.zscore(f.keys.delayed, lease.id)
        assert due is not None
        dues.append((due - clock()) / 1000)
        clock.advance(10)
    assert dues == [2.0, 4.0, 5.0]


def test_no_retry_goes_dead_and_requeue_dead(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push(urls(3))
    for lease in f.lease("w", 3):
        assert f.dead_letter(lease, "poison") == "dead"
    assert f.counts().dead == 3
    dead_ids = [d.id for d in f.dead()]
    assert f.requeue_dead([dead_ids[0], "no-such-id"]) == 1
    c = f.counts()
    assert (c.dead, c.ready, c.requeued) == (2, 1, 1)
    assert f.requeue_dead() == 2
    check(f)
    leases = f.lease("w", 3)
    assert all(x.attempts == 1 for x in leases)  # fresh attempt budget
    assert f.dead() == []


def test_expired_lease_counts_toward_max_attempts(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = make_frontier(max_attempts=2, lease_ttl=1)
    f.push(urls(1))
    for _ in range(2):
        assert len(f.lease("crashy", 1)) == 1
        clock.advance(2)
    f.maintain()
    (dead,) = f.dead()
    assert "lease expired 2 times" in dead.error and "crashy" in dead.error
    check(f)


def test_malformed_envelopes_go_dead_not_loop(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier()
    envs = urls(4)
    f.push(envs)
    ids = [e.fingerprint for e in envs if isinstance(e.fingerprint, bytes)]
    assert len(ids) == len(envs)
    # corrupt one stored envelope, make another a future version, strip a header
    redis_client.hset(f.keys.req, ids[0], b"0|0||\xc1garbage")
    redis_client.hset(f.keys.req, ids[1], b"0|0||" + msgpack.packb({"v": 99, "u": "http://x/"}))
    redis_client.hset(f.keys.req, ids[2], msgpack.packb({"v": 1, "u": "http://x/"}))
    leases = f.lease("w", 4)
    assert [x.id for x in leases] == [ids[3]]
    dead = {d.id: d.error for d in f.dead()}
    assert set(dead) == {ids[0].hex(), ids[1].hex(), ids[2].hex()}
    assert "not valid msgpack" in dead[ids[0].hex()]
    assert "version 99" in dead[ids[1].hex()]
    assert "no state header" in dead[ids[2].hex()]
    assert f.lease("w", 3) == []
    check(f)


def test_pause_resume(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push(urls(2))
    f.pause()
    assert f.is_paused() and f.lease("w", 2) == []
    assert f.push(urls(3, "http://b/")).accepted == 3  # pushes still accepted
    f.resume()
    assert not f.is_paused() and len(f.lease("w", 10)) == 5


def test_purge_removes_everything(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier()
    other = make_frontier("other")
    other.push(urls(2))
    f.push(urls(5))
    f.lease("w", 2)
    f.dead_letter(f.lease("w", 1)[0], "x")
    f.pause()
    # what the robots.txt middleware and the dashboard keep for the crawl
    redis_client.hset(f.keys.robots, "https://a:443", b"x")
    redis_client.zadd(f.keys.robots_expiry, {"https://a:443": 1})
    redis_client.set(f.keys.robots_bytes, 1)
    redis_client.rpush(f.keys.history, b"1:2:3")
    f.purge()
    # only the counters that name ids and lease tokens remain
    assert redis_client.keys(f"rc:{{{f.crawl}}}:*") == [f.keys.stats.encode()]
    assert set(redis_client.hkeys(f.keys.stats)) == {b"seq", b"leases"}
    assert f.counts() == make_frontier().counts()
    assert f.push(urls(5)).accepted == 5  # fingerprints were purged too
    assert f.counts().ready == 5
    assert other.counts().ready == 2  # other crawls untouched


def test_inspection(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = make_frontier()
    f.push([env("http://a/hi", 4), env("http://a/lo", -2), env("http://a/mid")])
    pend = f.pending()
    if f.BACKEND == "lists" or f.politeness is not None:  # tiers (per-key queues)
        assert [(p.url, p.tier) for p in pend] == [
            ("http://a/hi", 0),
            ("http://a/mid", 1),
            ("http://a/lo", 2),
        ]
    else:  # a high and a low stream, arrival order in each
        assert [(p.url, p.tier) for p in pend] == [
            ("http://a/hi", 0),
            ("http://a/lo", 1),
            ("http://a/mid", 1),
        ]
    started = time.monotonic()
    lease = f.lease("worker-7", 1)[0]
    (info,) = f.inflight()
    (deadline,) = f.workers().values()
    elapsed = time.monotonic() - started
    assert info.worker == "worker-7" and info.id == lease.id.hex() and info.attempts == 1
    # streams: derived from the entry's idle time, which the server counts in real time
    # while the test clock stands still: up to the real time since the lease early, and
    # on a cluster (the server's clock, not the test's) as late as the real time now
    # (fixed tolerances failed on a loaded machine), to the server's millisecond
    now, real = clock() / 1000, time.time()
    assert now - elapsed - 0.002 <= info.since <= max(now, real) + 0.002
    assert info.deadline == pytest.approx(info.since + 10)
    assert now + 10 - elapsed - 0.002 <= deadline <= max(now, real) + 10 + 0.002


def test_release_worker_forces_reclaim(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push(urls(4))
    f.lease("w1", 3)
    f.lease("w2", 1)
    assert f.release_worker("w1") == 3
    c = f.counts()
    assert (c.ready, c.in_flight) == (3, 1)
    assert "w1" not in f.workers()
    check(f)


def test_server_clock_is_used_without_test_clock(make_frontier: FrontierFactory) -> None:
    f = make_frontier(use_clock=False, lease_ttl=0.2, heartbeat_interval=0.1)
    f.push(urls(1))
    assert len(f.lease("w1", 1)) == 1
    time.sleep(0.3)
    assert len(f.lease("w2", 1)) == 1


@pytest.mark.backends("lists")  # lifo / strict priority / weighted tiers: lists only
def test_priority_mode_requeue_keeps_order(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = make_frontier(ordering="priority", lease_ttl=1)
    f.push([env("http://x/hi", 10), env("http://x/lo", 1)])
    f.lease("w", 1)  # takes hi
    clock.advance(2)
    assert [x.envelope.url for x in f.lease("w", 2)] == ["http://x/hi", "http://x/lo"]


def test_crawls_are_isolated_and_keys_share_a_hash_tag(make_frontier: FrontierFactory) -> None:
    a, b = make_frontier("a"), make_frontier("b")
    a.push(urls(3))
    assert b.counts().accepted == 0 and b.lease("w", 5) == []
    from redis.crc import key_slot

    assert len({key_slot(k.encode()) for k in a.keys.script_keys()}) == 1


def test_stale_lease_cannot_ack_after_dead_and_requeue(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """Tokens are unique per lease: a lease from before a requeue can't ack the new one."""
    f = make_frontier(max_attempts=1, lease_ttl=1)
    f.push(urls(1))
    (old,) = f.lease("w1", 1)
    clock.advance(2)
    f.maintain()  # expired with attempts used up: DEAD
    assert f.requeue_dead() == 1
    (new,) = f.lease("w2", 1)
    assert new.attempts == 1 and new.token != old.token
    assert f.ack([old]) == 0
    assert f.nack(old, "late") == "stale"
    assert f.counts().in_flight == 1
    assert f.ack([new]) == 1


def test_release_gives_back_without_spending_an_attempt(make_frontier: FrontierFactory) -> None:
    f = make_frontier(max_attempts=1)
    f.push(urls(3))
    held = f.lease("w1", 3)
    assert f.release(held[:2]) == 2
    assert f.release(held[:2]) == 0  # already given back: stale
    c = f.counts()
    assert (c.ready, c.in_flight) == (2, 1)
    check(f)
    again = f.lease("w2", 2)
    assert {x.id for x in again} == {x.id for x in held[:2]}
    assert all(x.attempts == 1 for x in again)  # the given-back delivery did not count
    assert f.ack(again + held[2:]) == 3
    assert f.counts().finished


def test_settle_stores_children_before_acking_parent(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push(urls(1, "http://root/"))
    (parent,) = f.lease("w", 1)
    out = f.settle(
        push=urls(3, "http://child/") + urls(1, "http://root/"), ack=[parent], lease=("w", 2)
    )
    assert (out.pushed.accepted, out.pushed.filtered, out.acked) == (3, 1, 1)
    assert [x.envelope.url for x in out.leases] == ["http://child/0", "http://child/1"]
    c = f.counts()
    assert (c.accepted, c.done, c.ready, c.in_flight) == (4, 1, 1, 2)
    check(f)
    assert f.settle().acked == 0 and f.settle().leases == []


def test_settle_in_batches_acks_after_every_push(make_frontier: FrontierFactory) -> None:
    f = make_frontier(batch_size=2)
    f.push(urls(1, "http://root/"))
    (parent,) = f.lease("w", 1)
    out = f.settle(push=urls(5, "http://child/"), ack=[parent])
    assert (out.pushed.accepted, out.acked) == (5, 1)
    assert f.counts().ready == 5


def test_purge_keeps_old_leases_stale(make_frontier: FrontierFactory) -> None:
    f = make_frontier()
    f.push(urls(1))
    (old,) = f.lease("w1", 1)
    f.purge()
    f.push(urls(1))
    (new,) = f.lease("w2", 1)
    assert new.id == old.id and new.token != old.token
    assert f.ack([old]) == 0 and f.counts().in_flight == 1


@pytest.mark.backends("lists")  # streams: test_streams.py
def test_workers_with_another_layout_are_refused(make_frontier: FrontierFactory) -> None:
    from redcrawl.errors import FrontierError

    f = make_frontier(ordering="fifo")
    f.push(urls(2))
    other = make_frontier(ordering="priority")
    with pytest.raises(FrontierError, match="REDCRAWL_ORDERING") as refused:
        other.lease("w", 1)
    assert "upgrade" not in str(refused.value)  # a setting differs, not the version
    with pytest.raises(FrontierError, match="layout mismatch"):
        make_frontier(tier_weights=(1, 1), tier_bounds=(0,)).push(urls(1, "http://x/"))
    assert f.counts().ready == 2
    f.purge()
    assert other.push(urls(1)).accepted == 1  # a purged crawl takes a new layout


@pytest.mark.backends("lists")
def test_a_crawl_made_by_a_newer_redcrawl_says_upgrade(make_frontier: FrontierFactory) -> None:
    """A crawl whose layout has a mark this worker does not know (the same settings, by a
    newer redcrawl) is refused saying to upgrade the worker, not to change a setting."""
    from redcrawl.errors import FrontierError

    f = make_frontier()
    f.push(urls(1))
    stored = f.client.hget(f.keys.control, "layout")
    assert stored is not None and stored.endswith(b" +pushtime")
    newer = stored[: -len(b" +pushtime")] + b" +futuremark +pushtime"
    f.client.hset(f.keys.control, mapping={"layout": newer, "layout.copy": newer})
    with pytest.raises(FrontierError, match="layout mismatch") as refused:
        make_frontier().lease("w", 1)
    message = str(refused.value)
    assert "upgrade this worker" in message and "+futuremark" in message, message
    assert "REDCRAWL_ORDERING" not in message, message


def test_push_with_delay_waits_in_delayed(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = make_frontier()
    r = f.push([env("http://a/1"), env("http://a/2"), env("http://a/1")], delay=5)
    assert r.flags == (True, True, False)
    c = f.counts()
    assert (c.ready, c.delayed) == (0, 2)
    assert f.lease("w1", 10) == []
    clock.advance(5.001)
    got = f.lease("w1", 10)
    assert sorted(x.envelope.url for x in got) == ["http://a/1", "http://a/2"]
    check(f)


def test_describe_follows_a_request_through_its_states(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = make_frontier(max_attempts=2)
    f.push([env("http://a/1")])
    rid = hashlib.sha1(b"http://a/1").hexdigest()
    info = f.describe(rid)
    assert info is not None and (info.state, info.attempts, info.worker) == ("ready", 0, None)
    assert info.envelope is not None and info.envelope.url == "http://a/1"
    [lease] = f.lease("w1", 1)
    info = f.describe(rid)
    assert info is not None and (info.state, info.worker) == ("in_flight", "w1")
    assert f.nack(lease, "boom", delay=3) == "retried"
    info = f.describe(rid)
    assert info is not None and (info.state, info.error) == ("delayed", "boom")
    assert info.due == pytest.approx(clock.ms / 1000 + 3)
    clock.advance(3)
    [lease] = f.lease("w1", 1)
    assert f.nack(lease, "boom again") == "dead"
    info = f.describe(rid)
    assert info is not None and (info.state, info.attempts, info.error) == ("dead", 2, "boom again")
    f.requeue_dead([rid])
    [lease] = f.lease("w1", 1)
    f.ack([lease])
    assert f.describe(rid) is None
    assert f.describe("#999") is None
